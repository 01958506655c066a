"""The KV cache, slot-indexed like the conv state, and the memory check made before any
allocation.

Each attention layer owns keys and values ``[num_slots, max_len, KV, Dh]``: row ``s`` is
the scheduler's slot ``s`` of a request (the slot of layer group 0), position ``p`` its
token ``p``. Slot 0 is NULL: padding tokens of a CUDA graph write there, and no live row
reads it. A request's position ``p`` of slot ``s`` is entry ``s * max_len + p`` of the
flat view ``[num_slots * max_len, KV, Dh]`` that attention reads.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

_GIB = 2**30


class MemoryTooSmallError(ValueError):
    """The model, its KV cache and its conv state do not fit the device's free memory."""


@attrs.frozen
class MemoryNeed:
    """Bytes a runner allocates, by part, before it allocates any of them."""

    weights: int
    kv_cache: int
    conv_state: int
    workspace: int  # activations of the largest step, the executor's staging, logits

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.conv_state + self.workspace


def device_free_bytes(device: torch.device) -> tuple[int, int] | None:
    """``(free, total)`` bytes where ``device``'s tensors live: a CUDA device's
    (``torch.cuda.mem_get_info``), the host's available memory for the CPU (Linux's
    ``MemAvailable``); ``None`` where neither can be read, and nothing is checked."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    if device.type != "cpu":
        return None
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        kib = {key: int(value.split()[0]) for key, value in fields.items() if value.strip()}
        return kib["MemAvailable"] * 1024, kib["MemTotal"] * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(
    need: MemoryNeed, free_total: tuple[int, int] | None, *, num_slots: int, max_len: int
) -> None:
    """Raise :class:`MemoryTooSmallError` naming every part and what to lower when
    ``need.total`` exceeds the free bytes of ``free_total`` (``None``: no check)."""
    if free_total is None:
        return
    free, total = free_total
    if need.total <= free:
        return
    per_slot = need.kv_cache // max(num_slots, 1)
    raise MemoryTooSmallError(
        f"memory: the model needs {need.total / _GIB:.2f} GiB (weights "
        f"{need.weights / _GIB:.2f}, KV cache {need.kv_cache / _GIB:.2f} for {num_slots} slots x "
        f"{max_len} positions, conv state {need.conv_state / _GIB:.2f}, workspace "
        f"{need.workspace / _GIB:.2f}) but {free / _GIB:.2f} of {total / _GIB:.2f} GiB are free; "
        f"lower num_slots or max_len (each slot's KV takes {per_slot / _GIB:.3f} GiB)"
    )


def kv_cache_bytes(
    num_layers: int,
    num_slots: int,
    max_len: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
) -> int:
    """Bytes of keys and values of ``num_layers`` layers."""
    return 2 * num_layers * num_slots * max_len * num_kv_heads * head_dim * dtype_bytes


class KVCache:
    """Keys and values of every attention layer, one zeroed allocation.

    Attributes:
        keys, values: per attention layer ``[num_slots, max_len, KV, Dh]``.
        flat_keys, flat_values: the same memory as ``[num_slots * max_len, KV, Dh]``.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_slots, self.max_len = num_slots, max_len
        shape = (num_layers, 2, num_slots, max_len, num_kv_heads, head_dim)
        self.memory = torch.zeros(shape, dtype=dtype, device=device)
        self.keys = tuple(self.memory[layer, 0] for layer in range(num_layers))
        self.values = tuple(self.memory[layer, 1] for layer in range(num_layers))
        flat = (num_slots * max_len, num_kv_heads, head_dim)
        self.flat_keys = tuple(k.view(flat) for k in self.keys)
        self.flat_values = tuple(v.view(flat) for v in self.values)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return self.memory.numel() * self.memory.element_size()

    def write(
        self, layer: int, index: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> None:
        """Store ``keys``, ``values`` ``[T, KV, Dh]`` at flat entries ``index`` ``[T], int64``
        (``slot * max_len + position``; padding tokens all write entry 0, of slot 0)."""
        self.flat_keys[layer].index_copy_(0, index, keys)
        self.flat_values[layer].index_copy_(0, index, values)
