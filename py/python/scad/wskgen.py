"""``wskgen``: a DAG directory as the JSON the Scad OpenWhisk deployment takes."""

from __future__ import annotations

import os
from typing import Any, Dict

from .dag import Dag, Element, load_dag

__all__ = ["generate"]


def _mb(value: Any, default: int) -> int:
    from . import _native

    if value is None:
        return default
    if isinstance(value, int):
        return value
    return max(1, _native.parse_size(str(value)) >> 20)


def _object(dag: Dag, e: Element) -> Dict[str, Any]:
    code = ""
    if e.path is not None and e.kind == "compute":
        with open(e.path, encoding="utf-8") as f:
            code = f.read()
    corunning = list(e.corunning)
    if e.kind == "memory":
        corunning = sorted({c.name for c in dag.compute if e.name in c.corunning} | set(e.corunning))
    dependents = sorted(c.name for c in dag.compute if e.name in dag.parents_of(c.name)) if e.kind == "compute" else []
    parents = list(dag.parents_of(e.name)) if e.kind == "compute" else []
    porus: Dict[str, Any] = {
        "relationships": {"corunning": corunning, "dependents": dependents, "parents": parents},
        "runtimeType": e.kind,
        "withMerged": [],
    }
    if e.kind == "compute" and e.parallelism > 1:
        porus["parallelism"] = e.parallelism
    lim = e.limits
    return {
        "name": e.name,
        "exec": {"kind": "python:3", "code": code, "binary": False, "main": "main"},
        "limits": {
            "concurrency": 1,
            "logs": 10,
            "resources": {"cpu": lim.get("cpu", 1), "mem": _mb(lim.get("mem"), 1024 if e.kind == "memory" else 512),
                          "storage": _mb(lim.get("storage"), 512)},
            "timeout": 300000,
        },
        "porusParams": porus,
    }


def generate(directory: str, name: str = "") -> Dict[str, Any]:
    """The deployment JSON of the DAG in ``directory`` (checked as ``scad run`` does)."""
    dag = load_dag(directory)
    objects = [_object(dag, dag.elements[n]) for n in dag.order] + [_object(dag, m) for m in dag.memory]
    fname = name or os.path.basename(os.path.abspath(directory))
    return {"functions": [{"name": fname, "objects": objects, "publish": True}], "publish": True}
