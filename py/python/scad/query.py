"""SQL over :class:`~scad.RemoteFrame` tables: :func:`sql`, :func:`explain` and
:class:`QuerySession` (the query engine of the ``scad-remote-frame`` crate, on
DataFusion).

Tables are read column by column straight from the memory elements; the query's
operators keep to the env's local memory ``budget`` and spill to its memory elements
when they would exceed it::

    import scad

    env = scad.FrameEnv(store, budget=64 << 20)
    sales = scad.RemoteFrame.from_arrow(env, store_sales)
    items = scad.RemoteFrame.from_arrow(env, item)
    result = scad.sql(
        "SELECT i_category, sum(ss_net_paid) AS paid FROM store_sales "
        "JOIN item ON ss_item_sk = i_item_sk GROUP BY i_category ORDER BY paid DESC",
        store_sales=sales, item=items)
    result.to_polars()          # or .to_arrow(), pa.table(result), pl.DataFrame(result)
    result.stats                # elapsed_s, peak_local_bytes, spill_files, bytes_moved, ...
    print(result.explain_analyze())

    session = scad.QuerySession(env, store_sales=sales)   # several queries, same tables
    session.register("item", items)
    print(session.explain("SELECT count(*) FROM item"))

Errors: :class:`scad.QueryError` (a :class:`scad.ScadError`) for syntax and type errors and
for statements other than queries (DDL, DML);
:class:`scad.UnknownNameError` (a ``QueryError`` and a ``KeyError``) for an unknown table
or column; ``NotImplementedError`` for SQL the engine cannot run;
:class:`scad.BudgetExceededError` when an operator that cannot spill needs more than the
budget. Planning and running release the GIL.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from . import _native
from .frame import FrameEnv, RemoteFrame

__all__ = ["QuerySession", "QueryResult", "sql", "explain"]


class QueryResult:
    """The answer of a query, as Arrow record batches in local memory, with how it was
    computed. An Arrow stream source: ``pa.table(result)`` and ``pl.DataFrame(result)``
    share its buffers."""

    def __init__(self, env: FrameEnv, raw: "_native.QueryResult", session: Optional["QuerySession"] = None):
        self.env = env
        #: The session that ran the query (None for :func:`scad.sql`).
        self.session = session
        self._raw = raw

    @property
    def rows(self) -> int:
        return self._raw.rows

    def __len__(self) -> int:
        return self._raw.rows

    @property
    def ordered(self) -> bool:
        """Whether the query orders its answer (a top-level ``ORDER BY``); otherwise the
        rows come in no particular order."""
        return self._raw.ordered

    @property
    def columns(self) -> List[str]:
        return list(self._raw.columns)

    @property
    def schema(self) -> Dict[str, str]:
        """Column name -> Arrow type as arrow-rs prints it (``Int64``, ``Utf8View``, ...)."""
        return dict(self._raw.schema())

    @property
    def stats(self) -> Dict[str, Any]:
        """elapsed_s, rows, peak_local_bytes, budget (None: unlimited), scan_bytes,
        spill_files, spill_bytes_written, spill_bytes_read, bytes_moved."""
        return dict(self._raw.stats)

    def explain_analyze(self) -> str:
        """The physical plan with each operator's metrics from this run (rows, time,
        bytes read, spills, memory) and the run's totals."""
        return self._raw.explain_analyze()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """Arrow PyCapsule interface: the answer's batches, not copied
        (``requested_schema`` is not honoured; consumers check the schema)."""
        return self._raw.__arrow_c_stream__(requested_schema)

    def to_arrow(self) -> Any:
        """The answer as a PyArrow Table (zero-copy; strings may be ``string_view``)."""
        import pyarrow as pa

        return pa.table(self)

    def to_polars(self) -> Any:
        """The answer as a Polars DataFrame (zero-copy where Polars' types allow)."""
        import polars as pl

        return pl.DataFrame(self)

    def to_pandas(self) -> Any:
        return self.to_arrow().to_pandas()

    def to_remote_frame(self, env: Optional[FrameEnv] = None) -> RemoteFrame:
        """Writes the answer to memory elements as a new :class:`~scad.RemoteFrame`
        (under ``env``, the session's if None), e.g. to register it as a table."""
        env = env if env is not None else self.env
        return RemoteFrame(env, self._raw.to_frame(env._env))

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v}" for k, v in self.schema.items())
        return f"QueryResult({self.rows} rows; {cols})"


