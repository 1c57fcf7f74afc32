"""Checking a TPC-DS answer against DuckDB's reference, value by value: the Python twin
of ``benches/tpcds/src/compare.rs`` (same rules), for answers that arrive as PyArrow
tables (the distributed engine's, ``py/tests/test_distributed.py`` and
``benches/python/distributed_bench.py``).

The same number of columns and rows, the same values row by row (in order when the
query is ordered, as multisets otherwise). Names and types may differ between engines
(DuckDB sums decimals as ``DECIMAL(38, s)``, DataFusion as ``DECIMAL(p+10, s)``; DuckDB
averages as ``DOUBLE``, DataFusion decimals as decimals), so values compare as numbers:
integers and decimals exactly, a float against a float within a relative 1e-9, or
against a decimal of scale s within one unit of its last digit.
"""

from __future__ import annotations

import datetime
import decimal
import os
from typing import Any, List, Optional, Tuple


def _value(v: Any) -> Tuple[str, Any]:
    """(kind, value): null, bool, exact (int or Decimal), float, date, text."""
    if v is None:
        return ("null", None)
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, decimal.Decimal)):
        return ("exact", v)
    if isinstance(v, float):
        return ("float", v)
    if isinstance(v, datetime.date):
        return ("date", v)
    return ("text", str(v))


def _unit(x: Any) -> float:
    """One unit of a decimal's last digit (0 for an integer)."""
    if isinstance(x, decimal.Decimal):
        exp = x.as_tuple().exponent
        return 10.0 ** exp if isinstance(exp, int) and exp < 0 else 0.0
    return 0.0


def _matches(a: Tuple[str, Any], b: Tuple[str, Any]) -> bool:
    (ka, va), (kb, vb) = a, b
    if ka == "exact" and kb == "exact":
        return va == vb
    if {ka, kb} <= {"exact", "float"}:
        x, y = float(va), float(vb)
        if x == y:
            return True
        rel = 1e-9 * max(abs(x), abs(y))
        unit = _unit(va) if ka == "exact" else _unit(vb) if kb == "exact" else 0.0
        return abs(x - y) <= max(rel, unit) + 1e-12
    return ka == kb and va == vb


def _sort_key(v: Tuple[str, Any]) -> str:
    kind, x = v
    if kind == "null":
        return "\0"
    if kind == "bool":
        return f"b{x}"
    if kind == "text":
        return f"t{x}"
    if kind == "date":
        return f"d{x.isoformat()}"
    return f"n{float(x):+.6e}"


def _rows(table: Any) -> List[List[Tuple[str, Any]]]:
    columns = [table.column(k).to_pylist() for k in range(table.num_columns)]
    return [[_value(c[i]) for c in columns] for i in range(table.num_rows)]


def compare(result: Any, reference: Any, ordered: bool) -> Optional[str]:
    """None when ``result`` (a PyArrow table) equals ``reference`` by value, else the
    first difference."""
    if result.num_columns != reference.num_columns:
        return (f"{result.num_columns} columns {result.column_names}, reference has {reference.num_columns} "
                f"{reference.column_names}")
    if result.num_rows != reference.num_rows:
        return f"{result.num_rows} rows, reference has {reference.num_rows}"
    got, want = _rows(result), _rows(reference)
    if not ordered:
        key = lambda r: [_sort_key(v) for v in r]  # noqa: E731
        got.sort(key=key)
        want.sort(key=key)
    for i, (g, w) in enumerate(zip(got, want)):
        for k, (a, b) in enumerate(zip(g, w)):
            if not _matches(a, b):
                return (f"row {i}{'' if ordered else ' (rows sorted)'}, column {k} "
                        f"({reference.column_names[k]!r}): {a[1]!r}, reference has {b[1]!r}")
    return None


def query_text(data_dir: str, n: int) -> str:
    with open(os.path.join(data_dir, "reference", f"q{n}.sql"), encoding="utf-8") as f:
        return f.read().strip().rstrip(";")


def reference(data_dir: str, n: int) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(os.path.join(data_dir, "reference", f"q{n}.parquet"))


def tables(data_dir: str) -> dict:
    """Table name -> Parquet path of a data set written by ``benches/tpcds/gen_data.py``."""
    d = os.path.join(data_dir, "parquet")
    return {f[: -len(".parquet")]: os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".parquet")}
