"""Join kernels over NumPy arrays.

Keys are ``float32`` in the original (the ``*_float32`` functions require it);
``float64``, ``int32`` and ``int64`` keys work with the generic functions
(``prepare_join``, ``join_on_table``, ``partition_on``, ``partition_on_pair``). Kernels
run in Rust without the GIL. NaN keys match each other and ``-0.0`` matches ``0.0``,
as in pandas ``merge``.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from scad import _native

__all__ = [
    "prepare_join", "prepare_join_float32", "join_on_table", "join_on_table_float32",
    "merge_dtypes", "structured_array_merge", "partition_on", "partition_on_float32",
    "partition_on_pair", "partition_on_float32_pair", "deindex", "groupsort_indexer",
    "inner_join",
]

_KEY_TYPES = (np.float32, np.float64, np.int32, np.int64)


def _keys(a: Any, want: Any = None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"join keys must be a NumPy array, not {type(a).__name__}")
    if a.ndim != 1:
        raise ValueError(f"join keys must be one-dimensional, got shape {a.shape}")
    if want is not None and a.dtype != want:
        raise TypeError(f"join keys must be {np.dtype(want)}, not {a.dtype}")
    if a.dtype.type not in _KEY_TYPES:
        raise TypeError(f"join keys must be float32, float64, int32 or int64, not {a.dtype}")
    # Native byte order and contiguous, so the kernel reads the array in place.
    return np.ascontiguousarray(a.astype(a.dtype.newbyteorder("="), copy=False))


def prepare_join(left: np.ndarray):
    """Groups the left keys: ``(table, left_sorter, left_count, ngroups)``; groups are
    numbered in order of first appearance."""
    return _native.prepare_join(_keys(left))


def prepare_join_float32(left: np.ndarray):
    """``prepare_join`` for ``float32`` keys (the original's only key type)."""
    return _native.prepare_join(_keys(left, np.float32), "float32")


def join_on_table(table, left_sorter, left_count, ngroups, right: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """All inner-join pairs ``(left_indexer, right_indexer)`` (intp arrays): grouped by
    key in order of first appearance in ``left``; within a key, left rows in order,
    and for each left row the matching right rows in order."""
    return _native.join_on_table(table, np.ascontiguousarray(left_sorter, dtype=np.intp),
                                 np.ascontiguousarray(left_count, dtype=np.intp), int(ngroups), _keys(right))


def join_on_table_float32(table, left_sorter, left_count, ngroups, right: np.ndarray):
    """``join_on_table`` for ``float32`` keys."""
    return _native.join_on_table(table, np.ascontiguousarray(left_sorter, dtype=np.intp),
                                 np.ascontiguousarray(left_count, dtype=np.intp), int(ngroups),
                                 _keys(right, np.float32), "float32")


def inner_join(left: np.ndarray, right: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Prepare and join in one call."""
    table, sorter, count, ngroups = prepare_join(left)
    return join_on_table(table, sorter, count, ngroups, right)


def _fields(arr: np.ndarray, fields: Sequence[str], side: str) -> List[str]:
    names = arr.dtype.names
    if names is None:
        raise TypeError(f"{side} must be a structured array")
    missing = [f for f in fields if f not in names]
    if missing:
        raise KeyError(f"{side} has no fields {missing} (it has {list(names)})")
    return list(fields)


def merge_dtypes(left: np.ndarray, right: np.ndarray, left_fields: Sequence[str],
                 right_fields: Sequence[str]) -> np.dtype:
    """The dtype of merged rows: ``left_fields`` then ``right_fields``."""
    lf = _fields(left, left_fields, "left")
    rf = _fields(right, right_fields, "right")
    clash = set(lf) & set(rf)
    if clash:
        raise ValueError(f"fields {sorted(clash)} are on both sides; rename or drop one")
    return np.dtype([(f, left.dtype.fields[f][0]) for f in lf] + [(f, right.dtype.fields[f][0]) for f in rf])


def structured_array_merge(buf: Any, left: np.ndarray, right: np.ndarray, left_indexer: np.ndarray,
                           right_indexer: np.ndarray, left_fields: Sequence[str],
                           right_fields: Sequence[str]) -> np.ndarray:
    """Merged rows laid out in the writable ``uint8`` buffer ``buf`` (no other copy)."""
    dt = merge_dtypes(left, right, left_fields, right_fields)
    n = len(left_indexer)
    if len(right_indexer) != n:
        raise ValueError(f"indexers differ in length: {n} and {len(right_indexer)}")
    raw = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
    if raw.nbytes < n * dt.itemsize:
        raise ValueError(f"buffer of {raw.nbytes} bytes is too small for {n} rows of {dt.itemsize} bytes")
    if not raw.flags.writeable:
        raise ValueError("buffer is read-only")
    out = raw[: n * dt.itemsize].view(dt)
    for f in left_fields:
        np.take(left[f], left_indexer, out=out[f])
    for f in right_fields:
        np.take(right[f], right_indexer, out=out[f])
    return out


def partition_on(values: np.ndarray, num_bins: int):
    """Hash-partitions rows by key: ``(sorter, bounds)``; equal keys share a bin in
    every call and process."""
    return _native.partition_on(_keys(values), int(num_bins))


def partition_on_float32(values: np.ndarray, num_bins: int):
    """``partition_on`` for ``float32`` keys."""
    return _native.partition_on(_keys(values, np.float32), int(num_bins), "float32")


def partition_on_pair(v1: np.ndarray, v2: np.ndarray, num_bins: int):
    """Hash-partitions rows by a pair of keys: ``(sorter, bounds)``."""
    a, b = _keys(v1), _keys(v2)
    if a.dtype != b.dtype:
        raise TypeError(f"key columns differ in dtype: {a.dtype} and {b.dtype}")
    return _native.partition_on_pair(a, b, int(num_bins))


def partition_on_float32_pair(v1: np.ndarray, v2: np.ndarray, num_bins: int):
    """``partition_on_pair`` for ``float32`` keys."""
    return _native.partition_on_pair(_keys(v1, np.float32), _keys(v2, np.float32), int(num_bins), "float32")


def deindex(values: np.ndarray, indexer: np.ndarray) -> np.ndarray:
    """``values[indexer]``."""
    return np.take(values, indexer, axis=0)


def groupsort_indexer(index: np.ndarray, ngroups: int):
    """Counting sort of labels in ``[-1, ngroups)``: ``(indexer, counts)`` with
    ``counts[0]`` counting label -1."""
    return _native.groupsort_indexer(np.ascontiguousarray(index, dtype=np.int64), int(ngroups))
