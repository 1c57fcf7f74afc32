"""COMPAT.md: durl and the disagg module."""
import struct
import threading
import time

import numpy as np
import pytest

import disagg
from scad import _native


def test_local_durl_completed_late_by_config_transport():
    cv = threading.Condition()
    a = disagg.LibdAction(cv, "0000", plugins=[], name="t")
    assert a.add_transport("client1;rdma_local;") == 0  # size missing: pending
    t = a.get_transport("client1", "rdma")
    t.reg(4096)
    struct.pack_into("@i", t.buf, 0, 12345)
    woke = []

    def waiter():
        with cv:
            cv.wait_for(lambda: a._native.state("client1") == 1, timeout=10)
            woke.append(True)

    w = threading.Thread(target=waiter)
    w.start()
    result = {}

    def write_then_read():
        result["w"] = t.write(4, 128, 0)  # blocks until configured
        struct.pack_into("@i", t.buf, 0, 0)
        result["r"] = t.read(4, 128, 0)
        result["v"] = struct.unpack_from("@i", t.buf, 0)[0]

    th = threading.Thread(target=write_then_read)
    th.start()
    time.sleep(0.2)
    assert th.is_alive(), "write must block while the transport is unconfigured"
    assert a.config_transport("client1", "client1;rdma_local;size,65536;") == 1
    th.join(10)
    w.join(10)
    assert result == {"w": 0, "r": 0, "v": 12345}
    assert woke == [True]
    a.terminate()


def test_tcp_transport_roundtrip_and_numpy_view(action_on):
    t = action_on.get_transport("mem", "rdma")
    t.reg(1 << 16)
    view = np.asarray(t.buf)
    assert view.dtype == np.uint8 and view.shape == (1 << 16,)
    view[:1000] = np.arange(1000) % 251
    assert t.write(1000, 4096, 0) == 0
    view[:1000] = 0
    assert t.read(1000, 4096, 500) == 0
    assert np.array_equal(view[500:1500], np.arange(1000) % 251)
    assert bytes(t.buf()[500:503]) == bytes([0, 1, 2])
    st = t.stats()
    assert st["bytes_written"] == 1000 and st["bytes_read"] == 1000


def test_shared_registration(action_on, server):
    action_on.add_transport(f"mem2;rdma_tcp;url,{server.url};")
    a = action_on.get_transport("mem", "rdma")
    b = action_on.get_transport("mem2", "rdma")
    a.reg(8192)
    b.reg(0, a)
    np.asarray(a.buf)[:4] = [1, 2, 3, 4]
    assert bytes(b.buf[0:4]) == b"\x01\x02\x03\x04"  # same memory
    b.write(4, 0, 0)
    np.asarray(a.buf)[:4] = 0
    a.read(4, 0, 0)
    assert list(np.asarray(b.buf)[:4]) == [1, 2, 3, 4]


def test_unknown_type_and_name_raise(action_on):
    with pytest.raises(ValueError, match="unknown transport type"):
        action_on.get_transport("mem", "tcp")
    with pytest.raises(KeyError, match="nope"):
        action_on.get_transport("nope", "rdma")


def test_read_before_reg_is_memory_error(action_on):
    t = action_on.get_transport("mem", "rdma")
    with pytest.raises(MemoryError):
        t.read(4, 0)
    with pytest.raises(MemoryError):
        t.write(4, 0)
    with pytest.raises(MemoryError):
        t.buf


def test_out_of_range_addresses(action_on, server):
    t = action_on.get_transport("mem", "rdma")
    t.reg(4096)
    with pytest.raises(IndexError):
        t.read(16, server.size - 8, 0)
    with pytest.raises(IndexError):
        t.write(8192, 0, 0)  # beyond the local buffer
    with pytest.raises(IndexError):
        t.read(16, 0, 4090)
    with pytest.raises(ValueError):
        t.read(-1, 0)
    with pytest.raises(TypeError):
        t.read(1.5, 0)
    assert t.read(np.int64(4), np.uint32(0), np.int8(0)) == 0  # NumPy integers are fine
    with pytest.raises(ValueError):
        t.reg(0)


