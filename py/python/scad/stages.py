"""A query as an element DAG: :func:`write_stage_dag` writes a directory that
``scad run`` executes, one compute element per stage of the query's plan
(:meth:`scad.QuerySession.stages`), handing frames on through one memory element.

The DAG is a chain::

    load -> stage_0 -> stage_1 -> ... -> stage_N (the answer)

``load`` reads the Parquet files into RemoteFrames in the memory element; each stage
element plans the same SQL over the same tables with the same budget, runs its stage
from the outputs of the stages it reads (every earlier output is passed down the
chain) and hands its own on. The chain runs one stage at a time, each resuming the
allocation state of the element before it, so no two elements allocate the same
memory. The last element returns the answer (``columns`` and ``rows``) and frees every
stage output::

    import scad
    scad.write_stage_dag("SELECT ...", {"sales": "sales.parquet"}, "dag/", budget=64 << 20)
    # then: scad run dag/

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
#@ parents: [{parent}]
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
    return {"tables": tables, "outputs": {}, "alloc": store.allocation_state()}
'''

_STAGE = '''"""Stage {stage} of the query in query.sql: {operator}"""
import json
import os

import scad

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE = {stage}
PARENT = "{parent}"
LAST = {last}


def main(params, action):
    with open(os.path.join(HERE, "dag.json"), encoding="utf-8") as f:
        dag = json.load(f)
    with open(os.path.join(HERE, "query.sql"), encoding="utf-8") as f:
        sql = f.read()
    state = params[PARENT]
    store = scad.Store()
    store.add_transport("mem", action.get_transport("mem", "rdma"))
    store.resume_allocation(state["alloc"])
    env = scad.FrameEnv(store, budget=dag["budget"], chunk_rows=dag["chunk_rows"])
    session = scad.QuerySession(env)
    for name, meta in state["tables"].items():
        session.register(name, scad.RemoteFrame.from_meta(env, meta))
    plan = session.stages(sql)
    if len(plan["stages"]) != dag["stages"]:
        raise RuntimeError(f"the plan has {{len(plan['stages'])}} stages here, {{dag['stages']}} when the DAG was written")
    wanted = plan["stages"][STAGE]["inputs"]
    inputs = {{i: state["outputs"][str(i)] for i in wanted}}
    metas, stats = session.run_stage(sql, STAGE, inputs)
    outputs = dict(state["outputs"])
    outputs[str(STAGE)] = metas
    if not LAST:
        return {{"tables": state["tables"], "outputs": outputs, "alloc": store.allocation_state(),
                "stage": STAGE, "stats": stats}}
    import pyarrow as pa

    parts = [scad.RemoteFrame.from_meta(env, m).to_arrow() for m in metas]
    answer = pa.concat_tables(parts) if parts else None
    for frames in outputs.values():
        for m in frames:
            scad.RemoteFrame.from_meta(env, m).free()
    return {{"columns": answer.column_names if answer is not None else [],
            "rows": answer.to_pylist() if answer is not None else [],
            "ordered": plan["ordered"], "stages": len(plan["stages"]), "stats": stats}}
'''


def write_stage_dag(sql: str, tables: Dict[str, str], out_dir: str, budget: Optional[int] = None,
                    memory_mb: int = 1024, chunk_rows: Optional[int] = None) -> Dict[str, Any]:
    """Writes ``sql`` over ``tables`` (table name -> Parquet file) as an element DAG
    in ``out_dir`` for ``scad run``: a memory element of ``memory_mb`` MB, a ``load``
    element and one element per stage, each stage within ``budget`` bytes of local
    memory (None: unlimited). Plans the query here (in memory, nothing is loaded but
    the Parquet schemas and sizes) to learn its stages; returns that plan.

    Raises ``ValueError`` for a bad table name, ``FileNotFoundError`` for a missing
    file, and the query's own errors (``scad.QueryError``...) for SQL that cannot be
    planned. ``out_dir`` must be empty or absent.
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
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} is not empty")

    # Plan over the real tables in a local memory element, as the stages will.
    server = _native.MemoryServer(memory_mb << 20, "127.0.0.1:0", None)
    try:
        store = Store({"mem": server.url})
        env = FrameEnv(store, budget=budget, chunk_rows=chunk_rows)
        session = QuerySession(env)
        for name, path in paths.items():
            session.register(name, RemoteFrame.from_arrow(env, pq.read_table(path)))
        plan = session.stages(sql)
    finally:
        server.shutdown()

    stages = plan["stages"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "query.sql"), "w", encoding="utf-8") as f:
        f.write(sql)
    with open(os.path.join(out_dir, "dag.json"), "w", encoding="utf-8") as f:
        json.dump({"tables": paths, "budget": budget, "chunk_rows": chunk_rows, "stages": len(stages),
                   "plan": plan}, f, indent=1)
    names = ["load"] + [f"stage_{s['id']}" for s in stages]
    with open(os.path.join(out_dir, "mem.o.yaml"), "w", encoding="utf-8") as f:
        f.write(_MEMORY.format(elements=", ".join(names), mem_mb=memory_mb))
    with open(os.path.join(out_dir, "load.o.py"), "w", encoding="utf-8") as f:
        f.write(_LOAD)
    for k, s in enumerate(stages):
        parent = names[k]
        text = _HEADER.format(parent=parent) + _STAGE.format(
            stage=s["id"], parent=parent, last=k == len(stages) - 1,
            operator=s["operator"].replace('"""', "'''")[:200])
        with open(os.path.join(out_dir, f"stage_{s['id']}.o.py"), "w", encoding="utf-8") as f:
            f.write(text)
    return plan
