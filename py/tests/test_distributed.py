"""SQL across a Ray cluster (``scad.DistributedSession``), on a local cluster of two Ray
nodes of one CPU each (``ray.cluster_utils.Cluster``) shared by the module: the 99
TPC-DS queries equal DuckDB's answers with every stage split into partition tasks; the
tasks of a stage run at once on both nodes; a task killed mid-run, or failing with a
query error, fails its query naming it, within bounded time, and returns every
allocation region; the memory elements saw the shuffle; bad arguments start nothing;
``close`` leaves no actor and no open port."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO

ray = pytest.importorskip("ray", reason="the distributed tests need `pip install 'scad[ray]'`")

import pyarrow as pa  # noqa: E402

import scad  # noqa: E402
from scad.distributed import ACTOR_PREFIX  # noqa: E402
from scad.ray_runner import NAMESPACE  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "benches", "python"))
import tpcds_compare  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore::ResourceWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each on this machine; the driver connected to them."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        c.add_node(num_cpus=1)
        ray.init(address=c.address, namespace=NAMESPACE, log_to_driver=False, include_dashboard=False,
                 configure_logging=False)
        try:
            assert len([n for n in ray.nodes() if n["Alive"]]) == 2
            yield c
        finally:
            ray.shutdown()
    finally:
        c.shutdown()


def session_actors(prefix=ACTOR_PREFIX):
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]


def wait_no_actors(prefix=ACTOR_PREFIX, seconds=20.0, besides=()):
    """The session actors (names starting with ``prefix``) still alive after up to
    ``seconds``, other than ``besides``."""
    deadline = time.monotonic() + seconds
    while True:
        left = [a for a in session_actors(prefix) if a not in besides]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def port_open(url):
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


# -- TPC-DS ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wh5_dir():
    """TPC-DS SF 0.01 with the catalog and web sales' warehouses spread over five (so
    q16, q94 and q95 match rows), as the Rust engine tests use it."""
    pytest.importorskip("duckdb", reason="benches/tpcds/gen_data.py needs duckdb")
    root = os.path.join(REPO, "data", "tpcds")
    r = subprocess.run([sys.executable, os.path.join(REPO, "benches", "tpcds", "gen_data.py"), "--sf", "0.01",
                        "--spread-warehouses", "5", "--out", root, "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return os.path.join(root, "sf0.01-wh5")


@pytest.fixture(scope="module")
def tpcds(cluster, wh5_dir):
    with scad.DistributedSession(tpcds_compare.tables(wh5_dir), partitions=2, budget=256 << 20,
                                 chunk_rows=4096) as ds:
        yield ds
    assert wait_no_actors(ds.id) == []


TIMES = {}


@pytest.mark.parametrize("n", range(1, 100))
def test_tpcds_query_distributed_equals_duckdb(tpcds, wh5_dir, n):
    r = tpcds.sql(tpcds_compare.query_text(wh5_dir, n))
    TIMES[n] = r.stats["elapsed_s"]
    difference = tpcds_compare.compare(r.table, tpcds_compare.reference(wh5_dir, n), r.ordered)
    assert difference is None, f"q{n}: {difference}"
    assert r.stats["tasks"] == len(r.tasks) == sum(s["tasks"] for s in r.stages)
    assert sorted((t["stage"], t["task"]) for t in r.tasks) == [(s["id"], t) for s in r.stages
                                                              for t in range(s["tasks"])]
    assert tpcds.slots_in_use == 0
    if n == 99:
        print(f"\n99 TPC-DS queries distributed: {sum(TIMES.values()):.1f} s of queries")


def test_tasks_of_one_stage_run_at_once_on_different_nodes(tpcds, wh5_dir):
    # Stages split into two partition tasks, submitted together and SPREAD over the two
    # one-CPU nodes.
    overlapping = []
    for n in (1, 3, 7, 2, 5, 6, 8, 9, 10):
        if overlapping:
            break
        r = tpcds.sql(tpcds_compare.query_text(wh5_dir, n))
        by_stage = {}
        for t in r.tasks:
            by_stage.setdefault(t["stage"], []).append(t)
        for stage, ts in by_stage.items():
            for a in ts:
                for b in ts:
                    if a["task"] < b["task"] and a["node_id"] != b["node_id"] and \
                            a["start"] < b["end"] and b["start"] < a["end"]:
                        overlapping.append((n, stage, a["task"], b["task"]))
        assert r.stats["nodes"] == 2, r.tasks
    assert overlapping, "no two tasks of a stage ran at the same time on different nodes"


def test_the_memory_elements_saw_the_shuffle(tpcds, wh5_dir):
    r = tpcds.sql(tpcds_compare.query_text(wh5_dir, 1))
    s = r.stats
    assert s["shuffle_bytes"] > 0
    written = sum(e["bytes_written"] for e in s["elements"].values())
    read = sum(e["bytes_read"] for e in s["elements"].values())
    outputs = s["shuffle_bytes"] + s["root_bytes"]
    assert s["spill_files"] == 0
    # Every byte the tasks wrote reached a memory element (plus a little framing).
    assert outputs <= written <= outputs * 1.25 + (64 << 10), (written, outputs)
    # The consumers read the shuffle back, and the scans read the tables.
    assert read >= s["shuffle_bytes"] + s["scan_bytes"] * 0.5, (read, s)
    assert set(s["elements"]) == {"mem0", "mem1"}


def test_too_many_tasks_for_the_regions_are_refused(cluster):
    t = pa.table({"k": list(range(1000)), "v": list(range(1000))})
    with scad.DistributedSession({"t": t}, element_bytes=64 << 20, region_bytes=16 << 20) as ds:
        assert ds.slots == 3
        q = "SELECT a.k, count(*) AS n FROM t a JOIN t b ON a.k = b.v JOIN t c ON b.k = c.k GROUP BY a.k"
        with pytest.raises(scad.DistributedQueryError, match=r"only 3 of 3 allocation regions are free"):
            ds.sql(q)
        assert ds.slots_in_use == 0
        assert ds.sql("SELECT count(*) AS n FROM t").table.to_pylist() == [{"n": 1000}]


def test_a_task_outgrowing_its_region_fails_the_query_saying_so(cluster):
    t = pa.table({"k": pa.array(range(200_000), pa.int64())})
    with scad.DistributedSession({"t": t}, partitions=2, region_bytes=64 << 10) as ds:
        with pytest.raises(scad.DistributedQueryError, match=r"MemoryError: .* is full: raise region_bytes"):
            ds.sql("SELECT k % 100000 AS g, count(*) AS n FROM t GROUP BY g")
        assert ds.slots_in_use == 0
        assert ds.sql("SELECT count(*) AS n FROM t").table.to_pylist() == [{"n": 200_000}]


# -- failures --------------------------------------------------------------------------------------

N = 20_000
#: Rows of ``a JOIN b ON a.x = b.y``.
MATCHES = len(range(0, N, 9))


@pytest.fixture(scope="module")
def big(cluster):
    """A session over two synthetic tables whose cross join takes seconds."""
    n = N
    a = pa.table({"x": pa.array(range(n), pa.int64()), "s": [f"v{i}" for i in range(n)]})
    b = pa.table({"y": pa.array(range(0, 3 * n, 9), pa.int64())})
    with scad.DistributedSession({"a": a, "b": b}, partitions=2, budget=256 << 20) as ds:
        yield ds
    assert wait_no_actors(ds.id) == []


SLOW = "SELECT count(*) AS n FROM a, b WHERE (a.x * 7 + b.y) % 1013 = 5"


def running_tasks(query_prefix):
    """(pid, stage, task) of every process whose title says it runs a task of the
    query (Ray titles a worker ``ray::<task name>`` while it runs that task)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        m = re.match(rf"ray::{re.escape(query_prefix)}\d+/stage(\d+)/task(\d+)", title)
        if m:
            found.append((int(entry), int(m.group(1)), int(m.group(2))))
    return found