class QuerySession:
    """Tables (:class:`~scad.RemoteFrame` objects registered by name) and the env whose
    budget the queries share and whose memory elements they spill to. Queries of one
    session run one at a time."""

    def __init__(self, env: FrameEnv, partitions: Optional[int] = None, **tables: RemoteFrame):
        """``partitions`` pins the partitions plans use (None: as many as the budget
        and this machine's cores give); processes that run stages of one query must
        plan it with the same ``partitions``, budget and tables."""
        if not isinstance(env, FrameEnv):
            raise TypeError(f"QuerySession takes a scad.FrameEnv, got {type(env).__name__}")
        if partitions is not None and (not isinstance(partitions, int) or isinstance(partitions, bool)
                                       or partitions < 1):
            raise ValueError(f"partitions must be a positive integer, got {partitions!r}")
        self.env = env
        self._raw = _native.QuerySession(env._env, partitions)
        for name, frame in tables.items():
            self.register(name, frame)

    def register(self, name: str, frame: RemoteFrame) -> "QuerySession":
        """Makes ``frame`` queryable as table ``name`` (replacing a table of that name)."""
        _check_table(name, frame)
        self._raw.register(name, frame._raw)
        return self

    @property
    def tables(self) -> List[str]:
        """Names of the registered tables, sorted."""
        return list(self._raw.tables())

    @property
    def spill_bytes_held(self) -> int:
        """Remote memory spill files hold now (0 between queries)."""
        return self._raw.spill_bytes_held

    def sql(self, query: str) -> QueryResult:
        """Runs one read-only SQL statement (a query)."""
        return QueryResult(self.env, self._raw.sql(_text(query)), self)

    def explain(self, query: str) -> str:
        """The physical plan of ``query`` (EXPLAIN), without running it."""
        return self._raw.explain(_text(query))

    def stages(self, query: str) -> Dict[str, Any]:
        """``query`` cut into stages at its pipeline breakers and exchanges (join build
        sides, hash repartitions, the inputs of merges, the root), children first:
        ``{"stages": [{"id", "inputs", "operator", "partitions", "tasks", "columns"},
        ...], "ordered": bool}``. A stage runs as ``tasks`` independent tasks
        (:meth:`run_stage_task`). Every session over the same tables with the same
        budget and partitions finds the same stages."""
        return json.loads(self._raw.stages(_text(query)))

    def run_stage(self, query: str, stage: int,
                  inputs: Optional[Dict[int, List[List[str]]]] = None) -> Tuple[List[List[str]], Dict[str, Any]]:
        """Runs every task of stage ``stage`` of ``query`` here from its inputs'
        outputs (``inputs``: stage number -> for each partition of its output, the
        metadata of the frames that make it up, as earlier calls returned them, in this
        process or another) and writes its output to memory elements. Returns the
        output in the same shape (:meth:`scad.RemoteFrame.from_meta` opens a frame)
        and what the stage did."""
        outputs, stats = self._raw.run_stage(_text(query), _index("stage", stage), _stage_inputs(inputs))
        return [list(p) for p in outputs], dict(stats)

    def run_stage_task(self, query: str, stage: int, task: int,
                       inputs: Optional[Dict[int, List[List[str]]]] = None) -> Tuple[List[List[str]], Dict[str, Any]]:
        """Runs task ``task`` of stage ``stage`` (its tasks need nothing from each
        other: run them in any processes, at the same time) and returns the frames it
        wrote for each partition of the stage's output, and what it did. The stage's
        output is its tasks' outputs concatenated partition by partition, in task
        order."""
        outputs, stats = self._raw.run_stage_task(_text(query), _index("stage", stage), _index("task", task),
                                                  _stage_inputs(inputs))
        return [list(p) for p in outputs], dict(stats)

    def __repr__(self) -> str:
        return f"QuerySession(budget={self.env.budget}, tables={self.tables})"


def _index(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a number from 0, got {value!r}")
    return value


def _stage_inputs(inputs: Optional[Dict[int, List[List[str]]]]) -> Dict[int, List[List[str]]]:
    return {_index("an input stage", k): [list(p) for p in v] for k, v in (inputs or {}).items()}


def _text(query: Any) -> str:
    if not isinstance(query, str):
        raise TypeError(f"a query is a string, got {type(query).__name__}")
    return query


def _check_table(name: Any, frame: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"table names are strings, got {type(name).__name__}")
    if not isinstance(frame, RemoteFrame):
        raise TypeError(f"table {name!r}: expected a scad.RemoteFrame, got {type(frame).__name__}"
                        " (write it first: scad.RemoteFrame.from_arrow(env, data))")


def _call(env: Optional[FrameEnv], tables: Dict[str, RemoteFrame]) -> Tuple[FrameEnv, Dict[str, Any]]:
    """The env of a :func:`sql` or :func:`explain` call and its tables' native frames."""
    for name, frame in tables.items():
        _check_table(name, frame)
    if env is None:
        if not tables:
            raise ValueError("give env=, or at least one table (name=RemoteFrame) to take the env from")
        env = next(iter(tables.values())).env
    if not isinstance(env, FrameEnv):
        raise TypeError(f"env must be a scad.FrameEnv, got {type(env).__name__}")
    return env, {name: frame._raw for name, frame in tables.items()}


def sql(query: str, /, env: Optional[FrameEnv] = None, ray: Any = None, **tables: Any) -> Any:
    """Runs ``query`` over the ``tables`` (keyword name -> :class:`~scad.RemoteFrame`)
    under ``env`` (the first table's env if None: its budget applies). Calls on one env
    share one session, started by the first, and run one at a time; each call sees only
    its own tables. For a table called ``env`` or ``ray``, or to keep tables registered
    across queries, use :class:`QuerySession`.

    With ``ray=`` (a Ray address such as ``"auto"``, or True: the Ray this process has
    initialised, else a new local one) the query runs across that Ray cluster instead,
    over tables given as Parquet paths or Arrow tables, in a
    :class:`scad.DistributedSession` opened and closed for it; returns its
    :class:`scad.DistributedResult`."""
    if ray is not None and ray is not False:
        if env is not None:
            raise ValueError("env= does not apply with ray=: the tasks on the cluster make their own envs")
        from .distributed import run_sql

        return run_sql(_text(query), None if ray is True else ray, tables)
    env, raw = _call(env, tables)
    return QueryResult(env, _native.sql_in_env(env._env, _text(query), raw))


def explain(query: str, /, env: Optional[FrameEnv] = None, **tables: RemoteFrame) -> str:
    """The physical plan of ``query`` over ``tables``, without running it (in the env's
    session, as :func:`sql`)."""
    env, raw = _call(env, tables)
    return _native.explain_in_env(env._env, _text(query), raw)
