"""Scad in Rust for Python.

- :class:`RemoteArray` and :class:`Store`: NumPy arrays in memory elements, through a
  Rust page pool (zero extra copies to and from NumPy, slicing, chunks, pool stats).
- :class:`MemoryServer`: an in-process memory server.
- Drop-in modules of the original runtime: ``disagg``, ``disaggrt``, ``npjoin``.
- Tools: ``memory_server``, ``rundisagg``, ``wskgen``, ``scad run DAGDIR``.

- :class:`RemoteFrame` and :class:`FrameEnv`: tables in memory elements, from and to
  Polars/PyArrow through the Arrow PyCapsule interface, with memory-budgeted kernels
  (filter, select, join, group_by, sort, unique, limit); expressions from
  :mod:`scad.frame` (``col``, ``lit``, ``when``).
"""

from ._native import BudgetExceededError, MemoryServer, ScadError, TerminatedError, parse_size
from .array import RemoteArray, Store
from .frame import FrameEnv, RemoteFrame, col, lit, when

__all__ = ["RemoteArray", "Store", "MemoryServer", "ScadError", "TerminatedError", "BudgetExceededError",
           "parse_size", "FrameEnv", "RemoteFrame", "col", "lit", "when"]
__version__ = "0.1.0"
