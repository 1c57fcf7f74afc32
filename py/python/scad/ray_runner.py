"""Running an element DAG on Ray (``scad run DAGDIR --ray [ADDRESS]``).

What runs where:

* every memory element (``.o.yaml``, or implied by ``corunning``) is a Ray actor
  (``num_cpus=0``, ``memory`` = its ``limits.mem``) that hosts a memory server on its
  node and publishes the server's address;
* every compute element is a Ray task (``num_cpus`` = ``limits.cpu``, default 1;
  ``memory`` = ``limits.mem`` when given), ``parallelism: N`` as N tasks with
  ``__OW_PAR`` = 0..N-1. A task takes its parents' results as arguments, so Ray runs
  the DAG in dependency order; it starts with its transports unconfigured and
  configures each one as its memory element's address arrives, as the original
  runtime did;
* ``action.runtime.invoke``/``release`` inside an element start and stop memory
  element actors.

The DAG directory's files travel to the workers through Ray's object store (each
task runs its element from a copy, so elements may read files beside them; at most
:data:`MAX_DAG_BYTES`), with the driver's ``SCAD_*`` environment variables. Only
addresses, metadata and element results pass through Ray; the memory servers' data
goes straight between compute and memory elements over TCP, each server protected by
a token of the run. Everything the run started is killed at the end, on failure too.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any, Dict, List, Optional, Tuple

import disagg

from .dag import Dag, Element, load_dag, parse_element
from .ray_support import NAMESPACE, MemoryElement, RayUnavailableError, _cause, _ray, _stop
from .runner import DagRunError, ElementReport, RunReport, call_element, parent_params, write_outputs

__all__ = ["RayUnavailableError", "run_dag_ray", "memory_actor_name"]

def memory_actor_name(run_id: str, element: str) -> str:
    """Name of memory element ``element``'s actor in run ``run_id`` (an element sees
    its run's id in ``$SCAD_RUN_ID``)."""
    return f"{run_id}/{element}"


def _durl_fields(address: Dict[str, Any], token: str) -> str:
    return f"url,{address['url']};token,{token};"


_REMOTE: Dict[str, Any] = {}


def _remote(ray) -> Tuple[Any, Any]:
    """The Ray actor class and task function (made once: Ray is imported lazily)."""
    if not _REMOTE:
        _REMOTE["actor"] = ray.remote(MemoryElement)
        _REMOTE["task"] = ray.remote(_compute_task)
    return _REMOTE["actor"], _REMOTE["task"]


class RayRuntime(disagg.LocalRuntime):
    """``action.runtime`` inside a Ray task: ``invoke`` starts a memory element actor
    on the cluster and connects transport ``trans`` to it; ``release`` drops the
    transports to an element and kills the actors this runtime started; otherwise as
    ``disagg.LocalRuntime``."""

    def __init__(self, action: Any, token: str, run_id: str):
        super().__init__(action, action.runtime.templates)
        self._token, self._run_id = token, run_id

    def _start(self, name: str, size: int) -> Tuple[Any, str]:
        ray = _ray()
        actor_cls, _ = _remote(ray)
        actor = actor_cls.options(num_cpus=0, name=memory_actor_name(self._run_id, name),
                                  namespace=NAMESPACE).remote(size, self._token)
        handle = _ActorHandle(ray, actor)
        try:
            address = ray.get(actor.address.remote())
        except BaseException:
            handle.shutdown()
            raise
        return handle, _durl_fields(address, self._token)


class _ActorHandle:
    """A started memory element actor; ``shutdown`` stops it."""

    def __init__(self, ray, actor):
        self._ray, self._actor = ray, actor

    def shutdown(self) -> None:
        _stop(self._ray, self._actor)


#: The most a DAG directory may hold to be shipped to the workers.
MAX_DAG_BYTES = 64 << 20


def pack_dag_dir(directory: str, skip: Optional[str] = None) -> Dict[str, bytes]:
    """The files of a DAG directory (relative path -> content), to recreate it on
    the workers; hidden entries, ``__pycache__`` and ``skip`` (the output directory,
    when it lies inside) are left out. Raises :class:`DagRunError` beyond
    :data:`MAX_DAG_BYTES`: data that large belongs on storage every node reaches."""
    files: Dict[str, bytes] = {}
    total = 0
    skip_abs = os.path.abspath(skip) if skip else None
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"
                   and os.path.abspath(os.path.join(root, d)) != skip_abs]
        for n in names:
            if n.startswith("."):
                continue
            path = os.path.join(root, n)
            total += os.path.getsize(path)
            if total > MAX_DAG_BYTES:
                raise DagRunError(f"{directory} holds more than {MAX_DAG_BYTES >> 20} MiB: Ray ships the DAG "
                                  "directory to every task; put large data where every node can read it")
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files


