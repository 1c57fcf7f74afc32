"""The modern array API: :class:`Store` (memory elements + page pool) and
:class:`RemoteArray` (a typed NumPy view of a remote array of rows)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native

__all__ = ["Store", "RemoteArray"]


class Store:
    """Memory elements by name sharing one page pool.

    ``Store({"mem0": "tcp://127.0.0.1:2333"}, pool_bytes=64 << 20)``; values are
    ``tcp://HOST:PORT`` urls or full durls (``name;rdma_tcp;url,...;``)."""

    def __init__(self, elements: Optional[Dict[str, str]] = None, pool_bytes: int = 64 << 20,
                 page_size: int = 64 << 10, policy: str = "clock", read_ahead: int = 4):
        self.pool = _native.BufferPool(pool_bytes, page_size, policy, read_ahead)
        self._store = _native.Store(self.pool)
        for name, where in (elements or {}).items():
            self.add_element(name, where)

    def add_element(self, name: str, where: str) -> None:
        """Adds memory element ``name`` at ``where`` (url or durl)."""
        durl = where if ";" in where else f"{name};rdma_tcp;url,{where};"
        self._store.add_element(name, durl)

    def add_transport(self, name: str, transport: Any) -> None:
        """Adds a ``disagg`` transport (from ``action.get_transport``) as element ``name``."""
        self._store.add_endpoint(name, transport._ep)

    @property
    def elements(self) -> List[str]:
        return list(self._store.element_names())

    def allocation_state(self) -> str:
        """JSON allocation state, for the next element's :meth:`resume_allocation`."""
        return self._store.allocation_state()

    def resume_allocation(self, state: str) -> None:
        self._store.resume_allocation(state)

    def stats(self) -> Dict[str, Any]:
        """Pool counters: hits, misses, hit_ratio, evictions, write_backs, bytes_in/out..."""
        return dict(self.pool.stats())

    def flush(self) -> None:
        self._store.flush()


#: Stable element type names shared with Rust (``scad_remote_array::array::DTYPES``).
DTYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f32", "f64")


