"""``remote_array``: a NumPy array whose bytes live in memory elements, with the
original interface. Metadata objects are plain Python (they pickle between
processes); data moves through the pool without the GIL, straight into the NumPy
arrays returned.

Fixed relative to the original: no prints, no ``exit()`` (clear exceptions instead),
partial materialize returns rows with the array's row shape, and reads of evicted
pages work (the Rust pool writes dirty pages back before reuse)."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .buffer_pool_lib import _as_bytes, buffer_pool

__all__ = ["remote_array", "remote_array_metadata", "init_empty_remote_array", "merge_arrays_metadata"]


class remote_array_metadata:
    """What a remote array is and where its bytes are.

    ``remote_mem_metadata`` maps the first flat element index of each piece to
    ``[transport, addr, nbytes]``, in order."""

    def __init__(self, dtype: Any, shape: Sequence[int], remote_mem_metadata: "OrderedDict[int, list]"):
        self.dtype = np.dtype(dtype)
        self.element_byte = self.dtype.itemsize
        self.shape = tuple(int(s) for s in shape)
        self.remote_mem_metadata = OrderedDict((int(k), list(v)) for k, v in remote_mem_metadata.items())
        self.cur_mem_size = int(sum(v[2] for v in self.remote_mem_metadata.values()))
        self.validate()

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def row_elements(self) -> int:
        """Elements per index of axis 0."""
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    def validate(self) -> None:
        """Raises ``ValueError`` if the pieces do not add up to the shape."""
        if self.element_byte == 0:
            raise ValueError(f"dtype {self.dtype} has no size")
        want = self.size * self.element_byte
        if self.cur_mem_size != want:
            raise ValueError(f"remote pieces hold {self.cur_mem_size} bytes, shape {self.shape} of "
                             f"{self.dtype} needs {want}")
        expect = 0
        for first, (name, addr, nbytes) in self.remote_mem_metadata.items():
            if first != expect or nbytes % self.element_byte or addr < 0:
                raise ValueError(f"remote piece at element {first} ({name}, {addr}, {nbytes}) is not "
                                 f"where the previous one ended (element {expect}) or not whole elements")
            expect += nbytes // self.element_byte

    def pieces(self, start: int, end: int) -> Iterable[Tuple[str, int, int, int]]:
        """``(transport, addr, nbytes, dst_byte_offset)`` covering elements [start, end)."""
        eb = self.element_byte
        for first, (name, addr, nbytes) in self.remote_mem_metadata.items():
            last = first + nbytes // eb
            lo, hi = max(first, start), min(last, end)
            if lo < hi:
                yield name, addr + (lo - first) * eb, (hi - lo) * eb, (lo - start) * eb

    def sliced(self, start: int, end: int, shape: Sequence[int]) -> "remote_array_metadata":
        """Metadata of elements [start, end) with ``shape``."""
        eb = self.element_byte
        pieces = OrderedDict()
        for name, addr, nbytes, off in self.pieces(start, end):
            pieces[off // eb] = [name, addr, nbytes]
        return remote_array_metadata(self.dtype, shape, pieces)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, remote_array_metadata) and self.dtype == other.dtype
                and self.shape == other.shape and self.remote_mem_metadata == other.remote_mem_metadata)

    def __repr__(self) -> str:
        return (f"remote_array_metadata(dtype={self.dtype}, shape={self.shape}, "
                f"pieces={len(self.remote_mem_metadata)}, bytes={self.cur_mem_size})")


class remote_array:
    """A remote array: from ``input_ndarray`` (written out to ``transport_name``) or
    from ``metadata`` (nothing is read until ``materialize``)."""

    def __init__(self, buffer_pool: buffer_pool, input_ndarray: Optional[np.ndarray] = None,
                 transport_name: str = "", metadata: Optional[remote_array_metadata] = None):
        self.buffer_pool = buffer_pool
        self._staged = {}
        if input_ndarray is not None:
            arr = np.ascontiguousarray(input_ndarray)
            name = transport_name or _only_transport(buffer_pool)
            pieces = OrderedDict()
            if arr.nbytes:
                (_, addr, nbytes), = buffer_pool.write(name, arr)
                pieces[0] = [name, addr, nbytes]
            self.metadata = remote_array_metadata(arr.dtype, arr.shape, pieces)
        elif metadata is not None:
            if not isinstance(metadata, remote_array_metadata):
                raise TypeError(f"metadata must be a remote_array_metadata, not {type(metadata).__name__}")
            for name, *_ in metadata.remote_mem_metadata.values():
                buffer_pool._check(name)
            self.metadata = copy.deepcopy(metadata)
        else:
            raise ValueError("remote_array needs input_ndarray or metadata")

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.metadata.shape

    @property
    def dtype(self) -> np.dtype:
        return self.metadata.dtype

    def get_array_metadata(self) -> remote_array_metadata:
        """The metadata (a copy), to pickle and hand on."""
        self.buffer_pool.flush()
        return copy.deepcopy(self.metadata)

    def materialize(self, start_idx: int = -1, end_idx: int = -1) -> np.ndarray:
        """The whole array (original shape), or flat elements ``[start_idx, end_idx)``:
        shaped as rows when the range covers whole rows, else one-dimensional."""
        m = self.metadata
        total = m.size
        if start_idx == -1 and end_idx == -1:
            start, end = 0, total
        else:
            start = 0 if start_idx == -1 else int(start_idx)
            end = total if end_idx == -1 else int(end_idx)
        if not 0 <= start <= end <= total:
            raise IndexError(f"element range [{start}, {end}) outside array of {total} elements")
        out = np.empty(end - start, dtype=m.dtype)
        raw = out.view(np.uint8) if out.nbytes else None
        for name, addr, nbytes, off in m.pieces(start, end):
            self.buffer_pool.read_into(name, addr, raw[off:off + nbytes])
        if start == 0 and end == total:
            return out.reshape(m.shape)
        r = m.row_elements
        if len(m.shape) > 1 and start % r == 0 and end % r == 0:
            return out.reshape(((end - start) // r,) + m.shape[1:])
        return out

    def get_slice(self, start: int, end: int) -> "remote_array":
        """Rows ``[start, end)`` along axis 0 (no data moved)."""
        m = self.metadata
        rows = m.shape[0] if m.shape else 1
        if not 0 <= start <= end <= rows:
            raise IndexError(f"rows [{start}, {end}) outside array of {rows} rows")
        r = m.row_elements
        sub = m.sliced(start * r, end * r, (end - start,) + m.shape[1:])
        return remote_array(self.buffer_pool, metadata=sub)

    def request_mem_on_buffer_for_array(self, start: int = 0, end: int = -1) -> np.ndarray:
        """A writable ``uint8`` array sized for rows ``[start, end)``; fill it and call
        ``flush_slice(start, end)``."""
        start, end = self._rows(start, end)
        buf = np.zeros((end - start) * self.metadata.row_elements * self.metadata.element_byte, dtype=np.uint8)
        self._staged[(start, end)] = buf
        return buf

    def flush_slice(self, start: int = 0, end: int = -1) -> None:
        """Writes the buffer requested for rows ``[start, end)`` to remote memory."""
        start, end = self._rows(start, end)
        buf = self._staged.pop((start, end), None)
        if buf is None:
            raise KeyError(f"no buffer was requested for rows [{start}, {end})")
        self.write_rows(start, buf)

    def write_rows(self, start: int, data: Any) -> None:
        """Writes ``data`` (whole rows, same dtype or raw bytes) at row ``start``."""
        m = self.metadata
        src = _as_bytes(data)
        row_bytes = m.row_elements * m.element_byte
        if src.nbytes % row_bytes:
            raise ValueError(f"{src.nbytes} bytes are not whole rows of {row_bytes} bytes")
        end = start + src.nbytes // row_bytes
        self._rows(start, end)
        r = m.row_elements
        for name, addr, nbytes, off in m.pieces(start * r, end * r):
            self.buffer_pool.write(name, src[off:off + nbytes], addr)

    def _rows(self, start: int, end: int) -> Tuple[int, int]:
        rows = self.metadata.shape[0] if self.metadata.shape else 1
        end = rows if end == -1 else end
        if not 0 <= start <= end <= rows:
            raise IndexError(f"rows [{start}, {end}) outside array of {rows} rows")
        return start, end

    def __repr__(self) -> str:
        return f"remote_array({self.metadata!r})"


def _only_transport(pool: buffer_pool) -> str:
    if len(pool.trans_map) == 1:
        return next(iter(pool.trans_map))
    raise ValueError(f"name the transport to write to (pool has {', '.join(pool.trans_map) or 'none'})")


def init_empty_remote_array(buffer_pool: buffer_pool, transport_name: str, dtype: Any,
                            shape: Sequence[int]) -> remote_array:
    """Reserves remote room for an array of ``shape`` and ``dtype`` (contents unset)."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    pieces = OrderedDict()
    if nbytes:
        pieces[0] = [transport_name, buffer_pool.reserve_remote_mem(transport_name, nbytes), nbytes]
    return remote_array(buffer_pool, metadata=remote_array_metadata(dt, shape, pieces))


def merge_arrays_metadata(metas: List[remote_array_metadata]) -> remote_array_metadata:
    """Concatenates arrays' metadata along axis 0 (no data moved)."""
    if not metas:
        raise ValueError("merge_arrays_metadata needs at least one metadata")
    first = metas[0]
    rows = 0
    pieces = OrderedDict()
    base = 0
    for m in metas:
        if m.dtype != first.dtype or m.shape[1:] != first.shape[1:]:
            raise ValueError(f"cannot concatenate {m.dtype}{m.shape} to {first.dtype}{first.shape}")
        for k, v in m.remote_mem_metadata.items():
            pieces[base + k] = list(v)
        base += m.size
        rows += m.shape[0] if m.shape else 1
    return remote_array_metadata(first.dtype, (rows,) + first.shape[1:], pieces)
