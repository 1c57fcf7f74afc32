"""Dataframes in memory elements: :class:`RemoteFrame`, :class:`FrameEnv` and the
expression builder (:func:`col`, :func:`lit`, :func:`when`).

Data goes in and out through the Arrow PyCapsule interface, so anything that speaks
``__arrow_c_stream__`` works: Polars and PyArrow directly, pandas/DuckDB through them::

    import polars as pl, scad
    from scad.frame import col, lit

    env = scad.FrameEnv(store, budget=64 << 20)
    sales = scad.RemoteFrame.from_arrow(env, pl.read_parquet("store_sales.parquet"))
    big = sales.filter((col("ss_quantity") > 10) & col("ss_store_sk").is_in([1, 2]))
    per_store = big.group_by("ss_store_sk").agg(col("ss_net_paid").sum().alias("paid"))
    per_store.to_polars(); env.stats()      # time_s, bytes_in/out, peak_local_bytes, ...
    meta = per_store.meta                   # JSON text: all the next element needs

Expressions are built here (not Polars' own serialized expressions, whose format changes
between Polars releases) and evaluated by the Rust Polars the wheel was built with, with
Python Polars' semantics for literals (``col("x") + 1`` keeps the type of ``x``).
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import json
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _native

__all__ = ["FrameEnv", "RemoteFrame", "GroupBy", "Expr", "col", "lit", "when"]

_EPOCH = _dt.date(1970, 1, 1)


class Expr:
    """A column expression (a JSON-able tree). Build with :func:`col` / :func:`lit` and
    Python operators: ``== != < <= > >=``, ``& | ^ ~``, ``+ - * / // %``, unary ``-``."""

    __slots__ = ("node",)
    __hash__ = None  # type: ignore[assignment]  # == builds an expression

    def __init__(self, node: Dict[str, Any]):
        self.node = node

    # -- helpers ---------------------------------------------------------------
    def _bin(self, kind: str, other: Any, swap: bool = False) -> "Expr":
        o = _to_expr(other)
        left, right = (o, self) if swap else (self, o)
        return Expr({"op": "bin", "kind": kind, "left": left.node, "right": right.node})

    def _wrap(self, op: str, **extra: Any) -> "Expr":
        return Expr({"op": op, "expr": self.node, **extra})

    def __bool__(self) -> bool:
        raise TypeError("an Expr has no truth value: use & | ~ instead of and/or/not, "
                        "and (a < b) & (b < c) instead of a < b < c")

    def __repr__(self) -> str:
        return f"Expr({_show(self.node)})"

    def to_json(self) -> str:
        return json.dumps(self.node)

    # -- comparisons, logic, arithmetic ----------------------------------------
    def __eq__(self, other: Any) -> "Expr":  # type: ignore[override]
        return self._bin("eq", other)

    def __ne__(self, other: Any) -> "Expr":  # type: ignore[override]
        return self._bin("neq", other)

    def __lt__(self, other: Any) -> "Expr":
        return self._bin("lt", other)

    def __le__(self, other: Any) -> "Expr":
        return self._bin("le", other)

    def __gt__(self, other: Any) -> "Expr":
        return self._bin("gt", other)

    def __ge__(self, other: Any) -> "Expr":
        return self._bin("ge", other)

    def __and__(self, other: Any) -> "Expr":
        return self._bin("and", other)

    def __rand__(self, other: Any) -> "Expr":
        return self._bin("and", other, swap=True)

    def __or__(self, other: Any) -> "Expr":
        return self._bin("or", other)

    def __ror__(self, other: Any) -> "Expr":
        return self._bin("or", other, swap=True)

    def __xor__(self, other: Any) -> "Expr":
        return self._bin("xor", other)

    def __invert__(self) -> "Expr":
        return self._wrap("not")

    def __add__(self, other: Any) -> "Expr":
        return self._bin("add", other)

    def __radd__(self, other: Any) -> "Expr":
        return self._bin("add", other, swap=True)

    def __sub__(self, other: Any) -> "Expr":
        return self._bin("sub", other)

    def __rsub__(self, other: Any) -> "Expr":
        return self._bin("sub", other, swap=True)

    def __mul__(self, other: Any) -> "Expr":
        return self._bin("mul", other)

    def __rmul__(self, other: Any) -> "Expr":
        return self._bin("mul", other, swap=True)

    def __truediv__(self, other: Any) -> "Expr":
        return self._bin("truediv", other)

    def __rtruediv__(self, other: Any) -> "Expr":
        return self._bin("truediv", other, swap=True)

    def __floordiv__(self, other: Any) -> "Expr":
        return self._bin("floordiv", other)

    def __rfloordiv__(self, other: Any) -> "Expr":
        return self._bin("floordiv", other, swap=True)

    def __mod__(self, other: Any) -> "Expr":
        return self._bin("mod", other)

    def __neg__(self) -> "Expr":
        return self._wrap("neg")

    def not_(self) -> "Expr":
        return self._wrap("not")

    # -- predicates --------------------------------------------------------------
    def is_null(self) -> "Expr":
        return self._wrap("is_null")

    def is_not_null(self) -> "Expr":
        return self._wrap("is_not_null")

    def is_in(self, values: Iterable[Any]) -> "Expr":
        """True where the value is one of ``values`` (ints, floats, strings, bools or dates)."""
        vals = list(values)
        dtype = _list_dtype(vals)
        if dtype == "date":
            vals = [None if v is None else _days(v) for v in vals]
        return self._wrap("is_in", values=vals, dtype=dtype)

    def is_between(self, lower: Any, upper: Any, closed: str = "both") -> "Expr":
        """``lower <= x <= upper`` (``closed``: both, left, right, none)."""
        if closed not in ("both", "left", "right", "none"):
            raise ValueError(f"closed must be both, left, right or none, got {closed!r}")
        return self._wrap("between", lower=_to_expr(lower).node, upper=_to_expr(upper).node, closed=closed)

    # -- transformations -----------------------------------------------------------
    def alias(self, name: str) -> "Expr":
        return self._wrap("alias", name=str(name))

    def cast(self, dtype: str) -> "Expr":
        """Strict cast to ``bool``, ``int8``..``int64``, ``uint8``..``uint64``, ``float32``,
        ``float64``, ``string``, ``date`` or ``decimal(P,S)``."""
        return self._wrap("cast", dtype=str(dtype))

    def abs(self) -> "Expr":
        return self._wrap("abs")

    def round(self, decimals: int = 0) -> "Expr":
        return self._wrap("round", decimals=int(decimals))

    def fill_null(self, value: Any) -> "Expr":
        return self._wrap("fill_null", value=_to_expr(value).node)

    # -- aggregations (group_by / select) ----------------------------------------
    def _agg(self, name: str) -> "Expr":
        return self._wrap("agg", name=name)

    def sum(self) -> "Expr":
        return self._agg("sum")

    def mean(self) -> "Expr":
        return self._agg("mean")

    def count(self) -> "Expr":
        """Non-null values."""
        return self._agg("count")

    def len(self) -> "Expr":
        """All values, nulls included."""
        return self._agg("len")

    def n_unique(self) -> "Expr":
        return self._agg("n_unique")

    def min(self) -> "Expr":
        return self._agg("min")

    def max(self) -> "Expr":
        return self._agg("max")

    def first(self) -> "Expr":
        return self._agg("first")

    def last(self) -> "Expr":
        return self._agg("last")

    def median(self) -> "Expr":
        return self._agg("median")

    def std(self) -> "Expr":
        return self._agg("std")

    def var(self) -> "Expr":
        return self._agg("var")


