"""TPC-DS across a Ray cluster (``scad.DistributedSession``) against the same engine in
one process.

For each node count of ``--nodes`` (default 1, 2, 4) a local Ray cluster of that many
nodes of one CPU each (``ray.cluster_utils.Cluster``: on one machine the nodes share
its cores) runs every query of ``--queries`` distributed: every stage as partition
tasks, memory elements as actors, one per node. The baseline, in the same run: one
``scad.QuerySession`` in this process over one in-process memory server, with the same
budget, chunk rows and target partitions. Each answer is checked against DuckDB's
reference (``tpcds_compare``); a query is timed once after loading (planning included,
loading not).

Per query and mode: wall time; for distributed runs also tasks, stages, shuffle bytes
(bytes written by every task but the root's), and the time split: compute (the tasks'
in-engine time, summed; it includes each task's own planning of the query, which
``run_stage_task`` repeats in every task), scheduling (each task's wall time in its
worker minus its in-engine time: connecting, opening the tables, summed) and the
driver's share (planning and reading the answer). Writes JSON lines to ``--json`` and a
Markdown table to ``--md`` (default ``benches/results/distributed.{jsonl,md}``), and
prints the table::

    .venv/bin/python benches/python/distributed_bench.py --data data/tpcds/sf1
    .venv/bin/python benches/python/distributed_bench.py --data data/tpcds/sf0.01-wh5 --queries 1-10 --nodes 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any, Dict, List, Optional

import scad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpcds_compare  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def parse_queries(text: str) -> List[int]:
    out: List[int] = []
    for part in text.split(","):
        part = part.strip().removeprefix("q")
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    bad = [n for n in out if not 1 <= n <= 99]
    if bad:
        raise ValueError(f"TPC-DS queries are 1..99, got {bad}")
    return out


def check(data: str, n: int, table: Any, ordered: bool) -> Optional[str]:
    return tpcds_compare.compare(table, tpcds_compare.reference(data, n), ordered)


def run_local(args: argparse.Namespace, queries: List[int], log) -> List[Dict[str, Any]]:
    """The baseline: one process, one in-process memory server."""
    import pyarrow.parquet as pq

    server = scad.MemoryServer(1 << 40, "127.0.0.1:0")
    rows = []
    try:
        store = scad.Store({"mem0": server.url})
        env = scad.FrameEnv(store, budget=args.budget, chunk_rows=args.chunk_rows)
        t = time.perf_counter()
        tables = {name: scad.RemoteFrame.from_arrow(env, pq.read_table(path))
                  for name, path in tpcds_compare.tables(args.data).items()}
        load_s = time.perf_counter() - t
        session = scad.QuerySession(env, partitions=args.partitions, **tables)
        for n in queries:
            row: Dict[str, Any] = {"mode": "local", "nodes": 0, "query": n, "load_s": load_s}
            sql = tpcds_compare.query_text(args.data, n)
            t = time.perf_counter()
            try:
                r = session.sql(sql)
                row["secs"] = time.perf_counter() - t
                row["compute_s"] = r.stats["elapsed_s"]
                row["rows"] = r.rows
                row["error"] = check(args.data, n, r.to_arrow(), r.ordered) if args.check else None
            except Exception as exc:  # noqa: BLE001 - a failure is a result here
                row.update(secs=time.perf_counter() - t, error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            log(row)
    finally:
        server.shutdown()
    return rows


def run_ray(args: argparse.Namespace, nodes: int, queries: List[int], log) -> List[Dict[str, Any]]:
    """A local Ray cluster of ``nodes`` one-CPU nodes."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    rows = []
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False, include_dashboard=False, configure_logging=False)
        t = time.perf_counter()
        with scad.DistributedSession(tpcds_compare.tables(args.data), budget=args.budget,
                                     partitions=args.partitions, chunk_rows=args.chunk_rows,
                                     task_timeout=args.task_timeout) as ds:
            load_s = time.perf_counter() - t
            for n in queries:
                row: Dict[str, Any] = {"mode": "ray", "nodes": nodes, "query": n, "load_s": load_s,
                                       "partitions": ds.partitions}
                sql = tpcds_compare.query_text(args.data, n)
                t = time.perf_counter()
                try:
                    r = ds.sql(sql)
                    row["secs"] = time.perf_counter() - t
                    s = r.stats
                    scheduling = sum(max(0.0, (k["end"] - k["start"]) - k["stats"].get("elapsed_s", 0.0))
                                     for k in r.tasks)
                    row.update(rows=s["rows"], tasks=s["tasks"], stages=s["stages"],
                               shuffle_bytes=s["shuffle_bytes"], compute_s=s["compute_s"],
                               scheduling_s=scheduling, driver_s=s["plan_s"] + s["read_s"],
                               spill_files=s["spill_files"], peak_local_bytes=s["peak_local_bytes"],
                               nodes_used=s["nodes"],
                               element_bytes_written=sum(e["bytes_written"] for e in s["elements"].values()))
                    row["error"] = check(args.data, n, r.table, r.ordered) if args.check else None
                except Exception as exc:  # noqa: BLE001 - a failure is a result here
                    row.update(secs=time.perf_counter() - t, error=f"{type(exc).__name__}: {exc}")
                rows.append(row)
                log(row)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    return rows


