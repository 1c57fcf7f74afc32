"""COMPAT.md: disaggrt.buffer_pool_lib, rdma_array, util."""
import base64
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from disaggrt import buffer_pool_lib, rdma_array, util


@pytest.fixture
def pool(action_on):
    t = action_on.get_transport("mem", "rdma")
    t.reg(buffer_pool_lib.buffer_size)
    return buffer_pool_lib.buffer_pool({"mem": t})


def test_constants():
    assert buffer_pool_lib.buffer_size == buffer_pool_lib.page_size * buffer_pool_lib.page_buffer_size


def test_write_read_and_allocation_metadata(pool):
    data = np.arange(1000, dtype=np.int64)
    meta = pool.write("mem", data)
    assert meta == [["mem", 0, 8000]]
    meta2 = pool.write("mem", b"xyz")
    assert meta2[0][1] >= 8000 and meta2[0][1] % 64 == 0
    ok, buf = pool.read(meta + meta2, 8003)
    assert ok is True
    assert np.array_equal(buf[:8000].view(np.int64), data)
    assert bytes(buf[8000:]) == b"xyz"
    state = pool.get_buffer_metadata()
    assert state["mem"] >= meta2[0][1] + 3
    assert pool.reserve_remote_mem("mem", 10) == state["mem"]
    with pytest.raises(MemoryError):
        pool.reserve_remote_mem("mem", 1 << 40)
    with pytest.raises(KeyError):
        pool.write("other", data)
    with pytest.raises(ValueError):
        pool.read(meta, 10)


def test_trans_metadata_continues_allocation(action_on, pool):
    pool.write("mem", np.zeros(100, np.uint8))
    state = pool.get_buffer_metadata()
    t = action_on.get_transport("mem", "rdma")
    nxt = buffer_pool_lib.buffer_pool({"mem": t}, state)
    assert nxt.reserve_remote_mem("mem", 8) == state["mem"]
    with pytest.raises(KeyError):
        buffer_pool_lib.buffer_pool({"mem": t}, {"ghost": 0})


def test_request_mem_on_buffer_and_flush_to_remote(pool):
    trans, off = pool.request_mem_on_buffer_for_array("mem", 256)
    np.frombuffer(trans.buf, np.uint8, 256, off)[:] = np.arange(256, dtype=np.uint8)
    addr = pool.reserve_remote_mem("mem", 256)
    pool.flush_to_remote("mem", addr, off, 256)
    _, back = pool.read([["mem", addr, 256]], 256)
    assert np.array_equal(back, np.arange(256, dtype=np.uint8))


@pytest.mark.parametrize("dtype,shape", [(np.float32, (300, 7)), (np.int32, (1000,)), (np.float64, (4, 5, 6))])
def test_remote_array_roundtrip(pool, dtype, shape):
    a = (np.arange(np.prod(shape)) * 3 % 1001).astype(dtype).reshape(shape)
    ra = rdma_array.remote_array(pool, input_ndarray=a, transport_name="mem")
    m = ra.get_array_metadata()
    assert m.dtype == np.dtype(dtype) and m.shape == shape and m.element_byte == np.dtype(dtype).itemsize
    assert m.cur_mem_size == a.nbytes and list(m.remote_mem_metadata) == [0]
    assert np.array_equal(ra.materialize(), a)


def test_partial_materialize_has_the_right_shape(pool):
    a = np.arange(60, dtype=np.float32).reshape(10, 6)
    ra = rdma_array.remote_array(pool, input_ndarray=a, transport_name="mem")
    rows = ra.materialize(12, 30)  # rows 2..5
    assert rows.shape == (3, 6) and np.array_equal(rows, a[2:5])
    flat = ra.materialize(7, 11)
    assert flat.shape == (4,) and np.array_equal(flat, a.reshape(-1)[7:11])
    assert np.array_equal(ra.materialize(54), a[9:])
    with pytest.raises(IndexError):
        ra.materialize(0, 61)


