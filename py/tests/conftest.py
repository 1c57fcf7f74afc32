import os
import subprocess
import sys

import pytest

from scad import _native

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DAGS = os.path.join(REPO, "examples", "dags")


@pytest.fixture
def server():
    s = _native.MemoryServer(64 << 20)
    yield s
    s.shutdown()


@pytest.fixture
def store(server):
    """A store (pool of 4 MiB) over the one memory server, named mem0."""
    import scad

    return scad.Store({"mem0": server.url}, pool_bytes=4 << 20)


@pytest.fixture
def servers():
    ss = [_native.MemoryServer(32 << 20) for _ in range(2)]
    yield ss
    for s in ss:
        s.shutdown()


@pytest.fixture
def action_on(server):
    """A LibdAction with transport 'mem' connected to the server."""
    import disagg

    a = disagg.LibdAction(None, "test", timeout=10)
    a.add_transport(f"mem;rdma_tcp;url,{server.url};")
    yield a
    a.terminate()


def run_cli(*args, cwd=None, env=None, timeout=120):
    import subprocess

    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "scad.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=timeout)


@pytest.fixture(scope="session")
def tpcds_dir():
    """TPC-DS at SF 0.01 (text tables, Parquet, DuckDB's reference answers), generated
    once into data/tpcds by benches/tpcds/gen_data.py."""
    pytest.importorskip("duckdb", reason="benches/tpcds/gen_data.py needs duckdb (bash scripts/setup.sh installs it)")
    root = os.path.join(REPO, "data", "tpcds")
    r = subprocess.run([sys.executable, os.path.join(REPO, "benches", "tpcds", "gen_data.py"), "--sf", "0.01",
                        "--out", root, "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d = os.path.join(root, "sf0.01")
    assert os.path.exists(os.path.join(d, "text", "store_returns.dat"))
    return d
