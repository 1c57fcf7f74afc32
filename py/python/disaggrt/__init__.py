"""Drop-in replacement of the original ``disaggrt`` package: a page buffer pool over
memory elements (``buffer_pool_lib``), remote NumPy arrays (``rdma_array``) and helpers
(``util``), backed by scad-remote-array's Rust ``BufferPool``."""

from . import buffer_pool_lib, rdma_array, util

__all__ = ["buffer_pool_lib", "rdma_array", "util"]
