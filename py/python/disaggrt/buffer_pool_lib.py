"""``buffer_pool``: a page cache in front of named memory elements, with the original
interface. Reads and writes go through scad-remote-array's Rust ``BufferPool`` (CLOCK
eviction with write-back, read-ahead, GIL released); reads and writes of at least a
quarter of the pool (a whole array, a large slice) go around it, straight between the
NumPy array and the memory element in one transport call, with the pool's cached pages
kept consistent. Remote space is handed out by a bump allocator whose state
(``trans_metadata``: transport name -> next free address) is how one element tells the
next where allocation stopped."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from scad import _native

#: Bytes of one cache page.
page_size = 64 * 1024
#: Pages in a pool.
page_buffer_size = 256
#: Bytes of a pool (programs register transport buffers of this size).
buffer_size = page_size * page_buffer_size

#: Remote allocations start on this boundary (keeps copies cache-line aligned).
ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _as_bytes(data: Any) -> np.ndarray:
    """A flat uint8 view of ``data`` (a copy only if it is not C-contiguous)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    arr = np.ascontiguousarray(data)
    return arr.reshape(-1).view(np.uint8)


def _endpoint(t: Any):
    ep = getattr(t, "_ep", None)
    if ep is None and isinstance(t, _native.Endpoint):
        ep = t
    if ep is None:
        raise TypeError(f"expected a transport from action.get_transport(name, 'rdma'), got {type(t).__name__}")
    return ep


