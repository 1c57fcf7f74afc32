"""Element files and DAGs.

A compute element ``<name>.o.py`` starts with ``#@ <yaml>`` lines (``type: compute``,
``parents``, ``dependents``, ``corunning``, ``parallelism``, ``limits``) and defines
``main(params, action)``; a memory element ``<name>.o.yaml`` is YAML (``type: memory``,
``corunning``, ``limits: {mem: 512 MB}``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml

from . import _native

__all__ = ["ElementError", "DagError", "Element", "parse_element", "Dag", "load_dag"]

#: Memory of a memory element that names no ``limits.mem`` (or is implied by corunning).
DEFAULT_MEMORY = 1 << 30


class ElementError(ValueError):
    """A malformed element file."""


class DagError(ValueError):
    """An inconsistent DAG (cycle, missing parent or dependent, bad corunning)."""


@dataclass
class Element:
    """One element of a DAG."""

    name: str
    kind: str  # "compute" or "memory"
    path: Optional[str]
    parents: List[str] = field(default_factory=list)
    dependents: List[str] = field(default_factory=list)
    corunning: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    parallelism: int = 1
    limits: Dict[str, Any] = field(default_factory=dict)
    meta: Dict[str, Any] = field(default_factory=dict)
    implied: bool = False

    @property
    def memory_bytes(self) -> int:
        mem = self.limits.get("mem")
        if mem is None:
            return DEFAULT_MEMORY
        if isinstance(mem, int):
            # Bare numbers in limits are megabytes, as in OpenWhisk.
            return mem << 20
        try:
            return _native.parse_size(str(mem))
        except ValueError as e:
            raise ElementError(f"{self.path}: limits.mem {mem!r}: {e}") from None

    def transport_of(self, memory: str) -> str:
        """The transport name this compute element uses for memory element ``memory``."""
        spec = self.corunning.get(memory) or {}
        return str(spec.get("trans", memory))


def element_name(path: str) -> str:
    base = os.path.basename(path)
    for ext in (".o.py", ".o.yaml", ".o.yml"):
        if base.endswith(ext):
            return base[: -len(ext)]
    raise ElementError(f"{path}: element files are named <name>.o.py or <name>.o.yaml")


def _names(v: Any, what: str, path: str) -> List[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return list(v)
    raise ElementError(f"{path}: {what} must be a list of element names, not {v!r}")


def _header(path: str) -> Dict[str, Any]:
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#@"):
                lines.append(line[2:].rstrip("\n"))
            elif lines or (line.strip() and not line.startswith("#")):
                break
    if not lines:
        raise ElementError(f"{path}: a compute element must begin with '#@ <yaml>' header lines")
    text = "\n".join(l[1:] if l.startswith(" ") else l for l in lines)
    try:
        meta = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ElementError(f"{path}: malformed '#@' header: {e}") from None
    if not isinstance(meta, dict):
        raise ElementError(f"{path}: the '#@' header must be a YAML mapping, not {type(meta).__name__}")
    return meta


def parse_element(path: str) -> Element:
    """Reads one element file."""
    name = element_name(path)
    if path.endswith(".o.py"):
        meta = _header(path)
        expect = "compute"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                meta = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ElementError(f"{path}: malformed YAML: {e}") from None
        if not isinstance(meta, dict):
            raise ElementError(f"{path}: a memory element must be a YAML mapping")
        expect = "memory"
    kind = meta.get("type", expect)
    if kind != expect:
        raise ElementError(f"{path}: type {kind!r} does not fit the file (expected {expect!r})")
    cor = meta.get("corunning") or {}
    if isinstance(cor, list):
        cor = {str(c): {} for c in cor}
    if not isinstance(cor, dict):
        raise ElementError(f"{path}: corunning must be a mapping or list, not {cor!r}")
    cor = {str(k): (v if isinstance(v, dict) else {}) for k, v in cor.items()}
    par = meta.get("parallelism", 1)
    if not isinstance(par, int) or par < 1:
        raise ElementError(f"{path}: parallelism must be a positive integer, not {par!r}")
    limits = meta.get("limits") or {}
    if not isinstance(limits, dict):
        raise ElementError(f"{path}: limits must be a mapping, not {limits!r}")
    e = Element(name=name, kind=kind, path=os.path.abspath(path),
                parents=_names(meta.get("parents"), "parents", path),
                dependents=_names(meta.get("dependents"), "dependents", path),
                corunning=cor, parallelism=par, limits=limits, meta=meta)
    if kind == "memory":
        e.memory_bytes  # validate now
    return e


@dataclass
class Dag:
    """A validated DAG."""

    directory: str
    elements: Dict[str, Element]
    order: List[str]  # compute elements, parents before children

    @property
    def compute(self) -> List[Element]:
        return [self.elements[n] for n in self.order]

    @property
    def memory(self) -> List[Element]:
        return [e for e in self.elements.values() if e.kind == "memory"]

    def parents_of(self, name: str) -> List[str]:
        return self._parents[name]

    _parents: Dict[str, List[str]] = field(default_factory=dict)


def load_dag(directory: str) -> Dag:
    """Reads and checks every element of ``directory``: raises :class:`DagError` for
    a cycle, a missing parent or dependent, or a corunning name that is not a memory
    element (memory elements named only in ``corunning`` are implied)."""
    if not os.path.isdir(directory):
        raise DagError(f"{directory}: not a directory")
    elements: Dict[str, Element] = {}
    for f in sorted(os.listdir(directory)):
        if f.endswith((".o.py", ".o.yaml", ".o.yml")):
            e = parse_element(os.path.join(directory, f))
            if e.name in elements:
                raise DagError(f"element {e.name!r} is defined twice in {directory}")
            elements[e.name] = e
    if not any(e.kind == "compute" for e in elements.values()):
        raise DagError(f"{directory}: no compute elements (*.o.py)")
    for e in list(elements.values()):
        if e.kind != "compute":
            continue
        for m in e.corunning:
            if m not in elements:
                elements[m] = Element(name=m, kind="memory", path=None, implied=True)
            elif elements[m].kind != "memory":
                raise DagError(f"{e.name}: corunning element {m!r} is not a memory element")
    parents: Dict[str, List[str]] = {n: [] for n, e in elements.items() if e.kind == "compute"}
    for e in elements.values():
        if e.kind != "compute":
            continue
        for p in e.parents:
            if p not in elements:
                raise DagError(f"{e.name}: parent {p!r} does not exist in {directory}")
            if elements[p].kind != "compute":
                raise DagError(f"{e.name}: parent {p!r} is a memory element")
            if p not in parents[e.name]:
                parents[e.name].append(p)
        for d in e.dependents:
            if d not in elements:
                raise DagError(f"{e.name}: dependent {d!r} does not exist in {directory}")
            if elements[d].kind != "compute":
                raise DagError(f"{e.name}: dependent {d!r} is a memory element")
            if e.name not in parents[d]:
                parents[d].append(e.name)
    order: List[str] = []
    state: Dict[str, int] = {}

    def visit(n: str, path: List[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            cycle = path[path.index(n):] + [n]
            raise DagError(f"the DAG has a cycle: {' -> '.join(cycle)}")
        state[n] = 1
        for p in parents[n]:
            visit(p, path + [n])
        state[n] = 2
        order.append(n)

    for n in sorted(parents):
        visit(n, [])
    return Dag(directory=os.path.abspath(directory), elements=elements, order=order, _parents=parents)