def _compute_task(files: Dict[str, bytes], file: str, memories: List[Tuple[str, str]], addresses: List[Any],
                  token: str, run_id: str, index: Optional[int], timeout: float, layout: List[Tuple[str, int]],
                  *parent_results: Dict[str, Any]) -> Dict[str, Any]:
    """One instance of a compute element in a Ray worker: recreates the DAG
    directory from ``files`` in a temporary directory and runs element ``file`` from
    there. ``memories`` are (transport, memory element) pairs and ``addresses`` a
    one-element list holding the ObjectRefs of their addresses (in a list so that Ray
    does not wait for the addresses before the task starts)."""
    import shutil
    import tempfile
    import threading

    import ray

    outputs: Dict[str, List[Any]] = {}
    it = iter(parent_results)
    for parent, count in layout:
        outputs[parent] = [next(it)["result"] for _ in range(count)]
    params = parent_params(outputs, [p for p, _ in layout])
    refs = addresses[0]

    def configure(action: Any) -> None:
        # Transports are configured late: the element may start (and wait in
        # get_transport) before its memory elements have published their addresses.
        def run() -> None:
            try:
                for (trans, _), ref in zip(memories, refs):
                    action.config_transport(trans, _durl_fields(ray.get(ref), token))
            except Exception:
                pass  # the element times out in get_transport; the driver reports the actor's failure

        threading.Thread(target=run, name="scad-configure", daemon=True).start()
        action.runtime = RayRuntime(action, token, run_id)

    pending = [(trans, f"{trans};rdma_tcp;") for trans, _ in memories]
    here = tempfile.mkdtemp(prefix=f"scad-{run_id}-")
    try:
        for rel, content in files.items():
            path = os.path.join(here, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)
        element = parse_element(os.path.join(here, file))
        result, stats = call_element(element, pending, params, index, timeout, prepare=configure)
    finally:
        shutil.rmtree(here, ignore_errors=True)
    return {"result": result, "stats": stats, "node": ray.util.get_node_ip_address()}


def _forwarded_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("SCAD_")}