def geomean(xs: List[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def markdown(args: argparse.Namespace, results: List[Dict[str, Any]], node_counts: List[int],
             queries: List[int]) -> str:
    local = {r["query"]: r for r in results if r["mode"] == "local"}
    ray_runs = {(r["nodes"], r["query"]): r for r in results if r["mode"] == "ray"}
    ok = lambda r: r is not None and r.get("error") is None  # noqa: E731
    lines = [
        "# TPC-DS across a Ray cluster",
        "",
        f"`.venv/bin/python benches/python/distributed_bench.py --data {os.path.relpath(args.data, REPO)} "
        f"--queries {args.queries} --nodes {args.nodes}` — budget "
        f"{'unlimited' if args.budget is None else f'{args.budget >> 20} MiB'} per task, chunk rows "
        f"{args.chunk_rows}; local Ray clusters of N one-CPU nodes on this machine "
        f"({os.cpu_count()} cores, {platform.machine()}), memory elements one per node; baseline: the same "
        "engine in one process over one in-process memory server, same budget. One timed run per query "
        "(planning included, loading not). Scheduling = each task's wall time in its worker minus its "
        "in-engine time, summed; compute = in-engine time (with the task's own planning of the query), "
        f"summed. Load average at the end: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "| mode | queries equal | total s | geomean vs local | compute s | scheduling s | driver s | "
        "tasks | shuffle MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.append(f"| one process | {sum(ok(local.get(q)) for q in queries)}/{len(queries)} | "
                 f"{sum(local[q]['secs'] for q in queries if q in local):.2f} | 1.00x | "
                 f"{sum(local[q].get('compute_s', 0) for q in queries if q in local):.2f} |  |  |  |  |")
    for k in node_counts:
        rs = [ray_runs[(k, q)] for q in queries if (k, q) in ray_runs]
        ratios = [r["secs"] / local[r["query"]]["secs"] for r in rs
                  if ok(r) and ok(local.get(r["query"]))]
        lines.append(
            f"| Ray, {k} node{'s' if k > 1 else ''} | {sum(ok(r) for r in rs)}/{len(queries)} | "
            f"{sum(r['secs'] for r in rs):.2f} | {geomean(ratios):.2f}x | "
            f"{sum(r.get('compute_s', 0) for r in rs):.2f} | {sum(r.get('scheduling_s', 0) for r in rs):.2f} | "
            f"{sum(r.get('driver_s', 0) for r in rs):.2f} | {sum(r.get('tasks', 0) for r in rs)} | "
            f"{sum(r.get('shuffle_bytes', 0) for r in rs) / (1 << 20):.1f} |")
    lines += ["", "Per query (seconds; shuffle and tasks of the largest cluster):", "",
              "| query | one process | " + " | ".join(f"{k} node{'s' if k > 1 else ''}" for k in node_counts)
              + " | tasks | shuffle KiB | errors |",
              "|---|---:|" + "---:|" * len(node_counts) + "---:|---:|---|"]
    last = node_counts[-1] if node_counts else None
    for q in queries:
        cells = [f"q{q}", f"{local[q]['secs']:.3f}" if q in local else ""]
        errors = []
        if q in local and local[q].get("error"):
            errors.append(f"local: {local[q]['error'][:80]}")
        for k in node_counts:
            r = ray_runs.get((k, q))
            cells.append(f"{r['secs']:.3f}" if r else "")
            if r and r.get("error"):
                errors.append(f"{k}: {r['error'][:80]}")
        big = ray_runs.get((last, q)) or {}
        cells += [str(big.get("tasks", "")), f"{big.get('shuffle_bytes', 0) / 1024:.0f}",
                  "; ".join(e.replace("|", "/") for e in errors)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(REPO, "data", "tpcds", "sf1"),
                        help="a data set written by benches/tpcds/gen_data.py (default data/tpcds/sf1)")
    parser.add_argument("--queries", default="1-99", help="e.g. 1-99 or 1,16,94")
    parser.add_argument("--nodes", default="1,2,4", help="Ray node counts to run (one CPU each)")
    parser.add_argument("--budget", default="256M", help="local memory per task (and of the baseline); "
                        "'none' for unlimited")
    parser.add_argument("--partitions", type=int, default=None,
                        help="target partitions (default: the cluster's CPUs, at least 2; the baseline: the engine's)")
    parser.add_argument("--chunk-rows", type=int, default=4096)
    parser.add_argument("--task-timeout", type=float, default=600.0)
    parser.add_argument("--no-local", action="store_true", help="skip the one-process baseline")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the DuckDB comparison")
    parser.add_argument("--json", default=os.path.join(REPO, "benches", "results", "distributed.jsonl"))
    parser.add_argument("--md", default=os.path.join(REPO, "benches", "results", "distributed.md"))
    args = parser.parse_args(argv)
    args.data = os.path.abspath(args.data)
    if not os.path.exists(os.path.join(args.data, "manifest.json")):
        parser.error(f"{args.data}: no data set there (benches/tpcds/gen_data.py --sf 1 writes data/tpcds/sf1)")
    args.budget = None if args.budget.lower() in ("none", "unlimited") else scad.parse_size(args.budget)
    try:
        queries = parse_queries(args.queries)
        node_counts = [int(k) for k in args.nodes.split(",") if k.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    if any(k < 1 for k in node_counts):
        parser.error("--nodes: node counts are at least 1")

    def log(row: Dict[str, Any]) -> None:
        where = "local" if row["mode"] == "local" else f"ray x{row['nodes']}"
        status = "ok" if row.get("error") is None else f"ERROR {row['error'][:160]}"
        print(f"[{where}] q{row['query']}: {row['secs']:.3f} s {status}", file=sys.stderr, flush=True)

    common = {"data": os.path.relpath(args.data, REPO), "budget": args.budget, "chunk_rows": args.chunk_rows,
              "scad": scad.__version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    results: List[Dict[str, Any]] = []
    if not args.no_local:
        results += run_local(args, queries, log)
    for k in node_counts:
        results += run_ray(args, k, queries, log)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps({**common, **r}) + "\n")
    table = markdown(args, results, node_counts, queries)
    with open(args.md, "w", encoding="utf-8") as f:
        f.write(table)
    print(table)
    return 0 if all(r.get("error") is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
