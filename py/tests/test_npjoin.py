"""COMPAT.md: npjoin.join against NumPy/pandas references."""
import numpy as np
import pandas as pd
import pytest

from npjoin import join


def reference_pairs(left, right):
    groups = {}
    for i, k in enumerate(left.tolist()):
        groups.setdefault(k, []).append(i)
    rights = {}
    for j, k in enumerate(right.tolist()):
        rights.setdefault(k, []).append(j)
    li, ri = [], []
    for k, ls in groups.items():
        for i in ls:
            for j in rights.get(k, []):
                li.append(i)
                ri.append(j)
    return np.array(li, dtype=np.intp), np.array(ri, dtype=np.intp)


def keys(rng, n, dtype, distinct):
    return rng.integers(0, distinct, n).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_join_matches_reference_and_pandas(dtype):
    rng = np.random.default_rng(42)
    left = keys(rng, 3000, dtype, 700)    # duplicates
    right = keys(rng, 2500, dtype, 1000)  # and misses (keys 700..999)
    table, sorter, count, ngroups = join.prepare_join(left)
    assert ngroups == len(np.unique(left)) and count.sum() == len(left)
    li, ri = join.join_on_table(table, sorter, count, ngroups, right)
    el, er = reference_pairs(left, right)
    assert li.dtype == np.intp and np.array_equal(li, el) and np.array_equal(ri, er)
    assert np.array_equal(left[li], right[ri])
    merged = pd.merge(pd.DataFrame({"k": left, "i": np.arange(len(left))}),
                      pd.DataFrame({"k": right, "j": np.arange(len(right))}), on="k")
    assert sorted(zip(li.tolist(), ri.tolist())) == sorted(zip(merged["i"].tolist(), merged["j"].tolist()))


def test_float32_functions_require_float32():
    left = np.array([1, 2, 2, 3], dtype=np.float32)
    right = np.array([2, 5, 3, 2], dtype=np.float32)
    t, s, c, n = join.prepare_join_float32(left)
    li, ri = join.join_on_table_float32(t, s, c, n, right)
    assert li.tolist() == [1, 1, 2, 2, 3] and ri.tolist() == [0, 3, 0, 3, 2]
    with pytest.raises(TypeError, match="float32"):
        join.prepare_join_float32(left.astype(np.float64))
    with pytest.raises(TypeError, match="float32"):
        join.join_on_table_float32(t, s, c, n, right.astype(np.int32))
    with pytest.raises(TypeError):
        join.prepare_join(np.array(["a", "b"]))
    with pytest.raises(ValueError):
        join.prepare_join(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError):
        join.join_on_table(t, s, c, n + 1, right)


def test_nan_and_signed_zero_keys_match_like_pandas():
    left = np.array([np.nan, 0.0, 1.0], dtype=np.float32)
    right = np.array([-0.0, np.nan, 2.0], dtype=np.float32)
    li, ri = join.inner_join(left, right)
    assert sorted(zip(li.tolist(), ri.tolist())) == [(0, 1), (1, 0)]


def test_partition_keeps_equal_keys_together():
    rng = np.random.default_rng(3)
    v = keys(rng, 10000, np.float32, 500)
    sorter, bounds = join.partition_on_float32(v, 8)
    assert bounds[0] == 0 and bounds[-1] == len(v) and len(bounds) == 9
    assert np.array_equal(np.sort(sorter), np.arange(len(v)))
    bin_of = {}
    for b in range(8):
        rows = sorter[bounds[b]:bounds[b + 1]]
        assert np.all(np.diff(rows) > 0)  # stable within a bin
        for k in np.unique(v[rows]).tolist():
            assert bin_of.setdefault(k, b) == b
    # Same bins in another call on other data (same keys).
    again = np.array(list(bin_of)[:50], dtype=np.float32)
    s2, b2 = join.partition_on_float32(again, 8)
    for b in range(8):
        for k in again[s2[b2[b]:b2[b + 1]]].tolist():
            assert bin_of[k] == b
    v2 = keys(rng, 10000, np.float32, 7)
    sp, bp = join.partition_on_float32_pair(v, v2, 5)
    pair_bin = {}
    for b in range(5):
        for i in sp[bp[b]:bp[b + 1]].tolist():
            assert pair_bin.setdefault((v[i], v2[i]), b) == b
    with pytest.raises(ValueError):
        join.partition_on_float32(v, 0)
    with pytest.raises(ValueError):
        join.partition_on_float32_pair(v, v2[:10], 4)


def test_groupsort_indexer_and_deindex():
    idx = np.array([2, -1, 0, 2, 1, -1, 0], dtype=np.int64)
    indexer, counts = join.groupsort_indexer(idx, 3)
    assert counts.tolist() == [2, 2, 1, 2]
    assert indexer.tolist() == [1, 5, 2, 6, 4, 0, 3]
    with pytest.raises(ValueError):
        join.groupsort_indexer(np.array([3]), 3)
    vals = np.array([10, 20, 30])
    assert join.deindex(vals, np.array([2, 0, 2])).tolist() == [30, 10, 30]


def test_structured_merge_into_buffer():
    ldt = np.dtype([("k", np.float32), ("a", np.int64)])
    rdt = np.dtype([("k2", np.float32), ("b", np.float64), ("c", "S2")])
    left = np.array([(1, 10), (2, 20), (2, 21)], dtype=ldt)
    right = np.array([(2, 0.5, b"x"), (3, 1.5, b"y"), (1, 2.5, b"z")], dtype=rdt)
    t, s, c, n = join.prepare_join_float32(left["k"])
    li, ri = join.join_on_table_float32(t, s, c, n, np.ascontiguousarray(right["k2"]))
    dt = join.merge_dtypes(left, right, ["k", "a"], ["b", "c"])
    assert dt.names == ("k", "a", "b", "c")
    buf = bytearray(len(li) * dt.itemsize + 7)
    out = join.structured_array_merge(buf, left, right, li, ri, ["k", "a"], ["b", "c"])
    assert out.tolist() == [(1.0, 10, 2.5, b"z"), (2.0, 20, 0.5, b"x"), (2.0, 21, 0.5, b"x")]
    assert np.shares_memory(out, np.frombuffer(buf, np.uint8))
    with pytest.raises(ValueError):
        join.structured_array_merge(bytearray(4), left, right, li, ri, ["k"], ["b"])
    with pytest.raises(KeyError):
        join.merge_dtypes(left, right, ["zz"], [])
    with pytest.raises(ValueError):
        join.merge_dtypes(left, left, ["k"], ["k"])
