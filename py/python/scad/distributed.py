"""SQL across a Ray cluster: :class:`DistributedSession` and ``scad.sql(text, ray=...)``.

A query's plan is cut into stages (:meth:`scad.QuerySession.stages`) and every stage
runs as independent *tasks*, one per partition, each writing its output already
partitioned for the stage that reads it. Here every task is a Ray task and every
memory element a Ray actor::

    import scad

    with scad.DistributedSession(tables={"store_sales": "store_sales.parquet", "item": item_table},
                                 address="auto", budget=256 << 20) as ds:
        r = ds.sql("SELECT i_category, sum(ss_net_paid) FROM store_sales JOIN item "
                   "ON ss_item_sk = i_item_sk GROUP BY i_category")
        r.table                 # pyarrow.Table
        r.stats                 # elapsed_s, tasks, stages, shuffle_bytes, per element bytes ...
        r.tasks                 # one dict per task: stage, task, node_id, pid, start, end, stats

    scad.sql("SELECT ...", ray="auto", store_sales="store_sales.parquet")   # one query

What runs where:

* **Memory elements** are :class:`scad.ray_runner.MemoryElement` actors, one per alive
  node by default, each pinned to its node (``NodeAffinitySchedulingStrategy``,
  ``num_cpus=0``) and serving a memory server protected by a random token of the
  session. A server maps its ``element_bytes`` lazily (``MAP_NORESERVE``), so a large
  virtual size costs nothing until written.
* **The driver** (this process) reads the tables (Parquet files or Arrow tables) and
  writes them into the memory elements itself, keeping only their metadata; it plans
  every query itself with the same budget, partitions and tables as the tasks (every
  process planning the same SQL over the same tables finds the same stages, so no plan
  is shipped).
* **Tasks**: one Ray task per (stage, task) (``num_cpus=1``, ``memory`` = the budget
  when one is set, ``max_retries=0``, ``SPREAD``, named ``QUERY/stageS/taskT``). All
  tasks of a query are submitted at once, in stage order; a task takes the
  ``ObjectRef`` of every task of its input stages as arguments, so Ray starts it when
  its inputs are written, and independent stages run at the same time. A task connects
  to the memory elements, opens the tables from their metadata, plans the query, runs
  its share of its stage (``QuerySession.run_stage_task``) from its inputs' frames and
  returns the metadata of what it wrote. Only metadata passes through Ray; data goes
  between tasks and memory elements.

Allocation without coordination, by **per-task regions**: above the tables, the
address space of every memory element is cut into fixed slots of ``region_bytes``.
The driver hands each task of a query one slot (the same address range in every
element) and the task confines its allocator to it (``Store.resume_allocation``), so
its outputs and spill files land only there. Why:

* no allocator round trip per allocation: tasks allocate locally, in parallel, and
  RDMA stays one-sided (a memory server never decides anything);
* nothing can leak: a slot stays taken until its query ends (consumers read the outputs
  in it), then every slot of the query returns to the driver, whatever the query's
  fate; a task that died, or was killed, with half its output written, loses nothing
  that a later query could not reuse.

A query needing more slots than exist is refused before anything runs (raise
``element_bytes`` or lower ``region_bytes``); a task that writes more than its slot
(``region_bytes`` in each element) fails with the allocator's out-of-memory error.
Slots are reused lowest first, so the memory a server has touched stays bounded by the
largest query.

Failures: the driver waits on the tasks with ``ray.wait``; on the first failure (the
task's own error, its worker or node dying, or no task finishing for ``task_timeout``
seconds) it force-cancels every other task of the query, waits for them to stop
(``cancel_grace``), returns the query's slots and raises :class:`DistributedQueryError`
naming the stage, the task and the error. The session stays usable (unless a memory
element died: then its tables are gone and the session says so). :meth:`close` stops
the actors; nothing is left running.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _native
from .ray_support import NAMESPACE, MemoryElement, _cause, _ray, _stop
from .stages import _NAME

__all__ = ["DistributedSession", "DistributedResult", "DistributedQueryError"]

#: Alignment of the remote allocators (``scad_remote_array::alloc``'s default).
ALIGN = 4096

#: Where the slots start: the first multiple of this above the tables.
SLOT_ALIGN = 1 << 20

#: Prefix of the memory element actors' names (``dist-<session>/mem<i>``, namespace
#: :data:`scad.ray_runner.NAMESPACE`).
ACTOR_PREFIX = "dist-"


class DistributedQueryError(_native.ScadError):
    """A distributed query failed. ``stage`` and ``task`` name the task that failed
    first (None when no single task is to blame, e.g. a memory element lost),
    ``cause`` is its own error (``"QueryError: ..."``, ``"WorkerCrashedError: ..."``)."""

    def __init__(self, message: str, query_id: Optional[str] = None, stage: Optional[int] = None,
                 task: Optional[int] = None, cause: Optional[str] = None):
        super().__init__(message)
        self.query_id, self.stage, self.task, self.cause = query_id, stage, task, cause


class DistributedResult:
    """A distributed query's answer (``table``, a ``pyarrow.Table``) with what ran.

    ``columns``: the answer's column names; ``ordered``: whether a top-level ``ORDER
    BY`` fixed the row order; ``stats``: ``elapsed_s``, ``plan_s``, ``read_s``,
    ``stages``, ``tasks``, ``slots``, ``rows``, ``shuffle_bytes`` (bytes written by
    every task but the root's), ``compute_s`` (the tasks' in-engine time, summed),
    ``task_s`` (their wall time, summed), ``peak_local_bytes`` (the highest task's),
    ``scan_bytes``, ``spill_files`` and ``elements`` (per memory element:
    ``bytes_written``/``bytes_read`` during the query); ``stages``: the plan's stages;
    ``tasks``: the task log, one
    dict per task in stage order (``stage``, ``task``, ``node_id``, ``pid``, ``start``
    and ``end`` (Unix time, taken in the task), ``stats`` (``run_stage_task``'s))."""

    def __init__(self, query_id: str, table: Any, columns: List[str], ordered: bool,
                 stats: Dict[str, Any], tasks: List[Dict[str, Any]], stages: List[Dict[str, Any]]):
        self.query_id = query_id
        #: The plan's stages as they ran (``QuerySession.stages``: id, inputs, operator,
        #: partitions, tasks, columns).
        self.stages = stages
        self.table = table
        self.columns = columns
        self.ordered = ordered
        self.stats = stats
        self.tasks = tasks

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def rows(self) -> int:
        return self.table.num_rows

    def to_arrow(self) -> Any:
        return self.table

    def to_polars(self) -> Any:
        import polars as pl

        return pl.from_arrow(self.table)

    def to_pandas(self) -> Any:
        return self.table.to_pandas()

    def __repr__(self) -> str:
        return (f"DistributedResult({self.rows} rows, columns={self.columns}, {self.stats['tasks']} tasks in "
                f"{self.stats['stages']} stages, {self.stats['elapsed_s']:.3f} s)")


_REMOTE: Dict[str, Any] = {}


def _remote(ray) -> Tuple[Any, Any]:
    """The memory element actor class and the stage task (made once: Ray is imported
    lazily)."""
    if not _REMOTE:
        _REMOTE["actor"] = ray.remote(MemoryElement)
        _REMOTE["task"] = ray.remote(_stage_task)
    return _REMOTE["actor"], _REMOTE["task"]


def _durl(name: str, url: str, token: str) -> str:
    return f"{name};rdma_tcp;url,{url};token,{token};"


def _region(elements: Sequence[str], lo: int, hi: int) -> str:
    """The allocation state (``Store.allocation_state`` format) confining every
    element's allocator to ``[lo, hi)``."""
    return json.dumps({"allocators": [{"element": e, "start": lo, "end": hi, "align": ALIGN, "next": lo,
                                       "free": []} for e in elements]})


def _stage_task(ctx: Dict[str, Any], sql: str, stage: int, task: int, layout: List[Tuple[int, int, int]],
                region: str, *results: Dict[str, Any]) -> Dict[str, Any]:
    """Task ``task`` of stage ``stage``, in a Ray worker. ``ctx``: the memory
    elements' durls, the tables' metadata, budget, chunk rows, partitions, pool size;
    ``layout``: (input stage, its task count, its partitions) per input stage, whose
    tasks' results follow in ``results`` in that order; ``region``: the allocation
    state of this task's slot."""
    import ray

    from .array import Store
    from .frame import FrameEnv, RemoteFrame
    from .query import QuerySession

    start = time.time()
    store = Store({name: durl for name, durl in ctx["elements"].items()}, pool_bytes=ctx["pool_bytes"])
    store.resume_allocation(region)
    env = FrameEnv(store, budget=ctx["budget"], chunk_rows=ctx["chunk_rows"])
    tables = {name: RemoteFrame.from_meta(env, meta) for name, meta in ctx["tables"].items()}
    session = QuerySession(env, partitions=ctx["partitions"], **tables)
    inputs: Dict[int, List[List[str]]] = {}
    it = iter(results)
    for s, count, partitions in layout:
        parts: List[List[str]] = [[] for _ in range(partitions)]
        for _ in range(count):
            out = next(it)["outputs"]
            if len(out) != partitions:
                raise DistributedQueryError(f"stage {s} wrote {len(out)} partitions, {partitions} expected")
            for q, metas in enumerate(out):
                parts[q].extend(metas)
        inputs[s] = parts
    outputs, stats = session.run_stage_task(sql, stage, task, inputs)
    store.flush()
    return {"stage": stage, "task": task, "outputs": [list(m) for m in outputs], "stats": dict(stats),
            "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "start": start,
            "end": time.time()}


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _positive_or_none(name: str, value: Any) -> Optional[int]:
    return None if value is None else _positive(name, value)


def _check_tables(tables: Dict[str, Any]) -> Dict[str, Any]:
    """Table name -> absolute Parquet path or Arrow data; refuses bad names, missing
    or unreadable files and other objects before anything starts."""
    import pyarrow.parquet as pq

    if not isinstance(tables, dict) or not tables:
        raise ValueError("a DistributedSession needs tables: {name: Parquet path or pyarrow.Table}")
    checked: Dict[str, Any] = {}
    for name, data in tables.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"table name {name!r} is not an identifier")
        if isinstance(data, (str, os.PathLike)):
            path = os.fspath(data)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"table {name}: no file {path}")
            pq.read_schema(path)  # not Parquet: pyarrow's ArrowInvalid, before anything starts
            checked[name] = os.path.abspath(path)
        elif hasattr(data, "__arrow_c_stream__"):
            checked[name] = data
        else:
            raise TypeError(f"table {name}: expected a Parquet path or an Arrow table (pyarrow.Table, "
                            f"polars.DataFrame, ...), got {type(data).__name__}")
    return checked


class DistributedSession:
    """A query engine spread over a Ray cluster (see the module docstring).

    ``tables``: name -> Parquet path (read by this process) or Arrow data.
    ``address``: the Ray cluster (``"auto"``, ``"ray://..."``, ``HOST:PORT``); None: the
    Ray this process has initialised, else a new local instance (shut down on
    :meth:`close`). ``budget``: local memory bytes per task (None: unlimited; also
    the Ray ``memory`` each task asks for). ``partitions``: DataFusion's target
    partitions, so tasks per stage (default: the cluster's CPUs, at least 2).
    ``memory_elements``: how many (default one per alive node, placed round-robin over
    the nodes). ``element_bytes``: virtual size of each. ``region_bytes``: a task's
    slot in each element. ``task_timeout``: a query fails when none of its tasks
    finishes for this many seconds. ``cancel_grace``: how long a failed query waits
    for its cancelled tasks to stop before their slots are held back (reclaimed when
    they do stop).

    Raises ``ValueError``/``TypeError``/``FileNotFoundError`` for bad arguments
    (before anything starts), :class:`scad.ray_runner.RayUnavailableError` without
    Ray, :class:`DistributedQueryError` when the memory elements cannot start; nothing
    is left running then.
    """

    def __init__(self, tables: Dict[str, Any], address: Optional[str] = None, budget: Optional[int] = None,
                 partitions: Optional[int] = None, memory_elements: Optional[int] = None,
                 element_bytes: int = 1 << 40, region_bytes: int = 4 << 30, task_timeout: float = 600.0,
                 chunk_rows: Optional[int] = None, pool_bytes: int = 64 << 20, cancel_grace: float = 30.0):
        self._tables_in = _check_tables(tables)
        self.budget = _positive_or_none("budget", budget)
        self._partitions = _positive_or_none("partitions", partitions)
        self._elements_wanted = _positive_or_none("memory_elements", memory_elements)
        self.element_bytes = _positive("element_bytes", element_bytes)
        region = _positive("region_bytes", region_bytes)
        self.region_bytes = -(-region // ALIGN) * ALIGN
        self.chunk_rows = _positive_or_none("chunk_rows", chunk_rows)
        self.pool_bytes = _positive("pool_bytes", pool_bytes)
        if not isinstance(task_timeout, (int, float)) or task_timeout <= 0:
            raise ValueError(f"task_timeout must be positive seconds, got {task_timeout!r}")
        self.task_timeout = float(task_timeout)
        self.cancel_grace = float(cancel_grace)
        self.id = f"{ACTOR_PREFIX}{secrets.token_hex(4)}"
        self._token = secrets.token_hex(16)
        self._lock = threading.Lock()
        self._actors: Dict[str, Any] = {}
        self._closed = False
        self._broken: Optional[str] = None
        self._queries = 0
        self._draining: Dict[Any, int] = {}  # ref of a cancelled task still running -> its slot
        ray = self._ray = _ray()
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, include_dashboard=False,
                     configure_logging=False)
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise

    # -- setting up ------------------------------------------------------------------

    def _start(self) -> None:
        import pyarrow.parquet as pq
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .array import Store
        from .frame import FrameEnv, RemoteFrame
        from .query import QuerySession

        ray = self._ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if not nodes:
            raise DistributedQueryError("the Ray cluster has no live nodes")
        cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes))
        if cpus < 1:
            raise ValueError("the Ray cluster has no CPUs for the tasks")
        most_memory = max(n.get("Resources", {}).get("memory", 0) for n in nodes)
        if self.budget and self.budget > most_memory:
            # Ray would wait forever for a node that can take such a task.
            raise ValueError(f"budget {self.budget} is more memory than any Ray node offers ({int(most_memory)})")
        self.partitions = self._partitions or max(2, cpus)
        count = self._elements_wanted or len(nodes)
        actor_cls, _ = _remote(ray)
        for i in range(count):
            node = nodes[i % len(nodes)]
            name = f"mem{i}"
            self._actors[name] = actor_cls.options(
                num_cpus=0, name=f"{self.id}/{name}", namespace=NAMESPACE,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(self.element_bytes, self._token)
        self.element_urls: Dict[str, str] = {}
        self.element_nodes = {name: nodes[i % len(nodes)]["NodeID"] for i, name in enumerate(self._actors)}
        durls = {}
        for name, actor in self._actors.items():
            try:
                address = ray.get(actor.address.remote(), timeout=120)
            except Exception as exc:
                raise DistributedQueryError(f"memory element {name} did not start: {_cause(exc)}") from None
            durls[name] = _durl(name, address["url"], self._token)
            self.element_urls[name] = address["url"]
        self.store = Store(durls, pool_bytes=self.pool_bytes)
        self.env = FrameEnv(self.store, budget=self.budget, chunk_rows=self.chunk_rows)
        metas = {}
        frames = {}
        for name, data in self._tables_in.items():
            table = pq.read_table(data) if isinstance(data, str) else data
            frames[name] = RemoteFrame.from_arrow(self.env, table)
            metas[name] = frames[name].meta
        self.store.flush()
        self.tables = frames
        self._session = QuerySession(self.env, partitions=self.partitions, **frames)
        top = max(a["next"] for a in json.loads(self.store.allocation_state())["allocators"])
        self._base = -(-top // SLOT_ALIGN) * SLOT_ALIGN
        self.slots = (self.element_bytes - self._base) // self.region_bytes
        if self.slots < 1:
            raise ValueError(f"the tables take {self._base} bytes of each memory element's {self.element_bytes}: "
                             f"no room for a {self.region_bytes}-byte region; raise element_bytes")
        self._free = list(range(self.slots))  # sorted: the lowest slots are handed out first
        self._ctx = ray.put({"elements": durls, "tables": metas, "budget": self.budget,
                             "chunk_rows": self.chunk_rows, "partitions": self.partitions,
                             "pool_bytes": self.pool_bytes})

    # -- slots -----------------------------------------------------------------------

    @property
    def slots_in_use(self) -> int:
        """Slots (allocation regions) held now: 0 between queries, unless cancelled
        tasks of a failed query have not stopped yet."""
        self._reap()
        with self._lock:
            return self.slots - len(self._free)

    def _take(self, n: int) -> List[int]:
        with self._lock:
            if n > len(self._free):
                raise DistributedQueryError(
                    f"the query has {n} tasks but only {len(self._free)} of {self.slots} allocation regions are "
                    f"free (region_bytes={self.region_bytes}, element_bytes={self.element_bytes}): raise "
                    "element_bytes or lower region_bytes")
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def _give(self, slots: Sequence[int]) -> None:
        with self._lock:
            self._free = sorted(self._free + list(slots))

    def _reap(self) -> None:
        """Returns the slots of cancelled tasks that have stopped since."""
        if not self._draining:
            return
        done, _ = self._ray.wait(list(self._draining), num_returns=len(self._draining), timeout=0)
        self._give([self._draining.pop(r) for r in done])

    def _slot_state(self, slot: int) -> str:
        lo = self._base + slot * self.region_bytes
        return _region(list(self._actors), lo, lo + self.region_bytes)

    # -- queries ---------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise DistributedQueryError("the DistributedSession is closed")
        if self._broken:
            raise DistributedQueryError(f"the DistributedSession is unusable: {self._broken}; open a new one")

    def stages(self, sql: str) -> Dict[str, Any]:
        """The query's stages as the tasks will run them (:meth:`scad.QuerySession.stages`)."""
        self._check_usable()
        return self._session.stages(sql)

    def sql(self, sql: str) -> DistributedResult:
        """Runs ``sql`` over the session's tables on the cluster and returns the answer.

        Raises the planner's errors (``scad.QueryError``, ...) for SQL that cannot be
        planned (nothing runs then) and :class:`DistributedQueryError` when a task
        fails, dies or stalls, or when the query needs more regions than exist."""
        import pyarrow as pa

        from .frame import RemoteFrame

        self._check_usable()
        self._reap()
        ray = self._ray
        t0 = time.perf_counter()
        plan = self._session.stages(sql)
        stages = plan["stages"]
        plan_s = time.perf_counter() - t0
        by_id = {s["id"]: s for s in stages}
        slots = self._take(sum(int(s["tasks"]) for s in stages))
        with self._lock:
            self._queries += 1
            qid = f"{self.id}-q{self._queries}"
        before = self._element_stats()
        _, task_fn = _remote(ray)
        refs: Dict[Tuple[int, int], Any] = {}
        owner: Dict[Any, Tuple[int, int, int]] = {}  # ref -> (stage, task, slot)
        results: Dict[Tuple[int, int], Dict[str, Any]] = {}
        options: Dict[str, Any] = {"num_cpus": 1, "max_retries": 0, "scheduling_strategy": "SPREAD"}
        if self.budget:
            options["memory"] = self.budget
        free_slots = iter(slots)
        try:
            for s in stages:
                inputs = list(dict.fromkeys(s["inputs"]))
                layout = [(i, int(by_id[i]["tasks"]), int(by_id[i]["partitions"])) for i in inputs]
                args = [refs[(i, t)] for i, n, _ in layout for t in range(n)]
                for t in range(int(s["tasks"])):
                    slot = next(free_slots)
                    ref = task_fn.options(name=f"{qid}/stage{s['id']}/task{t}", **options).remote(
                        self._ctx, sql, s["id"], t, layout, self._slot_state(slot), *args)
                    refs[(s["id"], t)] = ref
                    owner[ref] = (s["id"], t, slot)
            self._wait(qid, stages, owner, results)
            t1 = time.perf_counter()
            root = stages[-1]
            parts = []
            for q in range(int(root["partitions"])):
                for t in range(int(root["tasks"])):
                    for meta in results[(root["id"], t)]["outputs"][q]:
                        parts.append(RemoteFrame.from_meta(self.env, meta).to_arrow())
            table = _concat(pa, parts, root["columns"])
            read_s = time.perf_counter() - t1
        finally:
            self._finish(owner, slots)
        after = self._element_stats()
        log = [results[k] for k in sorted(results, key=lambda k: (k[0], k[1]))]
        tasks = [{k: r[k] for k in ("stage", "task", "node_id", "pid", "start", "end", "stats")} for r in log]
        stats = {
            "elapsed_s": time.perf_counter() - t0, "plan_s": plan_s, "read_s": read_s,
            "stages": len(stages), "tasks": len(tasks), "slots": len(slots), "rows": table.num_rows,
            "partitions": self.partitions,
            "shuffle_bytes": sum(r["stats"].get("bytes_written", 0) for r in log if r["stage"] != root["id"]),
            "root_bytes": sum(r["stats"].get("bytes_written", 0) for r in log if r["stage"] == root["id"]),
            "compute_s": sum(r["stats"].get("elapsed_s", 0.0) for r in log),
            "task_s": sum(r["end"] - r["start"] for r in log),
            "peak_local_bytes": max((r["stats"].get("peak_local_bytes", 0) for r in log), default=0),
            "scan_bytes": sum(r["stats"].get("scan_bytes", 0) for r in log),
            "spill_files": sum(r["stats"].get("spill_files", 0) for r in log),
            "nodes": len({r["node_id"] for r in log}),
            "elements": {name: {k: after[name][k] - before[name][k] for k in ("bytes_written", "bytes_read")}
                         for name in after if name in before},
        }
        return DistributedResult(qid, table, list(root["columns"]), bool(plan["ordered"]), stats, tasks, stages)

    def _wait(self, qid: str, stages: List[Dict[str, Any]], owner: Dict[Any, Tuple[int, int, int]],
              results: Dict[Tuple[int, int], Dict[str, Any]]) -> None:
        """Waits for every task; raises on the first failure or stall."""
        ray = self._ray
        order = {s["id"]: k for k, s in enumerate(stages)}
        pending = list(owner)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=self.task_timeout)
            if not ready:
                done_stages = {s for (s, _) in results}
                waiting = [f"stage {s} task {t}" for s, t, _ in (owner[r] for r in pending)
                           if all(i in done_stages for i in next(x for x in stages if x["id"] == s)["inputs"])]
                raise DistributedQueryError(
                    f"query {qid}: no task finished for {self.task_timeout:g} s (task_timeout); running or "
                    f"waiting for a CPU: {', '.join(waiting[:8]) or 'none'}", qid, cause="timeout")
            # Several may have failed at once (a task and those reading it): blame the
            # earliest in plan order, the one the others failed from.
            more, _ = ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
            failed = []
            for ref in ready + more:
                try:
                    value = ray.get(ref)
                except Exception as exc:  # the task's own error, or Ray's (crash, cancel)
                    failed.append((order[owner[ref][0]], owner[ref][1], ref, exc))
                    continue
                results[(value["stage"], value["task"])] = value
            pending = [r for r in pending if r not in more]
            if failed:
                _, _, ref, error = min(failed, key=lambda f: (f[0], f[1]))
                s, t, _ = owner[ref]
                cause = _cause(error)
                if cause.startswith("MemoryError") and "cannot fit an allocation" in cause:
                    cause += (f" (the task's region, {self.region_bytes} bytes in each memory element, is full: "
                              "raise region_bytes)")
                lost = self._lost_elements()
                if lost:
                    self._broken = f"memory element(s) {', '.join(lost)} died (their tables are gone)"
                    cause += f"; {self._broken}"
                raise DistributedQueryError(f"query {qid}: stage {s} task {t} failed: {cause}", qid, s, t, cause)

    def _finish(self, owner: Dict[Any, Tuple[int, int, int]], slots: List[int]) -> None:
        """After a query, whatever happened: cancels its unfinished tasks, waits up to
        ``cancel_grace`` for them to stop, and returns the slots of every task that has
        stopped (the others when they stop) and of tasks never submitted."""
        ray = self._ray
        handed = {v[2] for v in owner.values()}
        self._give([k for k in slots if k not in handed])
        refs = list(owner)
        if not refs:
            return
        done, running = ray.wait(refs, num_returns=len(refs), timeout=0)
        for r in running:
            try:
                ray.cancel(r, force=True)
            except Exception:  # finished meanwhile, or already gone: nothing to stop
                pass
        if running:
            more, running = ray.wait(running, num_returns=len(running), timeout=self.cancel_grace)
            done = done + more
        self._give([owner[r][2] for r in done])
        for r in running:
            self._draining[r] = owner[r][2]

    def _element_stats(self) -> Dict[str, Dict[str, int]]:
        ray = self._ray
        refs = {name: a.stats.remote() for name, a in self._actors.items()}
        out = {}
        for name, ref in refs.items():
            try:
                out[name] = dict(ray.get(ref, timeout=30))
            except Exception:  # a dead element has no stats; _lost_elements says so
                pass
        return out

    def _lost_elements(self) -> List[str]:
        stats = self._element_stats()
        return [name for name in self._actors if name not in stats]

    # -- closing ---------------------------------------------------------------------

    def close(self) -> None:
        """Stops the memory element actors (and the local Ray instance this session
        started). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._teardown()

    def _teardown(self) -> None:
        ray = self._ray
        for r in list(self._draining):
            try:
                ray.cancel(r, force=True)
            except Exception:  # finished meanwhile
                pass
        self._draining.clear()
        for actor in self._actors.values():
            _stop(ray, actor)
        self._actors.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "DistributedSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._actors)} memory elements"
        return (f"DistributedSession({self.id}, {state}, partitions={self.partitions}, budget={self.budget}, "
                f"tables={sorted(self._tables_in)})")


def _concat(pa, parts: List[Any], columns: List[str]) -> Any:
    """The root's frames as one table under the query's column names (frames store
    duplicate names made unique)."""
    if not parts:
        return pa.table({f"_{k}": pa.array([], pa.null()) for k in range(len(columns))}).rename_columns(columns)
    try:
        table = pa.concat_tables(parts)
    except pa.ArrowInvalid:
        table = pa.concat_tables(parts, promote_options="permissive")
    return table.rename_columns(columns) if len(columns) == table.num_columns else table


def run_sql(sql: str, address: Optional[str], tables: Dict[str, Any]) -> DistributedResult:
    """``scad.sql(sql, ray=address, **tables)``: one query in its own session."""
    with DistributedSession(tables, address=address) as ds:
        return ds.sql(sql)

