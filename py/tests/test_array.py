"""The modern scad API: Store and RemoteArray."""
import pickle

import numpy as np
import pytest

import scad


@pytest.fixture
def store(servers):
    return scad.Store({f"mem{i}": s.url for i, s in enumerate(servers)}, pool_bytes=1 << 20, page_size=16 << 10)


def test_numpy_roundtrip_striped(store):
    a = np.arange(400000, dtype=np.float32).reshape(40000, 10)
    ra = scad.RemoteArray.from_numpy(store, a, stripe_bytes=64 << 10)
    assert ra.shape == a.shape and ra.dtype == np.float32 and len(ra) == 40000
    assert np.array_equal(ra.to_numpy(), a)
    assert np.array_equal(np.asarray(ra[100:200]), a[100:200])
    assert np.array_equal(ra[-1], a[-1])
    out = np.empty((10, 10), np.float32)
    assert ra.to_numpy(5, 15, out=out) is out and np.array_equal(out, a[5:15])
    st = ra.stats()
    assert st["bytes_out"] >= a.nbytes and st["evictions"] > 0


def test_chunks_concat_and_meta(store):
    a = np.random.default_rng(0).standard_normal((1000, 3))
    ra = scad.RemoteArray.from_numpy(store, a, elements=["mem1"])
    total = sum(c.sum(axis=0) for _, c in ra.chunks(128))
    assert np.allclose(total, a.sum(axis=0))
    both = scad.RemoteArray.concat([ra[900:], ra[:100]])
    assert np.array_equal(both.to_numpy(), np.concatenate([a[900:], a[:100]]))
    meta = pickle.loads(pickle.dumps(both.meta))
    again = scad.RemoteArray.from_meta(store, meta)
    assert np.array_equal(again.to_numpy(), both.to_numpy())


def test_metadata_names_the_element_type_for_rust_and_reads_old_metadata(store):
    a = np.arange(60, dtype=np.float64).reshape(20, 3)
    ra = scad.RemoteArray.from_numpy(store, a)
    rust = ra.meta["extents"]  # what Rust's ArrayMeta::from_json reads
    assert (rust["dtype"], rust["item_size"], rust["shape"]) == ("f64", 8, [20, 3])
    # A Rust ArrayMeta opens directly, with its element type.
    again = scad.RemoteArray.from_meta(store, rust)
    assert again.dtype == np.float64 and np.array_equal(again.to_numpy(), a)
    i16 = scad.RemoteArray.from_numpy(store, np.arange(7, dtype=np.int16))
    assert i16.meta["extents"]["dtype"] == "i16" and i16.meta["extents"]["shape"] == [7]
    # Metadata written before the element types were named: rows of bytes.
    old = dict(ra.meta)
    old["extents"] = dict(rust, dtype="u8", item_size=1, shape=[20, 24])
    assert np.array_equal(scad.RemoteArray.from_meta(store, old).to_numpy(), a)
    # Types Python cannot name stay rows of bytes; names Python cannot open are refused.
    dt = np.dtype([("x", np.int16), ("y", np.float64)])
    assert scad.RemoteArray.empty(store, 4, dt).meta["extents"]["dtype"] == "u8"
    assert scad.RemoteArray.from_numpy(store, a.astype(">f8")).meta["extents"]["dtype"] == "u8"
    with pytest.raises(ValueError, match="is not one of u8, i8"):
        scad.RemoteArray.from_meta(store, dict(rust, dtype="rust:my::Pair"))
    with pytest.raises(ValueError, match="extents hold"):
        scad.RemoteArray.from_meta(store, dict(rust, shape=[21, 3]))


def test_structured_and_write(store):
    dt = np.dtype([("x", np.int16), ("y", np.float64)])
    ra = scad.RemoteArray.empty(store, 50, dt)
    rows = np.zeros(10, dt)
    rows["x"] = np.arange(10)
    ra.write(20, rows)
    assert np.array_equal(ra.to_numpy(20, 30), rows)
    ra2 = scad.RemoteArray.from_meta(store, ra.meta)
    assert ra2.dtype == dt


def test_bad_input(store):
    ra = scad.RemoteArray.from_numpy(store, np.zeros((10, 2)))
    with pytest.raises(IndexError):
        ra.to_numpy(5, 11)
    with pytest.raises(IndexError):
        ra[10]
    with pytest.raises(ValueError):
        ra[::2]
    with pytest.raises(ValueError):
        ra.write(0, np.zeros((2, 3)))
    with pytest.raises(IndexError):
        ra.write(9, np.zeros((2, 2)))
    with pytest.raises(ValueError):
        scad.RemoteArray.from_numpy(store, np.float64(3.0))
    with pytest.raises(KeyError):
        scad.RemoteArray.from_numpy(store, np.zeros(4), elements=["nope"])
    with pytest.raises(ValueError):
        scad.RemoteArray.from_meta(store, {"shape": [1]})
    with pytest.raises(ValueError):
        store.add_element("bad", "bad;rdma_nope;")
    with pytest.raises(ConnectionError):
        store.add_element("dead", "tcp://127.0.0.1:1")
    with pytest.raises(ValueError):
        scad.Store(policy="fifo")


def test_chunks_read_ahead_fetches_the_next_chunk(servers):
    a = np.arange(64 * 1024, dtype=np.float64).reshape(-1, 8)  # 512 KiB
    urls = {f"mem{i}": s.url for i, s in enumerate(servers)}
    meta = scad.RemoteArray.from_numpy(scad.Store(urls, pool_bytes=1 << 20, page_size=16 << 10), a).meta
    hits = {}
    for ahead in (False, True):
        fresh = scad.Store(urls, pool_bytes=1 << 20, page_size=16 << 10, read_ahead=0)
        ra = scad.RemoteArray.from_meta(fresh, meta)
        got = np.concatenate([c for _, c in ra.chunks(1024, read_ahead=ahead)])
        assert np.array_equal(got, a)
        hits[ahead] = fresh.stats()["hits"]
    assert hits[True] > hits[False]
    with pytest.raises(ValueError):
        next(ra.chunks(0))
