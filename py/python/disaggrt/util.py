"""Helpers element programs use around transports and remote arrays."""

from __future__ import annotations

import base64
import os
import pickle
from typing import Any, Dict, Optional

import numpy as np

from . import buffer_pool_lib
from .rdma_array import remote_array, remote_array_metadata

__all__ = ["remoteRead", "remoteWrite", "initTrans", "asArray", "getParIndex", "ArrayLoader",
           "dumpMeta", "loadMeta"]


def initTrans(action: Any, name: str, size: int = buffer_pool_lib.buffer_size, share: Any = None):
    """``action.get_transport(name, 'rdma')`` with a registered buffer of ``size``
    bytes (or the buffer of transport ``share``)."""
    t = action.get_transport(name, "rdma")
    t.reg(size, share)
    return t


def asArray(trans: Any, dtype: Any = np.uint8, count: int = -1, offset: int = 0) -> np.ndarray:
    """A zero-copy NumPy view of the transport's registered buffer."""
    return np.frombuffer(trans.buf, dtype=dtype, count=count, offset=offset)


def remoteWrite(trans: Any, data: Any, addr: int, offset: int = 0) -> int:
    """Copies ``data`` into the transport's buffer at ``offset`` and writes it to
    remote ``addr``; returns the bytes written."""
    src = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
        else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    dst = np.frombuffer(trans.buf, dtype=np.uint8, count=src.nbytes, offset=offset)
    dst[:] = src
    trans.write(src.nbytes, addr, offset)
    return src.nbytes


def remoteRead(trans: Any, size: int, addr: int, offset: int = 0, dtype: Any = np.uint8) -> np.ndarray:
    """Reads ``size`` bytes at remote ``addr`` through the buffer at ``offset``;
    returns them as a NumPy array of ``dtype`` (a view of the buffer)."""
    trans.read(size, addr, offset)
    return np.frombuffer(trans.buf, dtype=np.uint8, count=size, offset=offset).view(dtype)


def getParIndex() -> int:
    """This instance's index among a parallel element's instances (env ``__OW_PAR``)."""
    raw = os.environ.get("__OW_PAR", "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"__OW_PAR must be an integer, not {raw!r}") from None


def dumpMeta(meta: remote_array_metadata) -> str:
    """Metadata as a base64 string (for a JSON result)."""
    return base64.b64encode(pickle.dumps(meta)).decode("ascii")


def loadMeta(data: Any) -> remote_array_metadata:
    """Metadata from a base64 string, pickled bytes, or a metadata object."""
    if isinstance(data, remote_array_metadata):
        return data
    if isinstance(data, str):
        data = base64.b64decode(data)
    meta = pickle.loads(data)
    if not isinstance(meta, remote_array_metadata):
        raise TypeError(f"expected remote_array_metadata, got {type(meta).__name__}")
    return meta


class ArrayLoader:
    """Opens remote arrays a parent element handed on.

    ``ArrayLoader(action, transports, trans_metadata=None)`` builds a buffer pool over
    the named transports (registering their buffers); ``load(meta)`` opens an array
    from metadata (object or base64 string), ``get(params, parent, key='meta')`` from a
    parent's result, accepting both ``params[p][key]`` and ``params[p][0][key]``."""

    def __init__(self, action: Any, transports: Any, trans_metadata: Optional[Dict[str, int]] = None):
        names = [transports] if isinstance(transports, str) else list(transports)
        trans_map = {}
        for n in names:
            t = action.get_transport(n, "rdma")
            t.reg(buffer_pool_lib.buffer_size)
            trans_map[n] = t
        self.pool = buffer_pool_lib.buffer_pool(trans_map, trans_metadata or {})

    def load(self, meta: Any) -> remote_array:
        return remote_array(self.pool, metadata=loadMeta(meta))

    def get(self, params: Dict[str, Any], parent: str, key: str = "meta") -> remote_array:
        out = params[parent]
        if isinstance(out, list):
            out = out[0]
        return self.load(out[key])
