"""The PyTorch backend's spec (implementation: handler.backends.pytorch, the exported program). Stdlib only: the
prefetch reads it before numpy is imported."""

from __future__ import annotations

from handler.backends.registry import BackendSpec

# torch's own libraries (hundreds of MB, most never touched by a CPU start) are not prefetched whole.
SPEC = BackendSpec(name="torch", module="handler.backends.pytorch", needs="arrays")
