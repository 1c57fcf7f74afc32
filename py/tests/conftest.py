import os
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