def test_malformed_durls():
    a = disagg.LibdAction(None, "x")
    with pytest.raises(ValueError):
        a.add_transport("mem;rdma_bogus;")
    with pytest.raises(ValueError):
        a.add_transport("mem;rdma_tcp;url")
    a.add_transport("m;rdma_local;size,4096;")
    with pytest.raises(ValueError):
        a.add_transport("m;rdma_local;size,4096;")  # duplicate name
    a.terminate()


def test_unconfigured_transport_times_out_clearly():
    a = disagg.LibdAction(None, "x", timeout=0.3)
    a.add_transport("m;rdma_tcp;")
    t = a.get_transport("m", "rdma")
    t.reg(64)
    with pytest.raises(TimeoutError, match="url"):
        t.read(4, 0)


def test_terminate_wakes_blocked_calls():
    a = disagg.LibdAction(None, "x", timeout=30)
    a.add_transport("m;rdma_tcp;")
    t = a.get_transport("m", "rdma")
    t.reg(64)
    errs = []

    def blocked():
        try:
            t.read(4, 0)
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    th = threading.Thread(target=blocked)
    th.start()
    time.sleep(0.2)
    a.terminate()
    th.join(10)
    assert len(errs) == 1 and isinstance(errs[0], disagg.TerminatedError)


def test_rdma_server_serve_until_terminate():
    a = disagg.LibdAction(None, "srv")
    a.add_transport("server;rdma_tcp_server;url,tcp://127.0.0.1:0;size,1048576;")
    s = a.get_transport("server", "rdma_server")
    th = threading.Thread(target=s.serve)
    th.start()
    for _ in range(100):
        if s.server is not None:
            break
        time.sleep(0.02)
    c = disagg.LibdAction(None, "cli")
    c.add_transport(f"m;rdma_tcp;url,{s.server.url};")
    t = c.get_transport("m", "rdma")
    t.reg(16)
    t.buf[0:5] = b"hello"
    t.write(5, 100)
    t.buf[0:5] = b"-----"
    t.read(5, 100)
    assert bytes(t.buf[0:5]) == b"hello"
    a.terminate()
    th.join(10)
    assert not th.is_alive() and not s.server.running
    c.terminate()


def test_runtime_invoke_and_release():
    a = disagg.LibdAction(None, "x", templates={"mem": {"limits": {"mem": "4 MB"}}})
    assert a.runtime.invoke("mem", "extra") == "extra"
    t = a.get_transport("extra", "rdma")
    t.reg(64)
    t.buf[0:3] = b"abc"
    t.write(3, (4 << 20) - 3)  # the template's size
    with pytest.raises(IndexError):
        t.write(3, (4 << 20) - 2)
    a.runtime.release("extra")
    assert "extra" not in a._native.names()
    with pytest.raises(KeyError):
        a.get_transport("extra", "rdma")
    with pytest.raises(KeyError):
        a.runtime.release("never")
    a.terminate()


def test_profile_and_get_msg(action_on):
    action_on.profile("start")
    assert action_on.profile_points[0][0] == "start"
    assert action_on.get_transport("mem", "rdma").get_msg() is None


def test_gil_released_during_transfers(action_on):
    """A Python thread keeps running while another thread's read waits in Rust."""
    a = disagg.LibdAction(None, "x", timeout=2)
    a.add_transport("m;rdma_tcp;")
    t = a.get_transport("m", "rdma")
    t.reg(64)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.01)

    th = threading.Thread(target=ticker)
    th.start()
    with pytest.raises(TimeoutError):
        t.read(4, 0)
    stop.set()
    th.join()
    assert len(ticks) > 20