def test_structured_dtype(pool):
    dt = np.dtype([("k", np.float32), ("v", np.int64), ("s", "S3")])
    a = np.zeros(50, dtype=dt)
    a["k"] = np.arange(50)
    a["v"] = np.arange(50) * 7
    a["s"] = b"abc"
    ra = rdma_array.remote_array(pool, input_ndarray=a, transport_name="mem")
    back = ra.materialize()
    assert back.dtype == dt and np.array_equal(back, a)
    assert np.array_equal(ra.materialize(10, 20), a[10:20])


def test_slices_merge_and_empty_arrays(pool):
    a = np.arange(100, dtype=np.float64).reshape(50, 2)
    ra = rdma_array.remote_array(pool, input_ndarray=a, transport_name="mem")
    s = ra.get_slice(10, 20)
    assert s.shape == (10, 2) and np.array_equal(s.materialize(), a[10:20])
    merged = rdma_array.merge_arrays_metadata([ra.get_slice(40, 50).get_array_metadata(),
                                               ra.get_slice(0, 5).get_array_metadata()])
    assert merged.shape == (15, 2)
    back = rdma_array.remote_array(pool, metadata=merged).materialize()
    assert np.array_equal(back, np.concatenate([a[40:50], a[0:5]]))
    with pytest.raises(ValueError):
        rdma_array.merge_arrays_metadata([merged, rdma_array.remote_array(
            pool, input_ndarray=np.zeros((3, 3)), transport_name="mem").get_array_metadata()])
    with pytest.raises(IndexError):
        ra.get_slice(40, 60)


def test_init_empty_and_flush_slice(pool):
    ra = rdma_array.init_empty_remote_array(pool, "mem", np.int32, (20, 4))
    buf = ra.request_mem_on_buffer_for_array(5, 10)
    assert buf.dtype == np.uint8 and buf.nbytes == 5 * 4 * 4
    buf.view(np.int32)[:] = np.arange(20)
    ra.flush_slice(5, 10)
    assert np.array_equal(ra.materialize()[5:10].reshape(-1), np.arange(20))
    with pytest.raises(KeyError):
        ra.flush_slice(0, 5)  # nothing requested


def test_eviction_with_a_small_pool(action_on):
    """More data than the pool holds: pages are evicted and written back, and every
    byte reads back right (the original's eviction did not work)."""
    t = action_on.get_transport("mem", "rdma")
    small = buffer_pool_lib.buffer_pool({"mem": t}, capacity=8 * 4096, page=4096)
    a = np.random.default_rng(1).standard_normal((400, 100)).astype(np.float32)  # 160 KB
    # Rows written and read back in pieces smaller than a quarter of the pool, so they
    # go through it (a whole-array write or materialize would go around it).
    ra = rdma_array.init_empty_remote_array(small, "mem", np.float32, a.shape)
    for r in range(0, 400, 5):
        ra.write_rows(r, a[r:r + 5])
    back = np.concatenate([ra.materialize(r * 100, (r + 5) * 100) for r in range(0, 400, 5)])
    assert np.array_equal(back, a)
    st = small.stats()
    assert st["evictions"] > 0 and st["write_backs"] > 0
    assert st["bytes_direct"] == st["bytes_direct_out"] == 0
    assert np.array_equal(ra.materialize(), a)  # and around the pool, after write-backs


def test_wrong_metadata_and_inputs(pool):
    with pytest.raises(ValueError):
        rdma_array.remote_array(pool)
    with pytest.raises(TypeError):
        rdma_array.remote_array(pool, metadata={"dtype": "f4"})
    from collections import OrderedDict
    with pytest.raises(ValueError):
        rdma_array.remote_array_metadata(np.float32, (10,), OrderedDict({0: ["mem", 0, 12]}))
    with pytest.raises(KeyError):
        rdma_array.remote_array(pool, metadata=rdma_array.remote_array_metadata(
            np.float32, (3,), OrderedDict({0: ["ghost", 0, 12]})))


