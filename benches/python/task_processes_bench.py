"""TPC-DS run distributed as task processes (``tpcds-main --stage-processes``: every
task of every stage a process of its own, at most W at once) against the same engine
in one process, in the same run.

Runs the main job once in one process, then once per worker count of ``--workers``
(default 1, 2, 4), each over fresh embedded memory servers with the same budget, and
writes per query and mode: time, tasks, bytes handed between stages through memory
elements (shuffle), whether the answer equals DuckDB's. JSON lines to ``--json``, a
Markdown table to ``--md`` (default ``benches/results/task_processes.{jsonl,md}``)::

    cargo build --release -p scad-tpcds --bin tpcds-main
    .venv/bin/python benches/python/task_processes_bench.py --sf 1

On a machine with fewer cores than workers more workers cannot be faster: the table
shows the overhead of running every task as a process (starting it, connecting,
re-planning the query) against the work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def default_binary() -> str:
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "release", "tpcds-main")


def run(binary: str, sf: str, queries: str, extra: List[str], out: str) -> List[Dict]:
    args = [binary, "--sf", sf, "--duckdb-repeats", "0", "--json", out, *extra]
    if queries:
        args += ["--queries", queries]
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "RUST_BACKTRACE": "0"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with open(out, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=default_binary(), help="the release tpcds-main")
    p.add_argument("--sf", default="1")
    p.add_argument("--queries", default="", help="e.g. 1,16,94 (default all 99)")
    p.add_argument("--workers", default="1,2,4", help="worker counts to run")
    p.add_argument("--json", default=os.path.join(REPO, "benches", "results", "task_processes.jsonl"))
    p.add_argument("--md", default=os.path.join(REPO, "benches", "results", "task_processes.md"))
    a = p.parse_args()
    if not os.path.exists(a.binary):
        print(f"no {a.binary}: cargo build --release -p scad-tpcds --bin tpcds-main", file=sys.stderr)
        return 2
    workers = [int(w) for w in a.workers.split(",") if w]
    tmp = a.json + ".part"
    modes = {"one process": run(a.binary, a.sf, a.queries, [], tmp)}
    for w in workers:
        modes[f"{w} worker(s)"] = run(a.binary, a.sf, a.queries, ["--stage-processes", "--workers", str(w)], tmp)
    os.remove(tmp)

    with open(a.json, "w", encoding="utf-8") as f:
        for mode, lines in modes.items():
            for line in lines:
                f.write(json.dumps({"mode": mode, **line}) + "\n")
    base = {l["name"]: l for l in modes["one process"]}
    names = [l["name"] for l in modes["one process"]]
    total = {m: sum(l["secs"] for l in ls) for m, ls in modes.items()}
    equal = {m: sum(1 for l in ls if l["equal"]) for m, ls in modes.items()}
    out = [f"TPC-DS SF {a.sf}, {len(names)} queries, budget {mib(modes['one process'][0]['budget'])} MiB "
           "per query (one process) or per task; every task a process of its own.", "",
           "| mode | total | vs one process | tasks | shuffled through memory elements | equal DuckDB |",
           "|---|---:|---:|---:|---:|---:|"]
    for m, ls in modes.items():
        tasks = sum(l.get("tasks") or 0 for l in ls)
        shuffle = sum(l.get("handoff_bytes") or 0 for l in ls)
        out.append(f"| {m} | {total[m]:.1f} s | {total[m] / total['one process']:.2f}x | {tasks or '-'} | "
                   f"{mib(shuffle) + ' MiB' if shuffle else '-'} | {equal[m]}/{len(ls)} |")
    out += ["", "| query | one process | " + " | ".join(m for m in modes if m != "one process") + " | tasks |",
            "|---|---:|" + "---:|" * (len(modes) - 1) + "---:|"]
    by_mode = {m: {l["name"]: l for l in ls} for m, ls in modes.items()}
    for n in names:
        cells = [f"{by_mode[m][n]['secs']:.3f}" for m in modes if m != "one process"]
        tasks = next((by_mode[m][n].get("tasks") for m in modes if m != "one process"), None)
        out.append(f"| {n} | {base[n]['secs']:.3f} | " + " | ".join(cells) + f" | {tasks or '-'} |")
    text = "\n".join(out) + "\n"
    with open(a.md, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0 if all(v == len(names) for v in equal.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