def test_every_durl_kind():
    """The durl table of COMPAT.md: local, shm, tcp client and server work; uverbs
    kinds raise a clear error on a build or host without RDMA instead of crashing."""
    import os
    srv = _native.MemoryServer(1 << 20)
    a = disagg.LibdAction(None, "kinds", timeout=5)
    try:
        assert a.add_transport("loc;rdma_local;size,4096;") == 1
        shm_id = f"pytest-{os.getpid()}"
        assert a.add_transport(f"shm;rdma_shm;size,65536;shm_id,{shm_id};") == 1
        assert a.add_transport(f"tcp;rdma_tcp;url,{srv.url};") == 1
        assert a.add_transport("srv;rdma_tcp_server;url,tcp://*:0;size,4096;") == 1
        for name in ("loc", "shm", "tcp"):
            t = a.get_transport(name, "rdma")
            t.reg(64)
            t.buf[0:4] = b"kind"
            t.write(4, 8)
            t.buf[0:4] = b"----"
            t.read(4, 8)
            assert bytes(t.buf[0:4]) == b"kind", name
        with pytest.raises(ValueError, match="server"):
            a._native.endpoint("srv")
        try:
            rv = a.add_transport("rd;rdma_uverbs;url,tcp://127.0.0.1:1;")
        except (_native.ScadError, OSError, ValueError, ConnectionError) as e:
            assert "rdma" in str(e).lower() or "uverbs" in str(e).lower() or "connect" in str(e).lower()
        else:
            assert rv in (0, 1)
    finally:
        a.terminate()
        srv.shutdown()


def _original_example(transport_url: str, extra_url: str):
    """The original's runtime_example_{tcp,local}.py: the element uses transport
    ``client1`` at once (its calls block) while another thread completes it with bare
    ``KEY,VALUE;`` pairs."""
    cv = threading.Condition()
    action = disagg.LibdAction(cv, "0000", timeout=20)
    assert action.add_transport(transport_url) == 0

    def delayed_config():
        time.sleep(0.2)
        assert action.config_transport("client1", extra_url) == 1

    config_thread = threading.Thread(target=delayed_config)
    config_thread.start()
    trans = action.get_transport("client1", "rdma")
    trans.reg(4096)
    struct.pack_into("@I", trans.buf, 0, 12345)
    assert action._native.state("client1") == 0, "still pending while the element starts"
    assert trans.write(4, addr=0, offset=0) == 0  # blocks until configured
    assert trans.read(4, addr=0, offset=4) == 0
    fetched = struct.unpack_from("@I", trans.buf[4:])[0]
    config_thread.join(10)
    assert fetched == 12345
    assert action._native.state("client1") == 1
    action.terminate()


def test_bare_pairs_complete_a_tcp_transport_as_the_original_example(server):
    _original_example("client1;rdma_tcp;", f"url,tcp://localhost:{server.port};")
    assert server.stats()["bytes_written"] == 4


def test_bare_pairs_complete_a_local_transport_as_the_original_example():
    _original_example("client1;rdma_local;", "size,65536;")


def test_config_transport_pairs_and_full_durls_and_their_errors(server):
    a = disagg.LibdAction(None, "pairs", timeout=5)
    a.add_transport("c;rdma_tcp;")
    a.add_transport("d;rdma_tcp;")
    with pytest.raises(ValueError, match=r"url,tcp://localhost:1.*end with ';'|end with ';'.*url,tcp://localhost:1"):
        a.config_transport("c", "url,tcp://localhost:1")
    with pytest.raises(ValueError, match="size,64"):
        a.config_transport("c", "size,64;")  # not a key of rdma_tcp
    with pytest.raises(ValueError, match="expected KEY,VALUE"):
        a.config_transport("c", "url;")
    with pytest.raises(KeyError):
        a.config_transport("nope", "url,tcp://localhost:1;")
    assert a._native.state("c") == 0
    assert a.config_transport("c", f"timeout_ms,5000;url,tcp://127.0.0.1:{server.port};") == 1
    assert a.config_transport("d", f"d;rdma_tcp;url,tcp://127.0.0.1:{server.port};") == 1
    a.terminate()
