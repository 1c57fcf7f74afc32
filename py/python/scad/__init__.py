"""Scad in Rust for Python.

- :class:`RemoteArray` and :class:`Store`: NumPy arrays in memory elements, through a
  Rust page pool (zero extra copies to and from NumPy, slicing, chunks, pool stats).
- :class:`MemoryServer`: an in-process memory server.
- Drop-in modules of the original runtime: ``disagg``, ``disaggrt``, ``npjoin``.
- Tools: ``memory_server``, ``rundisagg``, ``wskgen``, ``scad run DAGDIR``.

``RemoteFrame`` (Polars/PyArrow through the Arrow C data interface) is not bound yet:
it follows once the remote-frame crate lands.
"""

from ._native import MemoryServer, ScadError, TerminatedError, parse_size
from .array import RemoteArray, Store

__all__ = ["RemoteArray", "Store", "MemoryServer", "ScadError", "TerminatedError", "parse_size"]
__version__ = "0.1.0"
