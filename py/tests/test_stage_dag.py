"""A SQL query written as an element DAG (``scad.write_stage_dag``, one compute element
per stage of its plan, one instance per task) and run by ``scad run``: the answer
equals the same query run in one process; bad input is refused before anything is
written; a failing stage fails the run."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import scad
from conftest import run_cli

SQL = """
SELECT i.cat, sum(s.qty) AS q, count(*) AS n,
       rank() OVER (ORDER BY sum(s.qty) DESC, i.cat) AS r
FROM sales s JOIN items i ON s.item = i.item
WHERE s.price > 10
GROUP BY i.cat
ORDER BY i.cat
"""


def write_tables(tmp_path):
    n = 30_000
    sales = pa.table({"item": [i % 97 for i in range(n)], "qty": [i % 13 for i in range(n)],
                      "price": [float(i % 101) for i in range(n)]})
    items = pa.table({"item": list(range(97)), "cat": [f"c{i % 7}" for i in range(97)]})
    paths = {"sales": str(tmp_path / "sales.parquet"), "items": str(tmp_path / "items.parquet")}
    pq.write_table(sales, paths["sales"])
    pq.write_table(items, paths["items"])
    return paths


def in_one_process(paths, sql):
    server = scad.MemoryServer(256 << 20)
    try:
        env = scad.FrameEnv(scad.Store({"mem": server.url}))
        frames = {name: scad.RemoteFrame.from_arrow(env, pq.read_table(p)) for name, p in paths.items()}
        return scad.sql(sql, **frames).to_arrow().to_pylist()
    finally:
        server.shutdown()


def test_a_query_dag_runs_under_scad_run_and_equals_the_query(tmp_path):
    paths = write_tables(tmp_path)
    dag = tmp_path / "dag"
    plan = scad.write_stage_dag(SQL, paths, str(dag), budget=4 << 20, memory_mb=256, partitions=3)
    stages = plan["stages"]
    assert len(stages) >= 3, plan  # join build side, exchange, root at least
    assert all(i < s["id"] for s in stages for i in s["inputs"])
    assert any(s["tasks"] == 3 for s in stages), plan  # partitions run as parallel instances
    assert {"mem.o.yaml", "load.o.py", "answer.o.py", "query.sql", "dag.json"} <= set(os.listdir(dag))
    r = run_cli("run", str(dag), "-d", str(tmp_path / "out"), "-q", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "out" / "rundisagg.answer.json", encoding="utf-8") as f:
        answer = json.load(f)
    assert answer["ordered"] is True
    assert answer["columns"] == ["cat", "q", "n", "r"]
    assert answer["rows"] == in_one_process(paths, SQL)
    assert len(answer["rows"]) == 7
    assert answer["tasks"] == sum(s["tasks"] for s in stages)
    # Every task ran within its budget.
    ran = 0
    for s in stages:
        names = [f"stage_{s['id']}.json"] if s["tasks"] == 1 else \
            [f"stage_{s['id']}@{t}.json" for t in range(s["tasks"])]
        for name in names:
            with open(tmp_path / "out" / f"rundisagg.{name}", encoding="utf-8") as f:
                out = json.load(f)
            assert out["stats"]["peak_local_bytes"] <= 4 << 20
            ran += 1
    assert ran == answer["tasks"]


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    paths = write_tables(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        scad.write_stage_dag(SQL, {"sales": str(tmp_path / "nowhere.parquet")}, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="identifier"):
        scad.write_stage_dag(SQL, {"bad name": paths["sales"]}, str(tmp_path / "b"))
    with pytest.raises(scad.QueryError):
        scad.write_stage_dag("SELECT nothing FROM sales", {"sales": paths["sales"]}, str(tmp_path / "c"))
    with pytest.raises(ValueError, match="budget"):
        scad.write_stage_dag(SQL, paths, str(tmp_path / "d"), budget=0)
    assert not any((tmp_path / d).exists() for d in "abcd")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        scad.write_stage_dag(SQL, paths, str(tmp_path / "full"))
    r = run_cli("query-dag", str(tmp_path / "e"), "--sql", str(tmp_path / "nowhere.sql"),
                "--table", "sales")
    assert r.returncode == 2 and "NAME=PARQUET" in r.stderr


def test_the_cli_writes_a_dag_and_a_failing_stage_fails_the_run(tmp_path):
    paths = write_tables(tmp_path)
    sql = tmp_path / "q.sql"
    sql.write_text("SELECT s.item, i.cat FROM sales s JOIN items i ON s.item = i.item WHERE s.qty = 3")
    dag = tmp_path / "dag"
    r = run_cli("query-dag", str(dag), "--sql", str(sql), "--table", f"sales={paths['sales']}",
                "--table", f"items={paths['items']}", "--budget", "2M", "--memory", "256M")
    assert r.returncode == 0, r.stderr
    assert "stage_0" in r.stdout
    # The query text changes after the DAG was written: the stages' plans no longer
    # match it, and the run fails naming the element.
    (dag / "query.sql").write_text("SELECT count(*) FROM no_such_table")
    r = run_cli("run", str(dag), "-d", str(tmp_path / "out"), "-q", timeout=300)
    assert r.returncode != 0
    assert "stage_0" in (r.stdout + r.stderr)
