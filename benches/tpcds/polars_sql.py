#!/usr/bin/env python3
"""Time Polars SQL in memory on TPC-DS queries: the baseline "Polars SQL (Python)" of the
TPC-DS benchmark (benches/tpcds, ``tpcds-bench``).

Every table of a data set written by ``gen_data.py`` is read from Parquet into memory
(load time reported apart), then each query's official text (``reference/qN.sql``) runs
through ``pl.SQLContext`` once untimed and ``--repeats`` times timed; a query Polars
cannot run is reported with its error. Writes a JSON list to ``--json``::

    .venv/bin/python benches/tpcds/polars_sql.py --data data/tpcds/sf1 --queries 1,2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import polars as pl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a data set directory (with manifest.json)")
    parser.add_argument("--queries", required=True, help="query numbers, e.g. 1,16,94")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per query")
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    manifest = json.loads((args.data / "manifest.json").read_text())
    start = time.perf_counter()
    ctx = pl.SQLContext()
    for table in manifest["tables"]:
        ctx.register(table, pl.read_parquet(args.data / "parquet" / f"{table}.parquet"))
    load_s = time.perf_counter() - start
    results = []
    for part in args.queries.split(","):
        name = f"q{int(part.strip().removeprefix('q'))}"
        sql = (args.data / "reference" / f"{name}.sql").read_text().strip().rstrip(";")
        result = {"engine": "polars_sql", "query": name, "load_s": load_s, "polars": pl.__version__}
        try:
            ctx.execute(sql, eager=True)  # warm-up, not timed
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                df = ctx.execute(sql, eager=True)
                times.append(time.perf_counter() - t)
            result.update(query_s_median=statistics.median(times), rows=df.height)
        except Exception as exc:  # noqa: BLE001 - any failure of Polars is a result here
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        results.append(result)
    args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
