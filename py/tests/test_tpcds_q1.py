"""TPC-DS query 1 as an element DAG (examples/dags/tpcds-q1: disaggrt remote arrays and
npjoin joins over the |-delimited text tables) against DuckDB's reference answer."""
import json
import os

from conftest import DAGS, run_cli


def reference_ids(d):
    import duckdb

    path = os.path.join(d, "reference", "q1.parquet")
    return [row[0] for row in duckdb.sql(f"SELECT c_customer_id FROM read_parquet('{path}')").fetchall()]


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_q1_dag_matches_duckdb(tpcds_dir, tmp_path):
    r = run_cli("run", os.path.join(DAGS, "tpcds-q1"), "-d", str(tmp_path), "-q",
                "--json", str(tmp_path / "report.json"), env={"SCAD_TPCDS_DIR": tpcds_dir}, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    answer = read_json(tmp_path / "rundisagg.answer.json")
    expected = reference_ids(tpcds_dir)
    assert len(expected) > 0
    assert answer["c_customer_id"] == expected  # same rows, same order
    assert answer["matches_reference"] is True
    # Both ctr instances did part of the grouping.
    outs = [read_json(tmp_path / f"rundisagg.ctr@{i}.json") for i in range(2)]
    assert all(o["groups"] > 0 for o in outs)
    assert sum(o["groups"] for o in outs) == answer["groups"]


def test_q1_dag_reports_missing_data(tmp_path):
    r = run_cli("run", os.path.join(DAGS, "tpcds-q1"), "-d", str(tmp_path), "-q",
                env={"SCAD_TPCDS_DIR": str(tmp_path / "nowhere")}, timeout=120)
    assert r.returncode != 0
    assert "gen_data.py" in (r.stdout + r.stderr)
