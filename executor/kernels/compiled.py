"""How many kernel variants Triton has compiled in this process: a step that raised the
count paid for a compilation (live runs count such steps as cold)."""

from __future__ import annotations

from ..staging_kernel import _pull_plan
from .persistent import _short_conv_rows_persistent
from .rows import _short_conv_rows
from .tiles import _short_conv_tiles

_KERNELS = (_short_conv_rows, _short_conv_rows_persistent, _short_conv_tiles, _pull_plan)


def compiled_variants() -> int:
    """Compiled variants of the executor's kernels over every device (0 when Triton runs
    interpreted: the interpreter compiles nothing)."""
    total = 0
    for kernel in _KERNELS:
        caches = getattr(kernel, "device_caches", None)  # a JITFunction's, per device
        try:  # (kernel cache, ...) per device; Triton's own layout, so read defensively
            total += sum(len(entry[0]) for entry in (caches or {}).values())
        except (TypeError, IndexError, KeyError):
            continue
    return total
