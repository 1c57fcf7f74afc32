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
  when one is set, ``max_retries=0``, ``SPREAD``, named ``QUERY/stageS/taskT``). The
  driver is the engine's own (``_native.DistributedQuery``, the same that
  ``QuerySession::run_distributed`` drives in Rust): it hands out the spec of every
  task whose input stages are done — so independent stages run at the same time — and
  takes each task's output back. A task (``_native.run_task``) connects to the memory
  elements, opens the tables and its inputs from their metadata, plans the query, runs
  its share of its stage and returns the metadata of what it wrote. Only metadata
  passes through Ray; data goes between tasks and memory elements.

Allocation without coordination, by **per-task slots**: the driver's
``DistributedQuery`` reserves one slot of ``region_bytes`` per task of the query in
every memory element, above the tables, and a task's spec confines its allocators to
its slot, so its outputs and spill files land only there. Why:

* no allocator round trip per allocation: tasks allocate locally, in parallel, and
  RDMA stays one-sided (a memory server never decides anything);
* nothing can leak: the reservation lives until the query ends (consumers read the
  outputs in it), then goes back whole, whatever the query's fate; a task that died,
  or was killed, with half its output written, loses nothing a later query could not
  reuse.

A query needing more slots than are free is refused before anything runs (raise
``element_bytes`` or lower ``region_bytes``); a task that writes more than its slot
fails with the allocator's out-of-memory error.

Failures: the driver waits on the tasks with ``ray.wait``; on the first failure (the
task's own error, its worker or node dying, or no task finishing for ``task_timeout``
seconds) it starts no other task, force-cancels the running ones, waits for them to stop
(``cancel_grace``; a query whose cancelled tasks do not stop keeps its slots until they
do), frees the query's slots and raises :class:`DistributedQueryError`
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
from typing import Any, Dict, List, Optional, Tuple

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