def test_a_killed_task_fails_its_query_naming_it_and_frees_its_regions(big):
    outcome = {}

    def run():
        try:
            outcome["result"] = big.sql(SLOW)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    # The victim: a task seen running for half a second (not one returning its result).
    seen, victim = {}, None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline and thread.is_alive():
        now = time.monotonic()
        tasks = running_tasks(f"{big.id}-q")
        seen = {t: seen.get(t, now) for t in tasks}
        victim = next((t for t, since in seen.items() if now - since >= 0.5), None)
        time.sleep(0.05)
    pid, stage, task = victim
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(120)
    assert not thread.is_alive()
    assert time.monotonic() - killed < 60
    exc = outcome.get("error")
    assert isinstance(exc, scad.DistributedQueryError), outcome
    assert (exc.stage, exc.task) == (stage, task), str(exc)
    assert f"stage {stage} task {task} failed" in str(exc)
    assert re.search(r"Worker|died|crash", exc.cause, re.I), exc.cause
    assert big.slots_in_use == 0
    ok = big.sql("SELECT count(*) AS n FROM b JOIN a ON a.x = b.y")  # the session still works
    assert ok.table.to_pylist() == [{"n": MATCHES}]
    assert big.slots_in_use == 0


def test_a_query_error_in_a_task_fails_the_query_naming_it(big):
    bad = "SELECT b.y, t.n FROM b JOIN (SELECT x, CAST(s AS INT) AS n FROM a) t ON t.x = b.y"
    plan = big.stages(bad)  # it plans: the error comes when a task casts 'v0'
    assert plan["stages"]
    with pytest.raises(scad.DistributedQueryError) as info:
        big.sql(bad)
    exc = info.value
    assert exc.stage is not None and exc.task is not None
    assert f"stage {exc.stage} task {exc.task} failed" in str(exc)
    assert "QueryError" in exc.cause and "Cast error" in exc.cause, exc.cause
    assert big.slots_in_use == 0
    ok = big.sql("SELECT count(*) AS n FROM b JOIN a ON a.x = b.y")
    assert ok.table.to_pylist() == [{"n": MATCHES}]
    assert big.slots_in_use == 0


