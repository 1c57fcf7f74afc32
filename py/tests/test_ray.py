"""Element DAGs and query stages on Ray (``scad run --ray``), on one local Ray
instance shared by the tests of this module: the example DAGs give the results they
give under ``scad run``; a failing element fails the run with its error and leaves no
actor or memory server behind; a memory element that dies makes its reader fail
within the transport's timeout; ``runtime.invoke``/``release`` start and stop actors;
a TPC-DS query written as a stage DAG equals DuckDB's answer."""
import os
import socket
import textwrap
import time

import pytest

from conftest import DAGS, run_cli

ray = pytest.importorskip("ray", reason="the Ray tests need `pip install 'scad[ray]'` (scripts/setup.sh installs it)")

from scad.dag import DagError  # noqa: E402
from scad.ray_runner import NAMESPACE, run_dag_ray  # noqa: E402
from scad.runner import DagRunError, run_dag  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore::ResourceWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance of 2 CPUs; yields its address for other drivers."""
    ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def live_run_actors():
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("run-")]


def wait_no_actors(seconds=20.0):
    deadline = time.monotonic() + seconds
    while live_run_actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    return live_run_actors()


def port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def write_dag(d, files):
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(textwrap.dedent(text))
    return str(d)


MEM = """\
    type: memory
    corunning: [{users}]
    limits:
      mem: 16 MB
