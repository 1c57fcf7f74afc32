#!/usr/bin/env python3
"""Generate TPC-DS data and DuckDB reference answers for Scad's TPC-DS runs.

Uses the real TPC-DS generator (dsdgen) as shipped in the PyPI package
``duckdb-extension-tpcds``: the extension file inside that package is loaded by path, so
nothing is downloaded at run time.

Layout under ``<out>/sf<SF>/``:

* ``parquet/<table>.parquet``  every table as Parquet (loaded into memory elements);
* ``text/<table>.dat``         every table as ``|``-delimited text without a header, in
                               dsdgen's own ``.dat`` style (each line ends with ``|``,
                               NULL is an empty field), for original-style Python programs;
* ``reference/<name>.parquet`` and ``.csv``  DuckDB's answer to each reference query;
* ``manifest.json``            scale factor, generator versions, row counts, references.

A second run with the same scale factor and generator versions reuses the data (the
manifest is the cache key); references missing from the manifest are added without
regenerating the tables.  ``--bench`` also times DuckDB on each query (all 99, or
``--queries``): in memory, with the load time (Parquet into in-memory tables) reported
apart from the query time, or with ``--memory-limit`` reading the Parquet files under that
limit (DuckDB's own spilling); a query it cannot finish is reported with its error.

Run inside the repository's virtual environment (``bash scripts/setup.sh`` creates it)::

    .venv/bin/python benches/tpcds/gen_data.py --sf 0.01
    .venv/bin/python benches/tpcds/gen_data.py --sf 1 --bench --repeats 5 --bench-json out.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path

try:
    import duckdb
    from tqdm import tqdm
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"gen_data.py: missing Python package ({exc.name}); create the venv with "
        "`bash scripts/setup.sh` or `python3 -m venv .venv && .venv/bin/pip install -r "
        "benches/tpcds/requirements.txt`, then run this script with .venv/bin/python"
    )

MANIFEST_FORMAT = 1

#: Set by --quiet: no progress bars.
QUIET = False

#: The official queries whose reference answers are written: all 99 of TPC-DS.
OFFICIAL_QUERIES = tuple(range(1, 100))

def sf_dir_name(sf: float, spread_warehouses: int) -> str:
    """Directory name for a data set: sf1, sf0.1, sf0.01, sf0.01-wh5 (see --spread-warehouses)."""
    name = "sf" + format(sf, "g")
    return name + (f"-wh{spread_warehouses}" if spread_warehouses else "")


def extension_path() -> str:
    """Path of the tpcds extension file inside the installed duckdb-extension-tpcds."""
    try:
        import duckdb_extension_tpcds  # noqa: F401  (only its location is used)
    except ImportError:
        sys.exit(
            "gen_data.py: the PyPI package duckdb-extension-tpcds is not installed; "
            "run `bash scripts/setup.sh` (or `.venv/bin/pip install -r benches/tpcds/requirements.txt`)"
        )
    base = os.path.dirname(duckdb_extension_tpcds.__file__)
    version = "v" + duckdb.__version__
    exact = os.path.join(base, "extensions", version, "tpcds.duckdb_extension")
    if os.path.exists(exact):
        return exact
    found = sorted(glob.glob(os.path.join(base, "extensions", "*", "tpcds.duckdb_extension")))
    if not found:
        sys.exit(f"gen_data.py: no tpcds.duckdb_extension under {base}/extensions")
    sys.exit(
        f"gen_data.py: duckdb {duckdb.__version__} needs the tpcds extension built for "
        f"{version}, but the installed package ships {found}; install matching versions "
        "(benches/tpcds/requirements.txt pins them)"
    )


def connect_with_tpcds() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the tpcds extension loaded from its file (no network)."""
    con = duckdb.connect(":memory:")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute(f"LOAD '{extension_path()}'")
    return con


def generator_version() -> dict[str, str]:
    from importlib import metadata

    return {
        "duckdb": duckdb.__version__,
        "duckdb-extension-tpcds": metadata.version("duckdb-extension-tpcds"),
    }