def test_sql_that_does_not_plan_raises_before_anything_runs(big):
    with pytest.raises(scad.UnknownNameError):
        big.sql("SELECT nope FROM a")
    with pytest.raises(scad.QueryError):
        big.sql("SELEC 1")
    assert big.slots_in_use == 0


# -- arguments and lifetime ------------------------------------------------------------------------

def test_bad_arguments_are_refused_and_start_nothing(cluster, tmp_path):
    before = session_actors()  # the module's other sessions
    t = pa.table({"k": [1, 2, 3]})
    with pytest.raises(FileNotFoundError, match=r"table t: no file"):
        scad.DistributedSession({"t": str(tmp_path / "nowhere.parquet")})
    with pytest.raises(ValueError, match=r"table name 'no-good' is not an identifier"):
        scad.DistributedSession({"no-good": t})
    with pytest.raises(ValueError, match=r"budget must be positive"):
        scad.DistributedSession({"t": t}, budget=0)
    with pytest.raises(ValueError, match=r"budget must be positive"):
        scad.DistributedSession({"t": t}, budget=-5)
    with pytest.raises(ValueError, match=r"partitions must be positive"):
        scad.DistributedSession({"t": t}, partitions=0)
    with pytest.raises(TypeError, match=r"table t: expected a Parquet path or an Arrow table"):
        scad.DistributedSession({"t": [1, 2, 3]})
    with pytest.raises(ValueError, match=r"needs tables"):
        scad.DistributedSession({})
    with pytest.raises(ValueError, match=r"budget 1099511627776 is more memory than any Ray node offers"):
        scad.DistributedSession({"t": t}, budget=1 << 40)
    with pytest.raises(ValueError, match=r"task_timeout must be positive"):
        scad.DistributedSession({"t": t}, task_timeout=0)
    with pytest.raises(ValueError, match=r"env= does not apply with ray="):
        scad.sql("SELECT 1", ray=True, env=object(), t=t)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(pa.ArrowInvalid):
        scad.DistributedSession({"t": str(tmp_path / "junk.parquet")})
    with pytest.raises(ValueError, match=r"no room for a"):  # actors started, then stopped
        scad.DistributedSession({"t": t}, element_bytes=1 << 20, region_bytes=1 << 20)
    assert wait_no_actors(besides=before) == []


def test_sql_with_ray_runs_one_query_and_leaves_nothing(cluster, tmp_path):
    import pyarrow.parquet as pq

    before = session_actors()
    pq.write_table(pa.table({"k": [1, 2, 2, 3], "v": [1.5, 2.0, 3.0, 4.5]}), tmp_path / "t.parquet")
    r = scad.sql("SELECT k, sum(v) AS s FROM t GROUP BY k ORDER BY k", ray=cluster.address,
                 t=str(tmp_path / "t.parquet"))
    assert isinstance(r, scad.DistributedResult) and r.ordered
    assert r.columns == ["k", "s"]
    assert r.table.to_pylist() == [{"k": 1, "s": 1.5}, {"k": 2, "s": 5.0}, {"k": 3, "s": 4.5}]
    assert wait_no_actors(besides=before) == []


def test_close_stops_the_memory_elements(cluster):
    ds = scad.DistributedSession({"t": pa.table({"k": [1, 2, 3]})}, memory_elements=3)
    urls = list(ds.element_urls.values())
    assert len(session_actors(ds.id)) == 3 and all(port_open(u) for u in urls)
    # three elements on two nodes: round-robin
    assert len(set(ds.element_nodes.values())) == 2
    assert ds.sql("SELECT sum(k) AS s FROM t").table.to_pylist() == [{"s": 6}]
    ds.close()
    ds.close()  # idempotent
    assert wait_no_actors(ds.id) == []
    assert not any(port_open(u) for u in urls)
    with pytest.raises(scad.DistributedQueryError, match="closed"):
        ds.sql("SELECT 1")


def test_a_lost_memory_element_fails_the_query_and_the_session_says_so(cluster):
    before = session_actors()
    with scad.DistributedSession({"t": pa.table({"k": list(range(10_000))})}, task_timeout=60) as ds:
        assert ds.sql("SELECT count(*) AS n FROM t").table.to_pylist() == [{"n": 10_000}]
        ray.kill(ray.get_actor(f"{ds.id}/mem1", namespace=NAMESPACE), no_restart=True)
        start = time.monotonic()
        with pytest.raises(scad.DistributedQueryError, match=r"memory element\(s\) mem1 died") as info:
            ds.sql("SELECT k % 7 AS g, count(*) AS n FROM t GROUP BY g")
        assert time.monotonic() - start < 60
        assert info.value.stage is not None
        with pytest.raises(scad.DistributedQueryError, match=r"unusable: memory element\(s\) mem1 died"):
            ds.sql("SELECT 1")
        assert ds.slots_in_use == 0
    assert wait_no_actors(besides=before) == []
