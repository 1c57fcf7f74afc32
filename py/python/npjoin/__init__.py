"""Drop-in replacement of the original ``npjoin`` join kernels (module ``npjoin.join``),
with Rust kernels on NumPy arrays."""

from . import join

__all__ = ["join"]