def query_texts(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The official query texts (from tpcds_queries()) by name, ``q1`` to ``q99``."""
    texts: dict[str, str] = {}
    for nr in OFFICIAL_QUERIES:
        row = con.execute("SELECT query FROM tpcds_queries() WHERE query_nr = ?", [nr]).fetchone()
        if row is None:
            sys.exit(f"gen_data.py: tpcds_queries() has no query {nr}")
        texts[f"q{nr}"] = row[0]
    return texts


def read_manifest(path: Path) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_manifest(path: Path, manifest: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def tables_cached(
    manifest: dict | None, sf: float, spread: int, versions: dict, root: Path, text: bool
) -> bool:
    if manifest is None or manifest.get("format") != MANIFEST_FORMAT:
        return False
    if manifest.get("sf") != sf or manifest.get("generator") != versions:
        return False
    if manifest.get("spread_warehouses", 0) != spread:
        return False
    tables = manifest.get("tables") or {}
    if not tables:
        return False
    for table in tables:
        if not (root / "parquet" / f"{table}.parquet").exists():
            return False
        if text and not (root / "text" / f"{table}.dat").exists():
            return False
    return not text or manifest.get("text", False)


def generate_tables(root: Path, sf: float, text: bool, spread_warehouses: int) -> dict[str, int]:
    """Run dsdgen and write every table as Parquet (and text); returns row counts."""
    con = connect_with_tpcds()
    with tqdm(total=1, desc=f"dsdgen sf={sf:g}", unit="run", disable=QUIET) as bar:
        con.execute(f"CALL dsdgen(sf={sf!r})")
        bar.update(1)
    if spread_warehouses:
        # Test-only change of the data (never for benchmarks): below SF 1 dsdgen makes a
        # single warehouse, so no order ships from two warehouses and q16/q94/q95 match
        # nothing.  Spreading the non-NULL warehouse keys over N warehouses by item makes
        # their EXISTS / NOT EXISTS / ws_wh logic decide real rows; NULLs stay NULL.
        n = int(spread_warehouses)
        con.execute(
            f"UPDATE catalog_sales SET cs_warehouse_sk = 1 + (cs_item_sk % {n}) "
            "WHERE cs_warehouse_sk IS NOT NULL"
        )
        con.execute(
            f"UPDATE web_sales SET ws_warehouse_sk = 1 + (ws_item_sk % {n}) "
            "WHERE ws_warehouse_sk IS NOT NULL"
        )
    tables = [r[0] for r in con.execute("SHOW TABLES").fetchall()]
    (root / "parquet").mkdir(parents=True, exist_ok=True)
    if text:
        (root / "text").mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for table in tqdm(tables, desc="writing tables", unit="table", disable=QUIET):
        counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        pq = root / "parquet" / f"{table}.parquet"
        con.execute(f"COPY {table} TO '{pq}.tmp' (FORMAT parquet)")
        os.replace(f"{pq}.tmp", pq)
        if text:
            dat = root / "text" / f"{table}.dat"
            # The extra empty column gives dsdgen's trailing '|' on every line.
            con.execute(
                f"COPY (SELECT *, NULL AS dsdgen_trailing_delimiter FROM {table}) "
                f"TO '{dat}.tmp' (FORMAT csv, DELIMITER '|', HEADER false, QUOTE '', ESCAPE '')"
            )
            os.replace(f"{dat}.tmp", dat)
    con.close()
    return counts


def load_parquet(
    root: Path, tables: list[str], views: bool = False
) -> tuple[duckdb.DuckDBPyConnection, float]:
    """A DuckDB holding the given tables loaded from Parquet into memory (or, with
    ``views``, reading the Parquet files where they are); returns the load seconds."""
    con = connect_with_tpcds()
    start = time.perf_counter()
    kind = "VIEW" if views else "TABLE"
    for table in tables:
        pq = root / "parquet" / f"{table}.parquet"
        con.execute(f"CREATE {kind} {table} AS SELECT * FROM read_parquet('{pq}')")
    return con, time.perf_counter() - start


def write_references(root: Path, texts: dict[str, str], names: list[str], tables: list[str]) -> dict:
    """Run each query on the Parquet data in DuckDB; write its answer as Parquet and CSV."""
    con, _ = load_parquet(root, tables)
    ref_dir = root / "reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in tqdm(names, desc="reference answers", unit="query", disable=QUIET):
        sql = texts[name].strip().rstrip(";")
        rel = con.sql(sql)
        types = [str(t) for t in rel.types]
        columns = list(rel.columns)
        for ext, fmt in (("parquet", "(FORMAT parquet)"), ("csv", "(FORMAT csv, HEADER true)")):
            path = ref_dir / f"{name}.{ext}"
            con.execute(f"COPY ({sql}) TO '{path}.tmp' {fmt}")
            os.replace(f"{path}.tmp", path)
        rows = con.execute(f"SELECT count(*) FROM ({sql})").fetchone()[0]
        (ref_dir / f"{name}.sql").write_text(texts[name])
        out[name] = {"rows": rows, "columns": columns, "types": types}
    con.close()
    return out


def bench(
    root: Path,
    texts: dict[str, str],
    tables: list[str],
    queries: list[int],
    repeats: int,
    memory_limit: str | None = None,
) -> list[dict]:
    """Time DuckDB on each query, load apart: the tables in memory, or with
    ``memory_limit`` read from Parquet under that limit (DuckDB spilling to a temporary
    directory). A query DuckDB cannot finish is reported with its error."""
    con, load_s = load_parquet(root, tables, views=memory_limit is not None)
    engine = "duckdb_in_memory"
    if memory_limit is not None:
        engine = "duckdb_memory_limit"
        spill = root / "duckdb_spill"
        spill.mkdir(exist_ok=True)
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute(f"SET temp_directory = '{spill}'")
    results = []
    for nr in tqdm(queries, desc=engine.replace("_", " "), unit="query", disable=QUIET):
        sql = texts[f"q{nr}"].strip().rstrip(";")
        result = {"engine": engine, "query": f"q{nr}", "load_s": load_s, "threads": con_threads()}
        if memory_limit is not None:
            result["memory_limit"] = memory_limit
        try:
            con.execute(sql).fetchall()  # warm-up, not timed
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                rows = con.execute(sql).fetchall()
                times.append(time.perf_counter() - start)
        except duckdb.Error as exc:
            result["error"] = str(exc).splitlines()[0]
            results.append(result)
            continue
        result.update(
            query_s_median=statistics.median(times),
            query_s_min=min(times),
            query_s_max=max(times),
            query_s_all=times,
            rows=len(rows),
        )
        results.append(result)
    con.close()
    return results


def con_threads() -> int:
    con = duckdb.connect(":memory:")
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.close()
    return int(threads)


def query_list(text: str) -> list[int]:
    """``1,16,q94`` -> [1, 16, 94]; every number an official query."""
    out = []
    for part in text.split(","):
        part = part.strip().removeprefix("q")
        if not part.isdigit() or int(part) not in OFFICIAL_QUERIES:
            raise argparse.ArgumentTypeError(f"{part!r} is not a TPC-DS query number (1-99)")
        out.append(int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=0.01, help="scale factor (default 0.01)")
    parser.add_argument("--out", type=Path, default=Path("data/tpcds"), help="root directory")
    parser.add_argument(
        "--spread-warehouses",
        type=int,
        default=0,
        metavar="N",
        help="TEST DATA ONLY: spread cs/ws_warehouse_sk over N warehouses (written to sf<SF>-whN)",
    )
    parser.add_argument("--no-text", action="store_true", help="skip the |-delimited text files")
    parser.add_argument("--force", action="store_true", help="regenerate even if cached")
    parser.add_argument("--bench", action="store_true", help="time DuckDB in memory per query")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per query (--bench)")
    parser.add_argument("--bench-json", type=Path, help="write --bench results here (JSON)")
    parser.add_argument(
        "--queries",
        type=query_list,
        default=list(OFFICIAL_QUERIES),
        help="queries --bench times, e.g. 1,16,94 (default: all 99)",
    )
    parser.add_argument(
        "--memory-limit",
        help="--bench with DuckDB's memory_limit (e.g. 25MB), reading the Parquet files",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if not args.sf > 0:
        parser.error("--sf must be positive")
    if args.spread_warehouses < 0:
        parser.error("--spread-warehouses must be 0 (off) or positive")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    global QUIET
    QUIET = args.quiet

    root = args.out / sf_dir_name(args.sf, args.spread_warehouses)
    root.mkdir(parents=True, exist_ok=True)
    manifest_path = root / "manifest.json"
    versions = generator_version()
    manifest = None if args.force else read_manifest(manifest_path)
    text = not args.no_text

    if tables_cached(manifest, args.sf, args.spread_warehouses, versions, root, text):
        print(f"gen_data: reusing cached sf={args.sf:g} data in {root}", file=sys.stderr)
    else:
        start = time.perf_counter()
        counts = generate_tables(root, args.sf, text, args.spread_warehouses)
        manifest = {
            "format": MANIFEST_FORMAT,
            "sf": args.sf,
            "spread_warehouses": args.spread_warehouses,
            "generator": versions,
            "tables": counts,
            "text": text,
            "text_format": "dsdgen .dat: '|' after every field incl. the last, no header, NULL empty",
            "generate_s": time.perf_counter() - start,
            "references": {},
        }
        write_manifest(manifest_path, manifest)
    assert manifest is not None

    con = connect_with_tpcds()
    texts = query_texts(con)
    con.close()
    refs = manifest.get("references") or {}
    missing = [
        name
        for name in texts
        if name not in refs
        or not (root / "reference" / f"{name}.parquet").exists()
        or (root / "reference" / f"{name}.sql").read_text() != texts[name]
    ]
    if missing:
        refs.update(write_references(root, texts, missing, sorted(manifest["tables"])))
        manifest["references"] = refs
        write_manifest(manifest_path, manifest)

    if args.bench:
        results = bench(
            root,
            texts,
            sorted(manifest["tables"]),
            args.queries,
            args.repeats,
            args.memory_limit,
        )
        for r in results:
            r["sf"] = args.sf
            r["generator"] = versions
        if args.bench_json:
            args.bench_json.parent.mkdir(parents=True, exist_ok=True)
            with open(args.bench_json, "w") as f:
                json.dump(results, f, indent=2)
        for r in results:
            if "error" in r:
                print(f"{r['query']}: failed: {r['error']}")
                continue
            print(
                f"{r['query']}: load {r['load_s']:.3f} s, query median {r['query_s_median'] * 1e3:.1f} ms "
                f"(min {r['query_s_min'] * 1e3:.1f}, max {r['query_s_max'] * 1e3:.1f}), {r['rows']} rows"
            )
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
