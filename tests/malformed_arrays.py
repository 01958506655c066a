"""Arrays made wrong in the common ways the compiled checks must refuse by name."""

from __future__ import annotations

import numpy as np

WAYS = ("int64", "uint32", "int32", "int8", "list", "strided", "short", "read-only")


def malformed(value: np.ndarray, way: str) -> object:
    """``value`` made wrong in one of :data:`WAYS`: another dtype, a plain list, a
    non-contiguous view, one entry short along the last axis, or read-only."""
    if way in ("int64", "uint32", "int32", "int8"):
        return value.astype(way)
    if way == "list":
        return value.tolist()
    if way == "strided":
        return np.repeat(value, 2, axis=-1)[..., ::2]
    if way == "short":
        return value[..., :-1]
    if way == "read-only":
        return np.frombuffer(bytes(value.nbytes), value.dtype).reshape(value.shape)
    raise ValueError(f"way: must be one of {WAYS}, got {way!r}")
