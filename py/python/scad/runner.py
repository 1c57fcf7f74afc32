"""Running elements locally: one compute element against running memory servers
(``rundisagg``), or a whole DAG (``scad run``)."""

from __future__ import annotations

import glob
import importlib.util
import ipaddress
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _native
from .dag import Dag, Element, ElementError, load_dag, parse_element

__all__ = ["parse_memory_spec", "ParentOutput", "parent_params", "load_parent_outputs", "call_element",
           "write_outputs", "run_element", "run_dag", "DagRunError", "RunReport"]

_IMPLS = {"tcp": "rdma_tcp", "rdma": "rdma_uverbs", "uverbs": "rdma_uverbs", "local": "rdma_local",
          "shm": "rdma_shm"}


def parse_memory_spec(spec: str, host: str = "127.0.0.1") -> List[Tuple[str, str]]:
    """``[N@]NAME:PORT[:IMPL[:ARGS]]`` -> ``[(transport name, durl), ...]``.

    ``N@NAME:PORT`` means N transports ``NAME@0..N-1`` on ports PORT..PORT+N-1. IMPL is
    ``tcp`` (default), ``rdma``, ``local`` or ``shm``; ARGS are extra durl fields
    ``KEY,VALUE;...`` (e.g. ``size,1048576`` for local)."""
    count = 1
    m = re.fullmatch(r"(?:(\d+)@)?([^:@;,]+):(\d+)(?::([a-z_]+)(?::(.*))?)?", spec.strip())
    if not m:
        raise ValueError(f"memory spec {spec!r} is not [N@]NAME:PORT[:IMPL[:ARGS]]")
    if m.group(1) is not None:
        count = int(m.group(1))
        if count < 1:
            raise ValueError(f"memory spec {spec!r}: N must be at least 1")
    name, port = m.group(2), int(m.group(3))
    impl = m.group(4) or "tcp"
    if impl not in _IMPLS and impl not in _IMPLS.values():
        raise ValueError(f"memory spec {spec!r}: unknown implementation {impl!r} (tcp, rdma, local, shm)")
    kind = _IMPLS.get(impl, impl)
    args = m.group(5) or ""
    if args and not args.endswith(";"):
        args += ";"
    out = []
    for i in range(count):
        tname = f"{name}@{i}" if m.group(1) is not None else name
        p = port + i
        if not 0 < p < 65536:
            raise ValueError(f"memory spec {spec!r}: port {p} out of range")
        if kind in ("rdma_tcp", "rdma_uverbs"):
            durl = f"{tname};{kind};url,tcp://{host}:{p};{args}"
        elif kind == "rdma_shm":
            durl = f"{tname};{kind};shm_id,{name}-{p};{args}"
        else:
            durl = f"{tname};{kind};{args}"
        out.append((tname, durl))
    return out


class ParentOutput(dict):
    """One parent output: a dict that also answers ``[0]`` with itself, so programs
    can write both ``params[p]['meta']`` and ``params[p][0]['meta']``."""

    def __getitem__(self, key: Any) -> Any:
        if key == 0 and not dict.__contains__(self, 0) and isinstance(key, int):
            return self
        return dict.__getitem__(self, key)


def _index_of(path: str) -> int:
    m = re.search(r"@(\d+)\.json$", path)
    return int(m.group(1)) if m else -1


def parent_params(outputs: Dict[str, List[Any]], parents: List[str]) -> Dict[str, Any]:
    """``params`` for an element from its parents' outputs (parent -> results in
    instance order): one output becomes a :class:`ParentOutput`, several a list."""
    params: Dict[str, Any] = {}
    for p in parents:
        outs = outputs[p]
        if len(outs) == 1 and isinstance(outs[0], dict):
            params[p] = ParentOutput(outs[0])
        else:
            params[p] = [ParentOutput(o) if isinstance(o, dict) else o for o in outs]
    return params