def _check_feasible(ray, dag: Dag) -> None:
    """Refuses a DAG that asks one node for more than any node of the cluster has
    (Ray would otherwise wait for such a node forever)."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        raise DagRunError("the Ray cluster has no live nodes")
    most_cpu = max(n.get("CPU", 0.0) for n in nodes)
    most_mem = max(n.get("memory", 0.0) for n in nodes)
    for e in dag.compute:
        cpus = _cpus(e)
        if cpus > most_cpu:
            raise DagRunError(f"{e.name}: limits.cpu {cpus:g} is more than any Ray node has ({most_cpu:g})")
        mem = _compute_memory(e)
        if mem and mem > most_mem:
            raise DagRunError(f"{e.name}: limits.mem {mem >> 20} MiB is more than any Ray node offers "
                              f"({int(most_mem) >> 20} MiB)")
    for m in dag.memory:
        if m.memory_bytes > most_mem:
            raise DagRunError(f"memory element {m.name}: {m.memory_bytes >> 20} MiB is more than any Ray node "
                              f"offers ({int(most_mem) >> 20} MiB)")


def _cpus(e: Element) -> float:
    cpu = e.limits.get("cpu", 1)
    try:
        cpus = float(cpu)
    except (TypeError, ValueError):
        raise DagRunError(f"{e.name}: limits.cpu {cpu!r} is not a number") from None
    if cpus < 0:
        raise DagRunError(f"{e.name}: limits.cpu {cpu!r} is negative")
    return cpus


def _compute_memory(e: Element) -> int:
    return e.memory_bytes if "mem" in e.limits else 0


def run_dag_ray(directory: str, address: Optional[str] = None, output_dir: Optional[str] = None,
                timeout: float = 60.0, log=None) -> RunReport:
    """Runs the DAG in ``directory`` on Ray: on the cluster at ``address`` (``auto``:
    the one this machine belongs to), or, without one, on the Ray instance this
    process has already initialized or else a new local one. Writes each element's
    ``rundisagg.*.json`` into ``output_dir`` (a new temporary one if None) as
    ``scad run`` does, and returns the same report.

    Raises :class:`RayUnavailableError` without Ray, ``DagError``/``ElementError``
    for a malformed DAG and :class:`DagRunError` when an element fails (naming it and
    its error) or the cluster cannot host an element; nothing is left running.
    """
    import tempfile

    ray = _ray()
    dag = load_dag(directory)  # raises DagError / ElementError before anything starts
    out_dir = output_dir or tempfile.mkdtemp(prefix="scad-run-")
    os.makedirs(out_dir, exist_ok=True)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=log is not None, include_dashboard=False,
                 configure_logging=False)
    try:
        return _run(ray, dag, out_dir, timeout, log)
    finally:
        if started:
            ray.shutdown()


def _run(ray, dag: Dag, out_dir: str, timeout: float, log) -> RunReport:
    _check_feasible(ray, dag)
    actor_cls, task = _remote(ray)
    run_id = f"run-{secrets.token_hex(6)}"
    token = secrets.token_hex(16)
    runtime_env = {"env_vars": {**_forwarded_env(), "SCAD_RUN_ID": run_id}}
    files = ray.put(pack_dag_dir(dag.directory, out_dir))
    report = RunReport(output_dir=out_dir)
    reports: Dict[str, ElementReport] = {}
    actors: Dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        addresses: Dict[str, Any] = {}
        for m in dag.memory:
            actors[m.name] = actor_cls.options(num_cpus=0, memory=m.memory_bytes, name=memory_actor_name(run_id, m.name),
                                               namespace=NAMESPACE).remote(m.memory_bytes, token)
            addresses[m.name] = actors[m.name].address.remote()
            reports[m.name] = ElementReport(m.name, "memory", status="served")
        # Every task is submitted at once; each waits for its parents' results.
        instances: Dict[str, List[Any]] = {}
        owner: Dict[Any, Tuple[str, Optional[int]]] = {}
        for e in dag.compute:
            reports[e.name] = ElementReport(e.name, "compute", instances=e.parallelism)
            memories = [(e.transport_of(m), m) for m in e.corunning]
            refs = [addresses[m] for _, m in memories]
            parents = dag.parents_of(e.name)
            layout = [(p, len(instances[p])) for p in parents]
            parent_refs = [r for p in parents for r in instances[p]]
            options: Dict[str, Any] = {"num_cpus": _cpus(e), "runtime_env": runtime_env, "max_retries": 0,
                                       "name": e.name}
            if _compute_memory(e):
                options["memory"] = _compute_memory(e)
            idx = list(range(e.parallelism)) if e.parallelism > 1 else [None]
            instances[e.name] = []
            for i in idx:
                ref = task.options(**options).remote(files, os.path.relpath(e.path, dag.directory), memories,
                                                     [refs], token, run_id, i, timeout, layout, *parent_refs)
                instances[e.name].append(ref)
                owner[ref] = (e.name, i)
        _wait_all(ray, dag, instances, owner, addresses, reports, out_dir, log)
        for e in dag.compute:
            if not any(e.name in dag.parents_of(c.name) for c in dag.compute):
                results = [ray.get(r)["result"] for r in instances[e.name]]
                report.results[e.name] = parent_params({e.name: results}, [e.name])[e.name]
    finally:
        for name, actor in actors.items():
            try:
                st = ray.get(actor.stats.remote(), timeout=10)
                reports[name].bytes_read = st["bytes_read"]
                reports[name].bytes_written = st["bytes_written"]
            except Exception:  # a dead actor has no stats to give
                reports[name].status = "lost"
            _stop(ray, actor)
        report.seconds = time.perf_counter() - t0
        report.elements = ([reports[n] for n in dag.order if n in reports]
                           + [reports[m.name] for m in dag.memory if m.name in reports])
    return report


def _wait_all(ray, dag: Dag, instances: Dict[str, List[Any]], owner: Dict[Any, Tuple[str, Optional[int]]],
              addresses: Dict[str, Any], reports: Dict[str, ElementReport], out_dir: str, log) -> None:
    """Waits for every task; on the first failure cancels the rest and raises."""
    memory_of = {ref: name for name, ref in addresses.items()}
    pending = list(owner) + list(memory_of)
    left = {name: len(refs) for name, refs in instances.items()}
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ref = ready[0]
        try:
            value = ray.get(ref)
        except Exception as exc:
            for other in pending:
                if other in owner:
                    try:
                        ray.cancel(other, force=True)
                    except Exception:  # already finished or gone: nothing to stop
                        pass
            if ref in memory_of:
                raise DagRunError(f"memory element {memory_of[ref]} did not start: {_cause(exc)}") from None
            name, i = owner[ref]
            reports[name].status = "failed"
            where = name if i is None else f"{name}@{i}"
            raise DagRunError(f"{where}: {_cause(exc)}") from None
        if ref in memory_of:
            continue
        name, i = owner[ref]
        write_outputs(out_dir, name, i, value["result"], value["stats"])
        rep = reports[name]
        rep.seconds = max(rep.seconds, value["stats"]["seconds"])
        for t in value["stats"]["transports"].values():
            rep.bytes_read += t["bytes_read"]
            rep.bytes_written += t["bytes_written"]
        left[name] -= 1
        if left[name] == 0:
            rep.status = "ok"
        if log is not None:
            log(f"[{name}{'' if i is None else '@' + str(i)}] done on {value['node']} in "
                f"{value['stats']['seconds']:.3f} s")