def col(name: str) -> Expr:
    """The column ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"column names are strings, got {type(name).__name__}")
    return Expr({"op": "col", "name": name})


def _days(v: Any) -> int:
    if isinstance(v, _dt.datetime):
        raise TypeError("datetime values are not supported (frames hold dates)")
    if not isinstance(v, _dt.date):
        raise TypeError(f"expected a date, got {type(v).__name__}")
    return (v - _EPOCH).days


def lit(value: Any) -> Expr:
    """A literal: None, bool, int, float, str, ``datetime.date`` or ``decimal.Decimal``."""
    if isinstance(value, Expr):
        return value
    if value is None or isinstance(value, (bool, int, float, str)):
        return Expr({"op": "lit", "value": value})
    if isinstance(value, _dt.date):
        return Expr({"op": "lit_date", "days": _days(value)})
    if isinstance(value, _decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"decimal literal must be finite, got {value}")
        sign, digits, exp = value.as_tuple()
        scale = max(0, -int(exp))
        unscaled = int(value.scaleb(scale))
        return Expr({"op": "lit_decimal", "unscaled": str(unscaled), "scale": scale})
    raise TypeError(f"unsupported literal type {type(value).__name__}")


def _to_expr(v: Any) -> Expr:
    return v if isinstance(v, Expr) else lit(v)


def _list_dtype(vals: List[Any]) -> str:
    kinds = set()
    for v in vals:
        if v is None:
            continue
        if isinstance(v, bool):
            kinds.add("bool")
        elif isinstance(v, int):
            kinds.add("int64")
        elif isinstance(v, float):
            kinds.add("float64")
        elif isinstance(v, str):
            kinds.add("string")
        elif isinstance(v, _dt.date) and not isinstance(v, _dt.datetime):
            kinds.add("date")
        else:
            raise TypeError(f"is_in takes ints, floats, strings, bools or dates, got {type(v).__name__}")
    if kinds <= {"int64"}:
        return "int64"
    if kinds == {"int64", "float64"} or kinds == {"float64"}:
        return "float64"
    if len(kinds) == 1:
        return kinds.pop()
    raise TypeError(f"is_in values must be of one kind, got {sorted(kinds)}")


class _When:
    def __init__(self, branches: List[Tuple[Dict[str, Any], Optional[Dict[str, Any]]]]):
        self._branches = branches

    def then(self, value: Any) -> "_Then":
        cond, _ = self._branches[-1]
        return _Then(self._branches[:-1] + [(cond, _to_expr(value).node)])


class _Then(Expr):
    __slots__ = ("_branches",)

    def __init__(self, branches: List[Tuple[Dict[str, Any], Optional[Dict[str, Any]]]]):
        self._branches = branches
        super().__init__({"op": "when", "branches": [list(b) for b in branches]})

    def when(self, condition: Any) -> _When:
        return _When(self._branches + [(_to_expr(condition).node, None)])

    def otherwise(self, value: Any) -> Expr:
        return Expr({"op": "when", "branches": [list(b) for b in self._branches],
                     "otherwise": _to_expr(value).node})


def when(condition: Any) -> _When:
    """``when(cond).then(a).when(cond2).then(b).otherwise(c)`` (null without otherwise)."""
    return _When([(_to_expr(condition).node, None)])


def _show(n: Dict[str, Any]) -> str:
    op = n.get("op")
    if op == "col":
        return f"col({n['name']!r})"
    if op == "lit":
        return repr(n["value"])
    if op == "bin":
        return f"({_show(n['left'])} {n['kind']} {_show(n['right'])})"
    inner = _show(n["expr"]) if isinstance(n.get("expr"), dict) else ""
    return f"{op}({inner})"


def _exprs(items: Sequence[Any], what: str) -> str:
    out = []
    for e in items:
        if isinstance(e, str):
            e = col(e)
        if isinstance(e, (list, tuple)):
            out.extend(json.loads(_exprs(e, what)))
            continue
        if not isinstance(e, Expr):
            raise TypeError(f"{what} takes column names or scad.frame expressions, got {type(e).__name__}"
                            + (" (Polars expressions are not accepted: use scad.frame.col/lit)"
                               if type(e).__module__.startswith("polars") else ""))
        out.append(e.node)
    return json.dumps(out)


def _names(v: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(v, str):
        return [v]
    names = list(v)
    if not all(isinstance(n, str) for n in names):
        raise TypeError("column names are strings")
    return names


class FrameEnv:
    """Where frames live (a :class:`scad.Store`), the local memory ``budget`` (bytes)
    kernels keep to, rows per stored chunk, and the kernel counters."""

    def __init__(self, store: Any, budget: Optional[int] = None, chunk_rows: Optional[int] = None,
                 elements: Optional[Sequence[str]] = None):
        self.store = store
        self._env = _native.FrameEnv(store._store, budget, chunk_rows,
                                     None if elements is None else list(elements))

    @property
    def budget(self) -> Optional[int]:
        return self._env.budget

    @property
    def chunk_rows(self) -> int:
        return self._env.chunk_rows

    def stats(self) -> Dict[str, Any]:
        """time_s, bytes_in, bytes_out, peak_local_bytes, spill_files (cumulative
        since creation or :meth:`reset_stats`)."""
        return dict(self._env.stats())

    def reset_stats(self) -> None:
        self._env.reset_stats()

    def reserve(self, *frames: Union["RemoteFrame", str]) -> None:
        """Keeps new frames clear of ``frames`` (or their metadata) received from another
        element when no allocation state came with them."""
        self._env.reserve_frames([f.meta if isinstance(f, RemoteFrame) else f for f in frames])


class RemoteFrame:
    """A table stored in memory elements chunk by chunk, with kernels whose local memory
    stays within the env's budget; each kernel returns a new RemoteFrame."""

    def __init__(self, env: FrameEnv, raw: "_native.Frame"):
        self.env = env
        self._raw = raw

    # -- in and out -------------------------------------------------------------
    @classmethod
    def from_arrow(cls, env: FrameEnv, data: Any) -> "RemoteFrame":
        """Writes any object with ``__arrow_c_stream__`` (a Polars DataFrame, a PyArrow
        Table or RecordBatchReader, ...) batch by batch."""
        stream = getattr(data, "__arrow_c_stream__", None)
        if stream is None:
            raise TypeError(f"{type(data).__name__} does not export Arrow data (__arrow_c_stream__); "
                            "pass a Polars DataFrame or a PyArrow Table/RecordBatchReader")
        return cls(env, _native.Frame.from_stream(env._env, stream()))

    from_polars = from_arrow

    @classmethod
    def from_pandas(cls, env: FrameEnv, df: Any) -> "RemoteFrame":
        import pyarrow as pa

        return cls.from_arrow(env, pa.Table.from_pandas(df, preserve_index=False))

    @classmethod
    def from_meta(cls, env: FrameEnv, meta: str) -> "RemoteFrame":
        """Opens a frame from :attr:`meta` (JSON text), after checking that memory still
        holds it (its seal and chunk heads: a few bytes are read); raises
        :class:`scad.StaleFrameError` for a frame that was freed or whose memory was
        reused."""
        if not isinstance(meta, str):
            meta = json.dumps(meta)
        return cls(env, _native.Frame.open(env._env, meta))

    def with_env(self, env: FrameEnv) -> "RemoteFrame":
        """The same data under another env (e.g. one with a smaller budget)."""
        return RemoteFrame(env, self._raw.with_env(env._env))

    @property
    def meta(self) -> str:
        """The frame's metadata as JSON text: hand it to the next element."""
        return self._raw.meta_json()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """Arrow PyCapsule interface: a stream that reads batches as they are consumed
        (``requested_schema`` is not honoured; consumers check the schema)."""
        return self._raw.stream(None)

    def to_arrow(self, columns: Optional[Sequence[str]] = None) -> Any:
        """The frame (or some columns) as a PyArrow Table (strings as ``string_view``)."""
        import pyarrow as pa

        return pa.table(_Capsule(self._raw.read(_opt_names(columns))))

    def to_polars(self, columns: Optional[Sequence[str]] = None) -> Any:
        """The frame (or some columns) as a Polars DataFrame."""
        import polars as pl

        return pl.DataFrame(_Capsule(self._raw.read(_opt_names(columns))))

    def to_pandas(self, columns: Optional[Sequence[str]] = None) -> Any:
        return self.to_arrow(columns).to_pandas()

    # -- shape --------------------------------------------------------------------
    def __len__(self) -> int:
        return self._raw.rows

    @property
    def height(self) -> int:
        return self._raw.rows

    @property
    def columns(self) -> List[str]:
        return list(self._raw.columns)

    @property
    def schema(self) -> Dict[str, str]:
        """Column name -> type (``int64``, ``string``, ``decimal(7,2)``, ``date``, ...)."""
        return dict(self._raw.schema())

    @property
    def nbytes(self) -> int:
        """Bytes of the columns in local memory once read."""
        return self._raw.data_bytes

    @property
    def stored_nbytes(self) -> int:
        """Bytes of the columns as stored in the memory elements (integers, dates and
        decimals spanning a small range per chunk are packed)."""
        return self._raw.stored_bytes

    @property
    def chunk_count(self) -> int:
        return self._raw.chunk_count

    @property
    def freed(self) -> bool:
        """Whether the frame was freed (through this handle or another of the same frame)."""
        return self._raw.freed

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v}" for k, v in self.schema.items())
        state = ", freed" if self.freed else ""
        return f"RemoteFrame({self.height} rows; {cols}{state})"

    # -- kernels ------------------------------------------------------------------
    def _new(self, raw: "_native.Frame") -> "RemoteFrame":
        return RemoteFrame(self.env, raw)

    def filter(self, *predicates: Expr) -> "RemoteFrame":
        """Rows where all predicates are true."""
        if not predicates:
            raise ValueError("filter needs a predicate")
        pred = predicates[0]
        for p in predicates[1:]:
            pred = pred & p
        if not isinstance(pred, Expr):
            raise TypeError(f"filter takes scad.frame expressions, got {type(pred).__name__}")
        return self._new(self._raw.filter(pred.to_json()))

    def select(self, *exprs: Union[str, Expr]) -> "RemoteFrame":
        return self._new(self._raw.select(_exprs(exprs, "select")))

    def with_columns(self, *exprs: Expr) -> "RemoteFrame":
        return self._new(self._raw.with_columns(_exprs(exprs, "with_columns")))

    def join(self, other: "RemoteFrame", on: Union[str, Sequence[str], None] = None, *,
             left_on: Union[str, Sequence[str], None] = None,
             right_on: Union[str, Sequence[str], None] = None, how: str = "inner") -> "RemoteFrame":
        """Joins on ``on`` (or ``left_on`` = ``right_on``); ``how``: inner, left, right,
        full, semi, anti. Columns as Polars gives them: the right key columns are
        dropped (inner, left; the left ones for right joins), clashing names get
        ``_right``; row order is unspecified."""
        if not isinstance(other, RemoteFrame):
            raise TypeError("join takes another RemoteFrame")
        if on is not None:
            if left_on is not None or right_on is not None:
                raise ValueError("give either on or left_on/right_on")
            left_on = right_on = on
        if left_on is None or right_on is None:
            raise ValueError("join needs on, or left_on and right_on")
        return self._new(self._raw.join(other._raw, _names(left_on), _names(right_on), how))

    def group_by(self, *keys: Union[str, Sequence[str]]) -> "GroupBy":
        names: List[str] = []
        for k in keys:
            names.extend(_names(k))
        return GroupBy(self, names)

    def sort(self, by: Union[str, Sequence[str]], *, descending: Union[bool, Sequence[bool]] = False,
             nulls_last: bool = False, limit: Optional[int] = None) -> "RemoteFrame":
        """Sorts (stably); with ``limit`` keeps the first rows only (a streaming top-k)."""
        names = _names(by)
        desc = [bool(descending)] * len(names) if isinstance(descending, bool) else [bool(d) for d in descending]
        return self._new(self._raw.sort(names, desc, nulls_last, limit))

    def unique(self, subset: Union[str, Sequence[str], None] = None) -> "RemoteFrame":
        """Distinct rows (over ``subset``); row order is unspecified."""
        return self._new(self._raw.distinct(None if subset is None else _names(subset)))

    distinct = unique

    def limit(self, n: int) -> "RemoteFrame":
        if n < 0:
            raise ValueError("limit takes a non-negative row count")
        return self._new(self._raw.limit(int(n)))

    head = limit

    def free(self) -> None:
        """Gives the frame's remote memory back. Every later use of the frame (reading,
        kernels, queries, :attr:`meta`, freeing again) raises
        :class:`scad.FreedFrameError` naming it, and its metadata no longer opens."""
        self._raw.free()


class GroupBy:
    """``frame.group_by(keys).agg(*exprs)``."""

    def __init__(self, frame: RemoteFrame, keys: List[str]):
        if not keys:
            raise ValueError("group_by needs at least one key column")
        self.frame = frame
        self.keys = keys

    def agg(self, *aggs: Expr) -> RemoteFrame:
        return self.frame._new(self.frame._raw.group_by(self.keys, _exprs(aggs, "agg")))


def _opt_names(columns: Optional[Sequence[str]]) -> Optional[List[str]]:
    return None if columns is None else _names(columns)


class _Capsule:
    """Hands an already made stream capsule to a consumer that wants ``__arrow_c_stream__``."""

    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self._capsule