def load_parent_outputs(directory: str, parents: List[str]) -> Dict[str, Any]:
    """``params`` for an element: each parent's outputs from
    ``DIR/rundisagg.<parent>[@i].json`` (one output: a :class:`ParentOutput`; several:
    a list in instance order)."""
    outputs: Dict[str, List[Any]] = {}
    for p in parents:
        files = [f for f in glob.glob(os.path.join(directory, f"rundisagg.{glob.escape(p)}*.json"))
                 if re.fullmatch(rf"rundisagg\.{re.escape(p)}(@\d+)?\.json", os.path.basename(f))]
        if not files:
            raise FileNotFoundError(f"no output of parent {p!r} in {directory} (rundisagg.{p}*.json)")
        outs = []
        for f in sorted(files, key=_index_of):
            with open(f, encoding="utf-8") as fh:
                outs.append(json.load(fh))
        outputs[p] = outs
    return parent_params(outputs, parents)


def _load_main(path: str):
    mod_name = "scad_element_" + re.sub(r"\W", "_", os.path.basename(path))
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ElementError(f"{path}: cannot load as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    main = getattr(module, "main", None)
    if not callable(main):
        raise ElementError(f"{path}: a compute element must define main(params, action)")
    return main


def _memory_templates(directory: str) -> Dict[str, Dict[str, Any]]:
    """Memory elements beside a compute element, as templates for ``runtime.invoke``."""
    templates: Dict[str, Dict[str, Any]] = {}
    for f in glob.glob(os.path.join(glob.escape(directory), "*.o.yaml")):
        try:
            e = parse_element(f)
        except ElementError:
            continue  # only scad run insists on a well-formed DAG
        templates[e.name] = {"limits": dict(e.limits)}
    return templates


def call_element(element: Element, memories: List[Tuple[str, str]], params: Dict[str, Any],
                 index: Optional[int] = None, timeout: float = 60.0,
                 prepare: Optional[Callable[[Any], None]] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Calls a parsed compute element's ``main(params, action)`` with transports
    ``memories`` ([(name, durl)]; a durl may lack its address, to be configured later
    through the action's ``config_transport``). ``prepare(action)`` runs before
    ``main`` (to configure transports late or replace ``action.runtime``, whose default
    starts in-process memory servers). Returns the result
    (a dict) and the stats (seconds, bytes per transport)."""
    import disagg  # the drop-in module, imported lazily so scad works without it

    path = element.path or ""
    if element.kind != "compute":
        raise ElementError(f"{path}: only compute elements (*.o.py) run")
    saved = os.environ.get("__OW_PAR")
    if index is not None:
        os.environ["__OW_PAR"] = str(index)
    try:
        main = _load_main(path)
        action = disagg.LibdAction(threading.Condition(), element.name, name=element.name, timeout=timeout,
                                   templates=_memory_templates(os.path.dirname(os.path.abspath(path))))
        for _, durl in memories:
            action.add_transport(durl)
        if prepare is not None:
            prepare(action)
        start = time.perf_counter()
        try:
            result = main(params, action)
        finally:
            seconds = time.perf_counter() - start
            stats = action.transport_stats()
            action.terminate()
    finally:
        if index is not None:
            if saved is None:
                os.environ.pop("__OW_PAR", None)
            else:
                os.environ["__OW_PAR"] = saved
    if result is None:
        result = {}
    if not isinstance(result, dict):
        raise TypeError(f"{element.name}: main returned {type(result).__name__}, not a dict")
    return result, {"seconds": seconds, "transports": stats}


def write_outputs(directory: str, name: str, index: Optional[int], result: Dict[str, Any],
                  stats: Dict[str, Any]) -> None:
    """Writes ``rundisagg.<name>[@index].json`` (the result, atomically) and its
    ``.stats.json`` in ``directory``, where children read them."""
    suffix = f"@{index}" if index is not None else ""
    out = os.path.join(directory, f"rundisagg.{name}{suffix}.json")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, out)
    with open(os.path.join(directory, f"rundisagg.{name}{suffix}.stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f)


def run_element(path: str, memories: List[Tuple[str, str]], directory: str = "/tmp",
                index: Optional[int] = None, extra_params: Optional[Dict[str, Any]] = None,
                timeout: float = 60.0) -> Dict[str, Any]:
    """Runs compute element ``path`` with transports ``memories`` ([(name, durl)]),
    parents' outputs from ``directory``; writes ``rundisagg.<name>[@index].json`` and
    a ``.stats.json`` beside it (seconds, bytes per transport). Returns the result."""
    element = parse_element(path)
    if element.kind != "compute":
        raise ElementError(f"{path}: rundisagg runs compute elements (*.o.py)")
    params: Dict[str, Any] = load_parent_outputs(directory, element.parents)
    params.update(extra_params or {})
    result, stats = call_element(element, memories, params, index, timeout)
    write_outputs(directory, element.name, index, result, stats)
    return result


class DagRunError(RuntimeError):
    """An element of a DAG run failed."""


@dataclass
class ElementReport:
    name: str
    kind: str
    instances: int = 1
    seconds: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    status: str = "not run"


@dataclass
class RunReport:
    """What ``scad run`` did: per element time and bytes moved, and the results."""

    elements: List[ElementReport] = field(default_factory=list)
    results: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    output_dir: str = ""

    def table(self) -> str:
        rows = [("element", "kind", "inst", "seconds", "MiB read", "MiB written", "status")]
        for e in self.elements:
            rows.append((e.name, e.kind, str(e.instances), f"{e.seconds:.3f}", f"{e.bytes_read / 2**20:.2f}",
                         f"{e.bytes_written / 2**20:.2f}", e.status))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        lines.append(f"total {self.seconds:.3f} s; outputs in {self.output_dir}")
        return "\n".join(lines)

    def to_json(self) -> Dict[str, Any]:
        return {"seconds": self.seconds, "output_dir": self.output_dir,
                "elements": [e.__dict__ for e in self.elements], "results": self.results}


def run_dag(directory: str, output_dir: Optional[str] = None, jobs: Optional[int] = None,
            host: str = "127.0.0.1", timeout: float = 60.0, log=None) -> RunReport:
    """Runs a whole DAG locally.

    Memory elements become in-process memory servers; compute elements run as
    ``rundisagg`` subprocesses in dependency order, independent ones (and the
    instances of a ``parallelism: N`` element, with ``__OW_PAR`` = 0..N-1) in
    parallel up to ``jobs`` at a time. The DAG is checked before anything starts;
    on failure the remaining elements are not started and everything is torn down.
    """
    dag = load_dag(directory)  # raises DagError / ElementError before anything starts
    out_dir = output_dir or tempfile.mkdtemp(prefix="scad-run-")
    os.makedirs(out_dir, exist_ok=True)
    for stale in glob.glob(os.path.join(out_dir, "rundisagg.*.json")):
        os.remove(stale)
    jobs = jobs or max(1, os.cpu_count() or 1)
    report = RunReport(output_dir=out_dir)
    reports: Dict[str, ElementReport] = {}
    servers: Dict[str, _native.MemoryServer] = {}
    # Memory servers serve loopback clients only unless they have a token (protected
    # mode): on another address, give this run's servers a token of their own.
    token = None if _is_loopback(host) else secrets.token_hex(16)
    t0 = time.perf_counter()
    try:
        for m in dag.memory:
            servers[m.name] = _native.MemoryServer(m.memory_bytes, f"{host}:0", token)
            reports[m.name] = ElementReport(m.name, "memory", status="served")
        for e in dag.compute:
            reports[e.name] = ElementReport(e.name, "compute", instances=e.parallelism)
        _run_compute(dag, servers, out_dir, jobs, host, timeout, reports, log, token)
        for e in dag.compute:
            if not any(e.name in dag.parents_of(c.name) for c in dag.compute):
                report.results[e.name] = load_parent_outputs(out_dir, [e.name])[e.name]
    finally:
        for name, s in servers.items():
            st = s.stats()
            reports[name].bytes_read = st["bytes_read"]
            reports[name].bytes_written = st["bytes_written"]
            s.shutdown()
        report.seconds = time.perf_counter() - t0
        report.elements = [reports[n] for n in dag.order] + [reports[m.name] for m in dag.memory if m.name in reports]
    return report


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run_compute(dag: Dag, servers: Dict[str, Any], out_dir: str, jobs: int, host: str, timeout: float,
                 reports: Dict[str, ElementReport], log, token: Optional[str] = None) -> None:
    done: set = set()
    running: Dict[Future, str] = {}
    failed: List[str] = []
    # Element coordinators are cheap threads; the instance processes they start share
    # `jobs` slots, so -j bounds the processes running at once.
    slots = threading.BoundedSemaphore(jobs)
    with ThreadPoolExecutor(max_workers=max(1, len(dag.order))) as pool:
        pending = list(dag.order)
        while pending or running:
            ready = [n for n in pending if all(p in done for p in dag.parents_of(n))] if not failed else []
            for n in ready:
                pending.remove(n)
                running[pool.submit(_run_instances, dag.elements[n], servers, out_dir, host, timeout,
                                    reports[n], log, slots, token)] = n
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_EXCEPTION)
            for f in finished:
                n = running.pop(f)
                try:
                    f.result()
                    done.add(n)
                except Exception as exc:  # report every failure, start nothing new
                    failed.append(f"{n}: {exc}")
    if failed:
        raise DagRunError("; ".join(failed))
    if len(done) != len(dag.order):
        raise DagRunError("some elements were not run: " + ", ".join(n for n in dag.order if n not in done))


def _run_one(cmd: List[str], slots: threading.BoundedSemaphore) -> Tuple[int, str]:
    with slots:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def _run_instances(e: Element, servers: Dict[str, Any], out_dir: str, host: str, timeout: float,
                   rep: ElementReport, log, slots: threading.BoundedSemaphore,
                   token: Optional[str] = None) -> None:
    specs: List[str] = []
    extra = f":tcp:token,{token}" if token else ""
    for mem in e.corunning:
        specs += ["-m", f"{e.transport_of(mem)}:{servers[mem].port}{extra}"]
    start = time.perf_counter()
    idx = list(range(e.parallelism)) if e.parallelism > 1 else [None]
    # Each instance is its own Python process: its own __OW_PAR, its own GIL.
    cmds = []
    for i in idx:
        cmd = [sys.executable, "-m", "scad.cli", "rundisagg", e.path, "-d", out_dir, "--host", host,
               "--timeout", str(timeout)] + specs
        if i is not None:
            cmd += ["-i", str(i)]
        cmds.append(cmd)
    with ThreadPoolExecutor(max_workers=len(cmds)) as starter:
        outcomes = list(starter.map(lambda c: _run_one(c, slots), cmds))
    errors = []
    for i, (code, output) in zip(idx, outcomes):
        if log is not None and output.strip():
            log(f"[{e.name}{'' if i is None else '@' + str(i)}] " + output.rstrip().replace("\n", "\n  "))
        if code != 0:
            errors.append(f"instance {i if i is not None else 0} exited with {code}: "
                          f"{output.strip().splitlines()[-1] if output.strip() else ''}")
    rep.seconds = time.perf_counter() - start
    for i in idx:
        suffix = "" if i is None else f"@{i}"
        try:
            with open(os.path.join(out_dir, f"rundisagg.{e.name}{suffix}.stats.json"), encoding="utf-8") as f:
                st = json.load(f)
            for t in st["transports"].values():
                rep.bytes_read += t["bytes_read"]
                rep.bytes_written += t["bytes_written"]
        except FileNotFoundError:
            pass
    if errors:
        rep.status = "failed"
        raise DagRunError("; ".join(errors))
    rep.status = "ok"
