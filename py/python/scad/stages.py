"""A query as an element DAG: :func:`write_stage_dag` writes a directory that
``scad run`` executes, the tasks of each stage of the query's plan
(:meth:`scad.QuerySession.stages`) as the parallel instances of one compute element,
handing frames on through one memory element.

The DAG follows the plan::

    load -> stage_i (parallelism: its tasks) -> ... -> stage_root -> answer

``load`` reads the Parquet files into RemoteFrames in the memory element; every
instance of a stage element plans the same SQL over the same tables with the same
budget and partitions, runs its task of the stage from the outputs of the stages it
reads (its parents) and hands its share of the stage's output on. Stages whose inputs
are ready run at the same time, and so do the tasks of a stage: each task allocates
only in its own region of the memory element (the space above the tables cut into one
equal slot per task of the query), so none overwrites another and no allocator is
shared. ``answer`` returns the answer (``columns`` and ``rows``); the stage outputs go
with the memory element at the end of the run::

    import scad
    scad.write_stage_dag("SELECT ...", {"sales": "sales.parquet"}, "dag/", budget=64 << 20)
    # then: scad run dag/   (or scad run dag/ --ray)

or ``scad query-dag --sql query.sql --table sales=sales.parquet dag/``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Optional

__all__ = ["write_stage_dag"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_MEMORY = """type: memory
corunning: [{elements}]
limits:
  mem: {mem_mb} MB
"""

_HEADER = """#@ type: compute
#@ parents: [{parents}]
#@ parallelism: {tasks}
#@ corunning:
#@   mem:
#@     trans: mem
#@     type: rdma
"""

_LOAD = '''#@ type: compute
#@ corunning:
#@   mem:
#@     trans: mem
#@     type: rdma
"""Loads the query's tables (Parquet files, see dag.json) into memory element mem."""
import json
import os

import pyarrow.parquet as pq

import scad

HERE = os.path.dirname(os.path.abspath(__file__))


def main(params, action):
    with open(os.path.join(HERE, "dag.json"), encoding="utf-8") as f:
        dag = json.load(f)
    store = scad.Store()
    store.add_transport("mem", action.get_transport("mem", "rdma"))
    env = scad.FrameEnv(store, chunk_rows=dag["chunk_rows"])
    tables = {}
    for name, path in dag["tables"].items():
        tables[name] = scad.RemoteFrame.from_arrow(env, pq.read_table(path)).meta
    return {"tables": tables, "alloc": store.allocation_state()}
'''

_STAGE = '''"""Stage {stage} of the query in query.sql: {operator}"""
import json
import os

import scad

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE = {stage}
INPUTS = {inputs}
FIRST_SLOT = {first_slot}


