"""Freed and stale frames (issue 29, item 6): a freed handle raises on every use, naming the
frame, and never reads the frame written after it; metadata of a freed frame is refused, in this
process and in another one."""
import json
import subprocess
import sys

import pytest

pl = pytest.importorskip("polars")

import scad  # noqa: E402


@pytest.fixture
def env(store):
    return scad.FrameEnv(store)


def nonce(rf):
    return f"{json.loads(rf.meta)['seal']['nonce']:016x}"


def test_a_freed_frame_raises_instead_of_reading_the_next_one(store, env):
    rf = scad.RemoteFrame.from_polars(env, pl.DataFrame({"a": list(range(1, 101))}))
    assert scad.sql("SELECT sum(a) s FROM t", env=env, t=rf).to_polars()["s"][0] == 5050
    name = nonce(rf)
    other = rf.with_env(scad.FrameEnv(store, budget=1 << 20))
    rf.free()
    new = scad.RemoteFrame.from_polars(env, pl.DataFrame({"a": [70] * 100}))
    assert scad.sql("SELECT sum(a) s FROM t", env=env, t=new).to_polars()["s"][0] == 7000

    with pytest.raises(scad.FreedFrameError, match=f"table 't': frame {name}.* was freed"):
        scad.sql("SELECT sum(a) s FROM t", env=env, t=rf)
    for handle in (rf, other):
        assert handle.freed
        assert "freed" in repr(handle)
        for use in (handle.to_polars, handle.to_arrow, lambda: handle.meta, handle.free,
                    lambda: handle.filter(scad.col("a") > 1), lambda: pl.DataFrame(handle)):
            with pytest.raises(scad.FreedFrameError, match=name):
                use()
    # The metadata's shape is still known; the new frame is untouched.
    assert rf.height == 100 and rf.columns == ["a"]
    assert new.to_polars()["a"].sum() == 7000
    new.free()


def test_a_session_holding_a_freed_frame_refuses_to_query_it(env):
    rf = scad.RemoteFrame.from_polars(env, pl.DataFrame({"a": [1, 2, 3]}))
    session = scad.QuerySession(env, t=rf)
    assert session.sql("SELECT sum(a) s FROM t").to_polars()["s"][0] == 6
    rf.free()
    with pytest.raises(scad.FreedFrameError, match=rf._raw.label.split()[0]):
        session.sql("SELECT sum(a) s FROM t")


CHILD = """
import sys
import scad
store = scad.Store({"mem0": sys.argv[1]}, pool_bytes=1 << 20)
env = scad.FrameEnv(store)
try:
    rf = scad.RemoteFrame.from_meta(env, sys.stdin.read())
    print("sum", rf.to_polars()["a"].sum())
except scad.StaleFrameError as e:
    print("stale", e)
"""


def open_in_child(server, meta):
    r = subprocess.run([sys.executable, "-c", CHILD, server.url], input=meta, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_stale_metadata_is_refused_here_and_in_another_process(server, env):
    rf = scad.RemoteFrame.from_polars(env, pl.DataFrame({"a": list(range(1, 101))}))
    meta = rf.meta
    assert open_in_child(server, meta) == "sum 5050"
    again = scad.RemoteFrame.from_meta(env, meta)
    rf.free()
    new = scad.RemoteFrame.from_polars(env, pl.DataFrame({"a": [70] * 100}))
    out = open_in_child(server, meta)
    assert out.startswith("stale") and nonce(new) not in out, out
    with pytest.raises(scad.StaleFrameError, match="stale frame"):
        scad.RemoteFrame.from_meta(env, meta)
    # A handle opened before the free (in this process, but not a clone) checks the seal.
    assert not again.freed
    with pytest.raises(scad.StaleFrameError):
        again.to_polars()
    with pytest.raises(scad.StaleFrameError, match="table 't'"):
        scad.sql("SELECT sum(a) s FROM t", env=env, t=again)
    assert open_in_child(server, new.meta) == "sum 7000"
    new.free()


def test_metadata_written_before_seals_fails_naming_its_version(env):
    rf = scad.RemoteFrame.from_polars(env, pl.DataFrame({"a": [1, 2, 3]}))
    m = json.loads(rf.meta)
    m["version"] = 1
    del m["seal"]
    with pytest.raises(ValueError, match="version 1"):
        scad.RemoteFrame.from_meta(env, json.dumps(m))
    rf.free()