def _stage_task(ctx: Dict[str, Any], tables: str, spec: str) -> Dict[str, Any]:
    """One task of a query in a Ray worker: ``spec`` from ``DistributedQuery.next_task``
    (without the tables: ``tables``, put in Ray's object store once per query, and
    shared by its tasks), run over a store of its own (a page pool must not keep pages
    of a slot an earlier query wrote); ``ctx``: the memory elements' durls and the pool
    size."""
    import ray

    from .array import Store

    start = time.time()
    store = Store(dict(ctx["elements"]), pool_bytes=ctx["pool_bytes"])
    output = _native.run_task(store._store, spec, tables)
    return {"output": output, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
            "start": start, "end": time.time()}


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
        # Slots held per query (running, or failed with cancelled tasks still running).
        self._held: Dict[str, int] = {}
        # A failed query whose cancelled tasks have not stopped: its refs and its
        # DistributedQuery (which holds the slots until dropped).
        self._draining: Dict[str, Tuple[List[Any], Any]] = {}
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
        base = -(-top // SLOT_ALIGN) * SLOT_ALIGN
        self.slots = (self.element_bytes - base) // self.region_bytes
        if self.slots < 1:
            raise ValueError(f"the tables take {base} bytes of each memory element's {self.element_bytes}: "
                             f"no room for a {self.region_bytes}-byte region; raise element_bytes")
        self._ctx = ray.put({"elements": durls, "pool_bytes": self.pool_bytes})

    # -- slots -----------------------------------------------------------------------

    @property
    def slots_in_use(self) -> int:
        """Slots (allocation regions) held now: 0 between queries, unless cancelled
        tasks of a failed query have not stopped yet."""
        self._reap()
        with self._lock:
            return sum(self._held.values())

    def _reap(self) -> None:
        """Frees the slots of failed queries whose cancelled tasks have stopped since."""
        for qid, (refs, query) in list(self._draining.items()):
            _, running = self._ray.wait(refs, num_returns=len(refs), timeout=0)
            if not running:
                query.abandon()
                del self._draining[qid]
                with self._lock:
                    self._held.pop(qid, None)

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
        fails, dies or stalls, or when the query needs more regions than are free."""
        import pyarrow as pa

        self._check_usable()
        self._reap()
        ray = self._ray
        t0 = time.perf_counter()
        plan = self._session.stages(sql)
        stages = plan["stages"]
        tasks_wanted = sum(int(s["tasks"]) for s in stages)
        with self._lock:
            free = self.slots - sum(self._held.values())
            if tasks_wanted > free:
                raise DistributedQueryError(
                    f"the query has {tasks_wanted} tasks but only {free} of {self.slots} allocation regions are "
                    f"free (region_bytes={self.region_bytes}, element_bytes={self.element_bytes}): raise "
                    "element_bytes or lower region_bytes")
            self._queries += 1
            qid = f"{self.id}-q{self._queries}"
            self._held[qid] = tasks_wanted
        try:
            query = _native.DistributedQuery(self._session._raw, sql, self.region_bytes)
        except BaseException:
            with self._lock:
                self._held.pop(qid, None)
            raise
        plan_s = time.perf_counter() - t0
        before = self._element_stats()
        _, task_fn = _remote(ray)
        options: Dict[str, Any] = {"num_cpus": 1, "max_retries": 0, "scheduling_strategy": "SPREAD"}
        if self.budget:
            options["memory"] = self.budget
        # The tables' metadata (megabytes at SF 1) travels once per query, not per task.
        tables = ray.put(query.tables())
        running: Dict[Any, Tuple[int, int, float]] = {}  # ref -> (stage, task, handed out at)
        log: List[Dict[str, Any]] = []
        finished = False
        try:
            failure: Optional[Tuple[int, int, str]] = None
            while True:
                while failure is None:
                    ready = query.next_task(with_tables=False)
                    if ready is None:
                        break
                    stage, task, spec = ready
                    ref = task_fn.options(name=f"{qid}/stage{stage}/task{task}", **options).remote(
                        self._ctx, tables, spec)
                    running[ref] = (stage, task, query.clock())
                if not running:
                    break
                done, _ = ray.wait(list(running), num_returns=1, timeout=self.task_timeout)
                if not done:
                    waiting = [f"stage {s} task {t}" for s, t, _ in running.values()]
                    raise DistributedQueryError(
                        f"query {qid}: no task finished for {self.task_timeout:g} s (task_timeout); running or "
                        f"waiting for a CPU: {', '.join(waiting[:8])}", qid, cause="timeout")
                for ref in done:
                    stage, task, began = running.pop(ref)
                    try:
                        value = ray.get(ref)
                    except Exception as exc:  # the task's own error, or Ray's (crash, cancel)
                        cause = _cause(exc)
                        query.task_failed(stage, task, cause)
                        if failure is None:
                            failure = (stage, task, cause)
                        continue
                    query.task_done(value["output"], began)
                    log.append(value)
            if failure is not None:
                s, t, cause = failure
                if cause.startswith("MemoryError") and "cannot fit an allocation" in cause:
                    cause += (f" (the task's region, {self.region_bytes} bytes in each memory element, is full: "
                              "raise region_bytes)")
                lost = self._lost_elements()
                if lost:
                    self._broken = f"memory element(s) {', '.join(lost)} died (their tables are gone)"
                    cause += f"; {self._broken}"
                raise DistributedQueryError(f"query {qid}: stage {s} task {t} failed: {cause}", qid, s, t, cause)
            t1 = time.perf_counter()
            answer, info = query.finish()
            finished = True
            table = _named(pa.table(answer), stages[-1]["columns"])
            read_s = time.perf_counter() - t1
        finally:
            if finished:
                with self._lock:
                    self._held.pop(qid, None)
            else:
                self._stop_query(qid, query, list(running))
        after = self._element_stats()
        outputs = [json.loads(v["output"]) for v in log]
        tasks = sorted(({"stage": o["stage"], "task": o["task"], "node_id": v["node_id"], "pid": v["pid"],
                         "start": v["start"], "end": v["end"], "stats": _task_stats(o, self.budget)}
                        for o, v in zip(outputs, log)), key=lambda r: (r["stage"], r["task"]))
        root = stages[-1]["id"]
        stats = {
            "elapsed_s": time.perf_counter() - t0, "plan_s": plan_s, "read_s": read_s,
            "stages": len(stages), "tasks": len(tasks), "slots": tasks_wanted, "rows": table.num_rows,
            "partitions": self.partitions,
            "shuffle_bytes": info["shuffle_bytes"],
            "root_bytes": sum(o["bytes_written"] for o in outputs if o["stage"] == root),
            "compute_s": sum(o["elapsed_s"] for o in outputs),
            "task_s": sum(v["end"] - v["start"] for v in log),
            "peak_local_bytes": max((o["peak_local_bytes"] for o in outputs), default=0),
            "scan_bytes": sum(o["scan_bytes"] for o in outputs),
            "spill_files": sum(o["spill_files"] for o in outputs),
            "nodes": len({v["node_id"] for v in log}),
            "elements": {name: {k: after[name][k] - before[name][k] for k in ("bytes_written", "bytes_read")}
                         for name in after if name in before},
        }
        return DistributedResult(qid, table, list(stages[-1]["columns"]), bool(plan["ordered"]), stats, tasks,
                                 stages)

    def _stop_query(self, qid: str, query: Any, refs: List[Any]) -> None:
        """After a failed query: force-cancels its running tasks and waits up to
        ``cancel_grace`` for them to stop; frees its slots then, or when they stop."""
        ray = self._ray
        for r in refs:
            try:
                ray.cancel(r, force=True)
            except Exception:  # finished meanwhile, or already gone: nothing to stop
                pass
        running = refs
        if refs:
            _, running = ray.wait(refs, num_returns=len(refs), timeout=self.cancel_grace)
        if running:
            self._draining[qid] = (list(running), query)
            return
        query.abandon()
        with self._lock:
            self._held.pop(qid, None)

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
        for refs, query in self._draining.values():
            for r in refs:
                try:
                    ray.cancel(r, force=True)
                except Exception:  # finished meanwhile
                    pass
            query.abandon()
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


def _task_stats(output: Dict[str, Any], budget: Optional[int]) -> Dict[str, Any]:
    """A task's figures as ``QuerySession.run_stage_task`` reports them."""
    keys = ("elapsed_s", "rows", "peak_local_bytes", "scan_bytes", "spill_files", "bytes_written")
    return {"budget": budget, **{k: output[k] for k in keys}}


def _named(table: Any, columns: List[str]) -> Any:
    """The answer under the query's column names (frames store duplicate names made
    unique)."""
    return table.rename_columns(columns) if len(columns) == table.num_columns else table


def run_sql(sql: str, address: Optional[str], tables: Dict[str, Any]) -> DistributedResult:
    """``scad.sql(sql, ray=address, **tables)``: one query in its own session."""
    with DistributedSession(tables, address=address) as ds:
        return ds.sql(sql)