def region(loaded, slot, slots):
    """Slot `slot` of `slots` equal slots of the memory above the tables."""
    allocators = []
    for a in json.loads(loaded)["allocators"]:
        base = -(-a["next"] // (1 << 20)) << 20
        size = ((a["end"] - base) // slots) & ~4095
        lo = base + slot * size
        allocators.append({{"element": a["element"], "start": lo, "end": lo + size, "align": a["align"],
                            "next": lo, "free": []}})
    return json.dumps({{"allocators": allocators}})


def main(params, action):
    with open(os.path.join(HERE, "dag.json"), encoding="utf-8") as f:
        dag = json.load(f)
    with open(os.path.join(HERE, "query.sql"), encoding="utf-8") as f:
        sql = f.read()
    task = int(os.environ.get("__OW_PAR", "0"))
    load = params["load"]
    store = scad.Store()
    store.add_transport("mem", action.get_transport("mem", "rdma"))
    store.resume_allocation(region(load["alloc"], FIRST_SLOT + task, dag["slots"]))
    env = scad.FrameEnv(store, budget=dag["budget"], chunk_rows=dag["chunk_rows"])
    session = scad.QuerySession(env, partitions=dag["partitions"])
    for name, meta in load["tables"].items():
        session.register(name, scad.RemoteFrame.from_meta(env, meta))
    plan = session.stages(sql)
    if plan != dag["plan"]:
        raise RuntimeError("the query plans differently here than when the DAG was written")
    inputs = {{}}
    for i in INPUTS:
        outs = params[f"stage_{{i}}"]
        outs = outs if isinstance(outs, list) else [outs]
        parts = [[] for _ in range(dag["plan"]["stages"][i]["partitions"])]
        for out in outs:
            for q, metas in enumerate(out["outputs"]):
                parts[q].extend(metas)
        inputs[i] = parts
    outputs, stats = session.run_stage_task(sql, STAGE, task, inputs)
    return {{"stage": STAGE, "task": task, "outputs": outputs, "stats": stats}}
'''

_ANSWER = '''#@ type: compute
#@ parents: [stage_{root}]
#@ corunning:
#@   mem:
#@     trans: mem
#@     type: rdma
"""The answer of the query in query.sql: the output of its last stage."""
import json
import os

import pyarrow as pa

import scad

HERE = os.path.dirname(os.path.abspath(__file__))


def main(params, action):
    with open(os.path.join(HERE, "dag.json"), encoding="utf-8") as f:
        dag = json.load(f)
    store = scad.Store()
    store.add_transport("mem", action.get_transport("mem", "rdma"))
    env = scad.FrameEnv(store, chunk_rows=dag["chunk_rows"])
    outs = params["stage_{root}"]
    outs = outs if isinstance(outs, list) else [outs]
    partitions = dag["plan"]["stages"][-1]["partitions"]
    parts = [scad.RemoteFrame.from_meta(env, m).to_arrow()
             for q in range(partitions) for out in outs for m in out["outputs"][q]]
    answer = pa.concat_tables(parts) if parts else None
    columns = dag["plan"]["stages"][-1]["columns"]
    return {{"columns": answer.column_names if answer is not None else columns,
            "rows": answer.to_pylist() if answer is not None else [],
            "ordered": dag["plan"]["ordered"], "stages": len(dag["plan"]["stages"]),
            "tasks": sum(s["tasks"] for s in dag["plan"]["stages"])}}
'''


def write_stage_dag(sql: str, tables: Dict[str, str], out_dir: str, budget: Optional[int] = None,
                    memory_mb: int = 1024, chunk_rows: Optional[int] = None,
                    partitions: int = 2) -> Dict[str, Any]:
    """Writes ``sql`` over ``tables`` (table name -> Parquet file) as an element DAG
    in ``out_dir`` for ``scad run``: a memory element of ``memory_mb`` MB, a ``load``
    element, one element per stage with one instance per task of the stage, each task
    within ``budget`` bytes of local memory (None: unlimited), and an ``answer``
    element. Plans use ``partitions`` partitions (so a stage has up to that many
    tasks). Plans the query here (the tables loaded into a local memory element) to
    learn its stages; returns that plan.

    Raises ``ValueError`` for a bad table name, budget or partitions,
    ``FileNotFoundError`` for a missing file, and the query's own errors
    (``scad.QueryError``...) for SQL that cannot be planned. ``out_dir`` must be empty
    or absent.
    """
    import pyarrow.parquet as pq

    from . import _native
    from .array import Store
    from .frame import FrameEnv, RemoteFrame
    from .query import QuerySession

    if not tables:
        raise ValueError("a query DAG needs at least one table")
    paths = {}
    for name, path in tables.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"table name {name!r} is not an identifier")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"table {name}: no file {path}")
        paths[name] = os.path.abspath(path)
    if budget is not None and budget <= 0:
        raise ValueError(f"budget must be positive bytes, got {budget}")
    if memory_mb <= 0:
        raise ValueError(f"memory_mb must be positive, got {memory_mb}")
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} is not empty")

    # Plan over the real tables in a local memory element, as the stages will.
    server = _native.MemoryServer(memory_mb << 20, "127.0.0.1:0", None)
    try:
        store = Store({"mem": server.url})
        env = FrameEnv(store, budget=budget, chunk_rows=chunk_rows)
        session = QuerySession(env, partitions=partitions)
        for name, path in paths.items():
            session.register(name, RemoteFrame.from_arrow(env, pq.read_table(path)))
        plan = session.stages(sql)
    finally:
        server.shutdown()

    stages = plan["stages"]
    slots = sum(s["tasks"] for s in stages)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "query.sql"), "w", encoding="utf-8") as f:
        f.write(sql)
    with open(os.path.join(out_dir, "dag.json"), "w", encoding="utf-8") as f:
        json.dump({"tables": paths, "budget": budget, "chunk_rows": chunk_rows, "partitions": partitions,
                   "slots": slots, "plan": plan}, f, indent=1)
    names = ["load"] + [f"stage_{s['id']}" for s in stages] + ["answer"]
    with open(os.path.join(out_dir, "mem.o.yaml"), "w", encoding="utf-8") as f:
        f.write(_MEMORY.format(elements=", ".join(names), mem_mb=memory_mb))
    with open(os.path.join(out_dir, "load.o.py"), "w", encoding="utf-8") as f:
        f.write(_LOAD)
    first_slot = 0
    for s in stages:
        parents = ", ".join(["load"] + [f"stage_{i}" for i in s["inputs"]])
        text = _HEADER.format(parents=parents, tasks=s["tasks"]) + _STAGE.format(
            stage=s["id"], inputs=list(s["inputs"]), first_slot=first_slot,
            operator=s["operator"].replace('"""', "'''")[:200])
        first_slot += s["tasks"]
        with open(os.path.join(out_dir, f"stage_{s['id']}.o.py"), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(out_dir, "answer.o.py"), "w", encoding="utf-8") as f:
        f.write(_ANSWER.format(root=stages[-1]["id"]))
    return plan