"""


@pytest.mark.parametrize("dag", ["corunning-2-node", "logistic-regression"])
def test_example_dag_gives_the_local_results(cluster, dag, tmp_path):
    local = run_dag(os.path.join(DAGS, dag), str(tmp_path / "local"))
    on_ray = run_dag_ray(os.path.join(DAGS, dag), output_dir=str(tmp_path / "ray"))
    assert on_ray.results == local.results
    assert on_ray.results  # the DAG's leaves returned something
    # The same files for children and users, and the bytes moved were counted.
    assert sorted(os.listdir(tmp_path / "ray")) == sorted(os.listdir(tmp_path / "local"))
    assert all(e.status in ("ok", "served") for e in on_ray.elements), on_ray.table()
    memory = [e for e in on_ray.elements if e.kind == "memory"]
    assert memory and all(e.bytes_written > 0 for e in memory)
    assert wait_no_actors() == []


def test_tpcds_q1_dag_matches_duckdb_on_ray_through_the_cli(cluster, tpcds_dir, tmp_path):
    import json

    r = run_cli("run", os.path.join(DAGS, "tpcds-q1"), "-d", str(tmp_path), "-q", "--ray", cluster,
                env={"SCAD_TPCDS_DIR": tpcds_dir}, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "rundisagg.answer.json", encoding="utf-8") as f:
        answer = json.load(f)
    assert answer["matches_reference"] is True
    assert len(answer["c_customer_id"]) > 0
    assert [e for e in os.listdir(tmp_path) if e.startswith("rundisagg.ctr@")]  # both instances wrote
    assert wait_no_actors() == []


def test_a_tpcds_query_as_stage_dag_runs_on_ray(cluster, tpcds_dir, tmp_path):
    import pyarrow.parquet as pq

    import scad

    tables = {t: os.path.join(tpcds_dir, "parquet", f"{t}.parquet")
              for t in ("store_returns", "date_dim", "store", "customer")}
    with open(os.path.join(tpcds_dir, "reference", "q1.sql"), encoding="utf-8") as f:
        sql = f.read()
    plan = scad.write_stage_dag(sql, tables, str(tmp_path / "dag"), budget=8 << 20, memory_mb=256)
    assert len(plan["stages"]) >= 3
    report = run_dag_ray(str(tmp_path / "dag"), output_dir=str(tmp_path / "out"))
    answer = report.results["answer"]
    expected = pq.read_table(os.path.join(tpcds_dir, "reference", "q1.parquet")).to_pylist()
    assert answer["columns"] == ["c_customer_id"]
    assert [r["c_customer_id"] for r in answer["rows"]] == [r["c_customer_id"] for r in expected]
    # every stage ran as its own element, one instance per task
    stage_reports = [e for e in report.elements if e.name.startswith("stage_")]
    assert len(stage_reports) == len(plan["stages"]) and all(e.status == "ok" for e in stage_reports)
    assert [e.instances for e in stage_reports] == [s["tasks"] for s in plan["stages"]]
    assert wait_no_actors() == []


def test_a_failing_element_fails_the_run_and_leaves_nothing(cluster, tmp_path):
    where = tmp_path / "address.txt"
    d = write_dag(tmp_path / "dag", {
        "mem.o.yaml": MEM.format(users="boom"),
        "boom.o.py": """\
            #@ type: compute
            #@ dependents: [after]
            #@ corunning: [mem]
            import os

            import ray
            from scad.ray_runner import NAMESPACE, memory_actor_name

            def main(params, action):
                t = action.get_transport("mem", "rdma")
                t.reg(4096)
                t.write(8, 0, 0)
                mem = ray.get_actor(memory_actor_name(os.environ["SCAD_RUN_ID"], "mem"), namespace=NAMESPACE)
                address = ray.get(mem.address.remote())
                with open(os.environ["SCAD_TEST_ADDRESS"], "w") as f:
                    f.write(f"{address['host']} {address['port']}")
                raise ValueError("boom 42")
            """,
        "after.o.py": """\
            #@ type: compute
            import os

            def main(params, action):
                open(os.environ["SCAD_TEST_ADDRESS"] + ".after", "w").close()
                return {}
            """,
    })
    os.environ["SCAD_TEST_ADDRESS"] = str(where)
    try:
        with pytest.raises(DagRunError, match=r"boom: ValueError: boom 42"):
            run_dag_ray(d, output_dir=str(tmp_path / "out"))
    finally:
        del os.environ["SCAD_TEST_ADDRESS"]
    host, port = where.read_text().split()  # the element ran on Ray with the forwarded environment
    assert not port_open(host, int(port))  # its memory server is gone
    assert not (tmp_path / "address.txt.after").exists()  # its dependent never started
    assert wait_no_actors() == []


def test_a_dead_memory_element_fails_its_reader_within_the_timeout(cluster, tmp_path):
    d = write_dag(tmp_path / "dag", {
        "mem.o.yaml": MEM.format(users="reader"),
        "reader.o.py": """\
            #@ type: compute
            #@ corunning: [mem]
            import os
            import time

            import ray
            from scad.ray_runner import NAMESPACE, memory_actor_name

            def main(params, action):
                t = action.get_transport("mem", "rdma")
                t.reg(4096)
                t.write(64, 0, 0)
                me = ray.get_actor(memory_actor_name(os.environ["SCAD_RUN_ID"], "mem"), namespace=NAMESPACE)
                ray.kill(me, no_restart=True)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # until the kill has landed
                    t.read(64, 0, 0)
                    time.sleep(0.05)
                return {"read_after_kill": True}
            """,
    })
    start = time.monotonic()
    with pytest.raises(DagRunError, match=r"reader: "):
        run_dag_ray(d, output_dir=str(tmp_path / "out"), timeout=20)
    assert time.monotonic() - start < 60
    assert wait_no_actors() == []


def test_runtime_invoke_and_release_start_and_stop_actors(cluster, tmp_path):
    d = write_dag(tmp_path / "dag", {
        "extra.o.yaml": "type: memory\nlimits:\n  mem: 8 MB\n",
        "grow.o.py": """\
            #@ type: compute
            import os
            import struct

            import ray
            from scad.ray_runner import NAMESPACE, memory_actor_name

            def main(params, action):
                name = action.runtime.invoke("extra", "more")
                actor = memory_actor_name(os.environ["SCAD_RUN_ID"], "more")
                ray.get_actor(actor, namespace=NAMESPACE)  # it exists while invoked
                t = action.get_transport("more", "rdma")
                t.reg(4096)
                struct.pack_into("@q", t.buf, 0, 777)
                t.write(8, 128, 0)
                struct.pack_into("@q", t.buf, 0, 0)
                t.read(8, 128, 0)
                (value,) = struct.unpack_from("@q", t.buf, 0)
                action.runtime.release(name)
                gone = False
                for _ in range(100):
                    try:
                        ray.get_actor(actor, namespace=NAMESPACE)
                    except ValueError:
                        gone = True
                        break
                    import time; time.sleep(0.1)
                return {"value": value, "gone": gone, "names": action._native.names()}
            """,
    })
    report = run_dag_ray(d, output_dir=str(tmp_path / "out"))
    assert report.results["grow"] == {"value": 777, "gone": True, "names": []}
    assert wait_no_actors() == []


def test_an_element_asking_more_than_any_node_has_is_refused_before_it_runs(cluster, tmp_path):
    d = write_dag(tmp_path / "dag", {
        "big.o.py": """\
            #@ type: compute
            #@ limits: {cpu: 64}
            def main(params, action):
                raise AssertionError("must not run")
            """,
    })
    with pytest.raises(DagRunError, match=r"big: limits.cpu 64 is more than any Ray node has \(2\)"):
        run_dag_ray(d, output_dir=str(tmp_path / "out"))
    d2 = write_dag(tmp_path / "dag2", {
        "mem.o.yaml": "type: memory\ncorunning: [small]\nlimits:\n  mem: 4 TB\n",
        "small.o.py": "#@ type: compute\n#@ corunning: [mem]\ndef main(params, action):\n    return {}\n",
    })
    with pytest.raises(DagRunError, match=r"memory element mem: 4194304 MiB is more than any Ray node offers"):
        run_dag_ray(d2, output_dir=str(tmp_path / "out2"))
    with pytest.raises(DagError):
        run_dag_ray(str(tmp_path / "nowhere"))
    assert wait_no_actors() == []


def test_cli_refuses_local_placement_options_and_explains_a_missing_ray(tmp_path):
    r = run_cli("run", os.path.join(DAGS, "corunning-2-node"), "--ray", "-j", "2")
    assert r.returncode == 2 and "-j and --host do not apply" in r.stderr
    # Without Ray importable, --ray says how to install it.
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no ray here')\n")
    r = run_cli("run", os.path.join(DAGS, "corunning-2-node"), "--ray",
                env={"PYTHONPATH": str(tmp_path / "noray") + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert r.returncode == 2, r.stderr
    assert "pip install 'scad[ray]'" in r.stderr