def stable_dtype_name(dtype: Any) -> Optional[str]:
    """The stable name Rust metadata uses for a NumPy dtype (``float64`` -> ``f64``),
    or None when it has none (structured, bool, complex, non-native byte order)."""
    dt = np.dtype(dtype)
    if dt.names is not None or dt.kind not in "uif" or not dt.isnative:
        return None
    name = f"{dt.kind}{dt.itemsize * 8}"
    return name if name in DTYPES else None


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a stable element type name (``f64`` -> ``float64``)."""
    if name not in DTYPES:
        raise ValueError(f"element type {name!r} is not one of {', '.join(DTYPES)}: "
                         "Python opens only these (and rows of bytes, u8)")
    return np.dtype(f"={name[0]}{int(name[1:]) // 8}")


def _row_bytes(shape: Sequence[int], dtype: np.dtype) -> int:
    return int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize if len(shape) > 1 else dtype.itemsize


class RemoteArray:
    """A typed array in memory elements; axis 0 is the row axis."""

    def __init__(self, store: Store, raw: "_native.RemoteBytes", dtype: Any, shape: Sequence[int]):
        self.store = store
        self._raw = raw
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        if raw.rows != (self.shape[0] if self.shape else 1) or raw.row_bytes != _row_bytes(self.shape, self.dtype):
            raise ValueError(f"remote rows ({raw.rows} x {raw.row_bytes} B) do not fit {self.dtype}{self.shape}")

    @classmethod
    def from_numpy(cls, store: Store, array: np.ndarray, elements: Sequence[str] = (),
                   stripe_bytes: Optional[int] = None) -> "RemoteArray":
        """Writes ``array`` out (striped over ``elements``, all by default) and flushes.
        A C-contiguous array is written from its own memory, without a copy."""
        a = np.asarray(array)
        if a.ndim == 0:
            raise ValueError("a remote array needs at least one axis")
        a = np.ascontiguousarray(a)
        rb = _row_bytes(a.shape, a.dtype)
        raw = store._store.put(a.reshape(-1).view(np.uint8), rb, list(elements), stripe_bytes)
        return cls(store, raw, a.dtype, a.shape)

    @classmethod
    def empty(cls, store: Store, shape: Union[int, Sequence[int]], dtype: Any = np.float64,
              elements: Sequence[str] = (), stripe_bytes: Optional[int] = None) -> "RemoteArray":
        """Reserves room for an array (contents: whatever remote memory holds)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        raw = store._store.empty(shape[0], _row_bytes(shape, dt), list(elements), stripe_bytes)
        return cls(store, raw, dt, shape)

    @property
    def meta(self) -> Dict[str, Any]:
        """Picklable / JSON-able description; open it with :meth:`from_meta`.

        ``meta["extents"]`` is the Rust ``ArrayMeta``: for a numeric dtype in native
        byte order it names the element type (``f64``, ``i32``...) and the real shape,
        so Rust opens it as ``RemoteArray<f64, IxN>``; other dtypes are rows of bytes."""
        self._raw.flush()
        stable = stable_dtype_name(self.dtype)
        typed = self._raw.meta_json(stable, list(self.shape)) if stable else self._raw.meta_json()
        return {"dtype": self.dtype.str if self.dtype.names is None else self.dtype.descr,
                "shape": list(self.shape), "extents": json.loads(typed)}

    @classmethod
    def from_meta(cls, store: Store, meta: Dict[str, Any]) -> "RemoteArray":
        """Opens an array from :attr:`meta`, or from a Rust ``ArrayMeta`` (its JSON
        as a dict: ``dtype`` one of the stable names, ``item_size``, ``shape``,
        ``extents``). Nothing is read yet."""
        try:
            if "item_size" in meta:  # a Rust ArrayMeta
                dtype = numpy_dtype(meta["dtype"])
                raw = store._store.open(json.dumps(meta))
                return cls(store, raw, dtype, meta["shape"])
            dtype = np.dtype(meta["dtype"] if isinstance(meta["dtype"], str) else [tuple(f) for f in meta["dtype"]])
            raw = store._store.open(json.dumps(meta["extents"]))
            return cls(store, raw, dtype, meta["shape"])
        except KeyError as e:
            raise ValueError(f"remote array metadata lacks {e}") from None

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __getitem__(self, key: Union[int, slice]) -> Union["RemoteArray", np.ndarray]:
        """``ra[a:b]`` is a remote slice (no data moved); ``ra[i]`` reads one row."""
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                raise ValueError("remote slices need step 1")
            stop = max(stop, start)
            return RemoteArray(self.store, self._raw.slice(start, stop), self.dtype, (stop - start,) + self.shape[1:])
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"row {key} outside {self.shape[0]} rows")
            return self.to_numpy(i, i + 1)[0]
        raise TypeError(f"remote arrays index by int or slice, not {type(key).__name__}")

    def to_numpy(self, start: int = 0, end: Optional[int] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows ``[start, end)`` as a NumPy array, read straight into it."""
        end = self.shape[0] if end is None else end
        shape = (end - start,) + self.shape[1:]
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        elif out.shape != shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape {shape}")
        if out.size:
            self._raw.read_into(start, end, out.reshape(-1).view(np.uint8))
        else:
            if not 0 <= start <= end <= self.shape[0]:
                raise IndexError(f"rows [{start}, {end}) outside {self.shape[0]} rows")
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_numpy()
        return a if dtype is None else a.astype(dtype)

    def write(self, first_row: int, data: np.ndarray) -> None:
        """Writes whole rows ``data`` starting at ``first_row``."""
        a = np.ascontiguousarray(data, dtype=self.dtype)
        if a.shape[1:] != self.shape[1:]:
            raise ValueError(f"rows of shape {a.shape[1:]} do not fit {self.shape[1:]}")
        self._raw.write_rows(first_row, a.reshape(-1).view(np.uint8))

    def chunks(self, rows: int, read_ahead: bool = True) -> Iterator[Tuple[int, np.ndarray]]:
        """``(first_row, array)`` for consecutive chunks of ``rows`` rows; while the
        caller works on one chunk, the next one's pages are fetched in the background
        (without the GIL)."""
        if rows <= 0:
            raise ValueError("rows per chunk must be positive")
        n = self.shape[0]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="scad-prefetch") as ex:
            ahead = None
            for s in range(0, n, rows):
                e = min(s + rows, n)
                if ahead is not None:
                    try:
                        ahead.result()
                    except Exception:  # noqa: BLE001 - a failed prefetch: the read fetches itself
                        pass
                    ahead = None
                chunk = self.to_numpy(s, e)
                if read_ahead and e < n:
                    ahead = ex.submit(self._raw.prefetch, e, min(e + rows, n))
                yield s, chunk

    @staticmethod
    def concat(parts: Sequence["RemoteArray"]) -> "RemoteArray":
        """Concatenates along axis 0 (no data moved)."""
        if not parts:
            raise ValueError("concat needs at least one array")
        first = parts[0]
        for p in parts:
            if p.dtype != first.dtype or p.shape[1:] != first.shape[1:]:
                raise ValueError(f"cannot concatenate {p.dtype}{p.shape} to {first.dtype}{first.shape}")
        raw = _native.RemoteBytes.concat([p._raw for p in parts])
        return RemoteArray(first.store, raw, first.dtype, (sum(p.shape[0] for p in parts),) + first.shape[1:])

    def stats(self) -> Dict[str, Any]:
        """The pool's counters."""
        return self.store.stats()

    def flush(self) -> None:
        self._raw.flush()

    def __repr__(self) -> str:
        return f"RemoteArray(dtype={self.dtype}, shape={self.shape}, extents={self._raw.extent_count})"