def test_pickled_metadata_opens_in_a_second_process(pool, server):
    a = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    ra = rdma_array.remote_array(pool, input_ndarray=a, transport_name="mem")
    blob = util.dumpMeta(ra.get_slice(100, 200).get_array_metadata())
    json_safe = base64.b64decode(blob)
    assert isinstance(pickle.loads(json_safe), rdma_array.remote_array_metadata)
    code = textwrap.dedent(f"""
        import sys, numpy as np, disagg
        from disaggrt import util
        a = disagg.LibdAction(None, 'second')
        a.add_transport('mem;rdma_tcp;url,{server.url};')
        loader = util.ArrayLoader(a, ['mem'])
        arr = loader.get({{'p': [{{'meta': sys.argv[1]}}]}}, 'p').materialize()
        np.save(sys.stdout.buffer, arr)
        a.terminate()
    """)
    out = subprocess.run([sys.executable, "-c", code, blob], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    import io
    back = np.load(io.BytesIO(out.stdout))
    assert np.array_equal(back, a[100:200])


def test_util_helpers(action_on, monkeypatch):
    t = util.initTrans(action_on, "mem", 4096)
    assert util.remoteWrite(t, np.arange(10, dtype=np.int32), 512) == 40
    util.asArray(t)[:] = 0
    back = util.remoteRead(t, 40, 512, 0, np.int32)
    assert list(back) == list(range(10))
    monkeypatch.setenv("__OW_PAR", "3")
    assert util.getParIndex() == 3
    monkeypatch.delenv("__OW_PAR")
    assert util.getParIndex() == 0
    monkeypatch.setenv("__OW_PAR", "x")
    with pytest.raises(ValueError):
        util.getParIndex()
    with pytest.raises(TypeError):
        util.loadMeta(base64.b64encode(pickle.dumps({"no": 1})).decode())


def test_native_pool_rejects_wrong_dtypes(pool):
    with pytest.raises(TypeError):
        pool._pool.read("mem", 0, np.zeros(4, np.float32))
    with pytest.raises(TypeError):
        pool._pool.write("mem", 0, [1, 2, 3])
    with pytest.raises(ValueError):
        pool.read_into("mem", 0, np.zeros(8, np.float32)[::2])


def _process_server(size):
    """A ``memory_server`` console-script process on a free loopback port."""
    p = subprocess.Popen([sys.executable, "-m", "scad.cli", "memory_server", "0", "tcp", "--size", size,
                          "--bind", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    assert line.startswith("listening on 127.0.0.1:"), line
    return p, int(line.rsplit(":", 1)[1])


def test_large_arrays_go_around_the_pool_as_element_programs_use_them():
    """Issue 28's conditions: a memory_server process, the transport registered with
    the original's buffer size, the array written with remote_array(input_ndarray=...)
    and read back in a second pool made from get_buffer_metadata(). A whole-array write
    and materialize each take one transport call straight between the array and the
    memory element: no page of either pool is fetched, evicted or written back."""
    import signal

    import disagg

    p, port = _process_server("64M")
    try:
        a = disagg.LibdAction(None, "issue28", timeout=10)
        a.add_transport(f"mem1;rdma_tcp;url,tcp://127.0.0.1:{port};")
        t = a.get_transport("mem1", "rdma")
        t.reg(buffer_pool_lib.buffer_size)
        bp = buffer_pool_lib.buffer_pool({"mem1": t})
        x = np.random.default_rng(28).standard_normal((1024, 5 * 1024 + 3)).astype(np.float32)  # ~20 MiB
        before = t.stats()
        ra = rdma_array.remote_array(bp, input_ndarray=x, transport_name="mem1")
        meta = ra.get_array_metadata()
        s1 = bp.stats()
        assert s1["bytes_direct_out"] == x.nbytes
        assert (s1["misses"], s1["evictions"], s1["write_backs"]) == (0, 0, 0), s1
        mid = t.stats()
        assert (mid["writes"] - before["writes"], mid["bytes_written"] - before["bytes_written"]) == (1, x.nbytes)

        pool2 = buffer_pool_lib.buffer_pool({"mem1": t}, bp.get_buffer_metadata())
        back = rdma_array.remote_array(pool2, metadata=meta).materialize()
        assert back.shape == x.shape and back.dtype == x.dtype
        assert back.tobytes() == x.tobytes()
        s2 = pool2.stats()
        assert s2["bytes_direct"] == x.nbytes
        assert (s2["misses"], s2["evictions"], s2["fetch_calls"]) == (0, 0, 1), s2
        after = t.stats()
        assert (after["reads"] - mid["reads"], after["bytes_read"] - mid["bytes_read"]) == (1, x.nbytes)

        # A large slice (more than a quarter of the pool) goes around the pool too; a
        # small one is served page by page from the cache.
        part = rdma_array.remote_array(pool2, metadata=meta).get_slice(100, 1000).materialize()
        assert np.array_equal(part, x[100:1000])
        assert pool2.stats()["bytes_direct"] == x.nbytes + x[100:1000].nbytes
        assert pool2.stats()["misses"] == 0
        small = rdma_array.remote_array(pool2, metadata=meta).get_slice(7, 9).materialize()
        assert np.array_equal(small, x[7:9])
        assert pool2.stats()["misses"] > 0
        a.terminate()
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        p.stdout.close()


def test_direct_writes_keep_cached_pages_consistent(pool):
    """A large write over pages the pool holds (dirty, clean, and partly covered with
    dirty bytes outside it) reads back as a write through the pool would, from this
    pool and, after flushing, from a fresh one."""
    base = np.arange(3 << 20, dtype=np.uint8)  # 3 MiB, written through the cache in pieces
    addr = pool.reserve_remote_mem("mem", base.nbytes)
    for off in range(0, base.nbytes, 1 << 20):
        pool.write("mem", base[off:off + (1 << 20)], addr + off)
    pool.write("mem", b"\xee" * 10, addr + 70_000)  # dirty page, partly covered below
    ok, _ = pool.read([["mem", addr + 200_000, 100]], 100)  # a clean cached page
    big = np.full(5 << 20, 7, dtype=np.uint8)
    big_addr = addr + 70_010  # starts right after the dirty bytes, inside their page
    pool.reserve_remote_mem("mem", 5 << 20)
    before = pool.stats()
    pool.write("mem", big, big_addr)
    assert pool.stats()["bytes_direct_out"] - before["bytes_direct_out"] == big.nbytes
    want = np.zeros(big_addr - addr + big.nbytes, dtype=np.uint8)
    want[:base.nbytes] = base
    want[70_000:70_010] = 0xEE
    want[70_010:] = 7
    ok, through_pool = pool.read([["mem", addr, want.nbytes]], want.nbytes)
    assert np.array_equal(through_pool, want)
    ok, small = pool.read([["mem", addr + 69_990, 40]], 40)  # a small read, from the cache
    assert np.array_equal(small, want[69_990:70_030])
    t = pool.trans_map["mem"]
    fresh = buffer_pool_lib.buffer_pool({"mem": t}, pool.get_buffer_metadata())
    ok, remote = fresh.read([["mem", addr, want.nbytes]], want.nbytes)
    assert np.array_equal(remote, want)


def test_direct_writes_refuse_bad_ranges_before_moving_anything(pool):
    t = pool.trans_map["mem"]
    size = pool._pool.transport_size("mem")
    big = np.ones(buffer_pool_lib.buffer_size, dtype=np.uint8)
    written = t.stats()["bytes_written"]
    with pytest.raises(IndexError):
        pool.write("mem", big, size - 10)
    with pytest.raises(MemoryError):
        pool.reserve_remote_mem("mem", size + 1)
    assert t.stats()["bytes_written"] == written
    # Non-contiguous sources are copied into order, as before; destinations must be
    # writable and contiguous.
    strided = np.arange(2 * (1 << 20), dtype=np.int32)[::2]
    (_, a, n), = pool.write("mem", strided)
    ok, back = pool.read([["mem", a, n]], n)
    assert np.array_equal(back.view(np.int32), strided)
    with pytest.raises(ValueError):
        pool.read_into("mem", a, np.zeros(2 * (1 << 20), np.int32)[::2])