class buffer_pool:
    """A buffer pool over ``trans_map`` (transport name -> transport)."""

    def __init__(self, trans_map: Dict[str, Any], trans_metadata: Optional[Dict[str, int]] = None,
                 capacity: int = buffer_size, page: int = page_size):
        self._pool = _native.BufferPool(capacity, page)
        self._direct_min = max(page, capacity // 4)
        self.trans_map: Dict[str, Any] = {}
        self._next: Dict[str, int] = {}
        self._stage_next: Dict[str, int] = {}
        for name, t in trans_map.items():
            self.add_transport(name, t)
        for name, addr in (trans_metadata or {}).items():
            if name not in self.trans_map:
                raise KeyError(f"trans_metadata names transport {name!r} that trans_map lacks")
            if not isinstance(addr, int) or addr < 0:
                raise ValueError(f"trans_metadata[{name!r}] must be a non-negative address, not {addr!r}")
            self._next[name] = max(self._next[name], _align(addr))

    def add_transport(self, name: str, t: Any) -> None:
        """Adds a transport (waits until the runtime has configured it)."""
        self._pool.add_endpoint(name, _endpoint(t))
        self.trans_map[name] = t
        self._next.setdefault(name, 0)
        self._stage_next.setdefault(name, 0)

    def _check(self, name: str) -> None:
        if name not in self.trans_map:
            raise KeyError(f"buffer pool has no transport {name!r} (known: {', '.join(self.trans_map) or 'none'})")

    def get_buffer_metadata(self) -> Dict[str, int]:
        """Writes dirty pages back and returns the allocation state."""
        self._pool.flush()
        return dict(self._next)

    def reserve_remote_mem(self, name: str, nbytes: int) -> int:
        """Reserves ``nbytes`` of remote memory on ``name``; returns the address."""
        self._check(name)
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes!r} bytes")
        addr = self._next[name]
        size = self._pool.transport_size(name)
        if addr + nbytes > size:
            raise MemoryError(
                f"memory element {name!r} is full: {nbytes} bytes asked at {addr}, {size} bytes in all")
        self._next[name] = _align(addr + int(nbytes))
        return addr

    def write(self, transport_name: str, data: Any, remote_addr: int = -1) -> List[list]:
        """Writes ``data`` (array or bytes) to ``remote_addr`` (reserved if -1)."""
        self._check(transport_name)
        src = _as_bytes(data)
        if remote_addr == -1:
            remote_addr = self.reserve_remote_mem(transport_name, src.nbytes)
        elif remote_addr < 0:
            raise ValueError(f"remote address {remote_addr} is negative")
        if src.nbytes:
            self._write(transport_name, remote_addr, src)
        return [[transport_name, remote_addr, src.nbytes]]

    def _write(self, name: str, addr: int, src: np.ndarray) -> None:
        """Writes the uint8 array ``src`` at ``addr``. Writes of at least a quarter of the
        pool go around the cache, straight from ``src`` to the memory element (cached
        pages of the range are dropped or updated, so reads see the same bytes): through
        the cache they would only evict everything else and write every page back."""
        if src.nbytes >= self._direct_min:
            self._pool.write_direct(name, int(addr), src)
        else:
            self._pool.write(name, int(addr), src)

    def read(self, remote_metadata_list: List[list], mem_size: int) -> Tuple[bool, np.ndarray]:
        """Reads the listed ``[name, addr, nbytes]`` pieces, one after the other, into
        a new uint8 array of ``mem_size`` bytes."""
        buf = np.empty(mem_size, dtype=np.uint8)
        off = 0
        for entry in remote_metadata_list:
            name, addr, n = entry[0], int(entry[1]), int(entry[2])
            self._check(name)
            if off + n > mem_size:
                raise ValueError(f"pieces hold more than mem_size={mem_size} bytes")
            if n:
                self.read_into(name, addr, buf[off:off + n])
            off += n
        return True, buf

    def read_into(self, name: str, addr: int, dst: np.ndarray) -> None:
        """Reads ``dst.nbytes`` bytes at ``addr`` of ``name`` into ``dst`` (no copy).

        Reads of at least a quarter of the pool go around the cache, straight from the
        memory element into ``dst`` (cached and dirty pages still win, so the result is
        the same): they would only evict everything else, and skip a copy this way."""
        self._check(name)
        raw = _as_writable_bytes(dst)
        if raw.nbytes >= self._direct_min:
            self._pool.read_direct(name, int(addr), raw)
        else:
            self._pool.read(name, int(addr), raw)

    def request_mem_on_buffer_for_array(self, name: str, nbytes: int) -> Tuple[Any, int]:
        """Room for ``nbytes`` in transport ``name``'s registered buffer:
        ``(transport, buf_offset)``. Fill ``transport.buf`` there, then call
        ``flush_to_remote``. (Registers a buffer of ``buffer_size`` if there is none.)"""
        self._check(name)
        t = self.trans_map[name]
        ep = _endpoint(t)
        if not ep.registered():
            ep.reg(max(buffer_size, _align(nbytes)))
        cap = len(ep.buffer())
        if nbytes > cap:
            raise MemoryError(f"{nbytes} bytes do not fit the {cap}-byte buffer of transport {name!r}")
        off = self._stage_next[name]
        if off + nbytes > cap:
            off = 0
        self._stage_next[name] = _align(off + nbytes)
        return t, off

    def flush_to_remote(self, name: str, remote_addr: int, buf_offset: int, nbytes: int) -> None:
        """Writes ``nbytes`` of transport ``name``'s buffer at ``buf_offset`` to
        ``remote_addr`` (by the pool, so cached pages stay consistent)."""
        self._check(name)
        view = np.frombuffer(_endpoint(self.trans_map[name]).buffer(), dtype=np.uint8,
                             count=nbytes, offset=buf_offset)
        if nbytes:
            self._write(name, remote_addr, view)

    def flush(self) -> None:
        """Writes dirty pages back."""
        self._pool.flush()

    def stats(self) -> Dict[str, Any]:
        """Pool counters (hits, misses, evictions, write_backs, bytes_in, bytes_out, and
        bytes_direct / bytes_direct_out: bytes read / written around the cache)."""
        return dict(self._pool.stats())


def _as_writable_bytes(dst: np.ndarray) -> np.ndarray:
    if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
        raise ValueError("destination must be a writable C-contiguous NumPy array")
    return dst.reshape(-1).view(np.uint8)
