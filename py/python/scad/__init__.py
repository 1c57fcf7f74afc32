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
- :func:`sql`, :func:`explain` and :class:`QuerySession`: SQL over RemoteFrames within
  the env's memory budget, spilling to memory elements; answers as :class:`QueryResult`
  (to Polars/PyArrow without copying, or back to a RemoteFrame) (:mod:`scad.query`).
- :class:`DistributedSession` (and ``sql(..., ray=ADDRESS)``): the same queries across a
  Ray cluster, each stage as partition-parallel Ray tasks, memory elements as actors
  (:mod:`scad.distributed`).
"""

from ._native import (BudgetExceededError, FreedFrameError, MemoryServer, QueryError, ScadError,
                      StaleFrameError, TerminatedError, UnknownNameError, parse_size)
from .array import RemoteArray, Store
from .frame import FrameEnv, RemoteFrame, col, lit, when
from .query import QueryResult, QuerySession, explain, sql
from .distributed import DistributedQueryError, DistributedResult, DistributedSession
from .stages import write_stage_dag

__all__ = ["RemoteArray", "Store", "MemoryServer", "ScadError", "TerminatedError", "BudgetExceededError",
           "QueryError", "UnknownNameError", "FreedFrameError", "StaleFrameError", "parse_size", "FrameEnv", "RemoteFrame", "col", "lit", "when",
           "QuerySession", "QueryResult", "sql", "explain", "write_stage_dag", "DistributedSession",
           "DistributedResult", "DistributedQueryError"]
__version__ = "0.1.0"
