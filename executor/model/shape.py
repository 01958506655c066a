"""``ModelShape``: every dimension of a hybrid model, validated, with what follows from them.

Field names are those of ``stepplan.sim.settings.presets`` (plus ``seed``), so a preset becomes a
shape as ``ModelShape(**preset, seed=seed)``. The parameter and byte counts below are
the presets' own formulas (``sim.presets.num_params`` and friends); the executor may not
import the simulator, so a test holds the two equal on every preset.
"""

from __future__ import annotations

import numbers
from typing import Any

import attrs

#: Layer kinds, as ``layer_kinds`` names them.
CONV, ATTENTION = "conv", "attention"
LAYER_KINDS = (CONV, ATTENTION)
#: Bytes per element of each dtype a model may run in.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The executor's kernels take K taps in 2..8 and dilations 1..8 (SPEC §2 operands).
_KERNEL_SIZES, _DILATIONS = range(2, 9), range(1, 9)


def _kinds(value: object) -> object:
    """A list or tuple becomes a tuple; anything else (a string too) stays, to be refused."""
    return tuple(value) if isinstance(value, list | tuple) else value


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@attrs.frozen
class ModelShape:
    """A hybrid model's dimensions and weight seed; raises one ``ValueError`` naming the
    first field that is wrong.

    Attributes:
        layer_kinds: one ``"conv"`` or ``"attention"`` per layer, at least one conv.
        hidden_size: width of the residual stream.
        conv_channels: ``C``, channels of the short conv (``in_proj`` maps hidden to C).
        conv_kernel_size: ``K``, taps (2..8).
        conv_dilation: ``D`` (1..8).
        mlp_size: inner width of the SwiGLU MLP.
        num_heads, num_kv_heads, head_dim: grouped-query attention (``num_kv_heads``
            divides ``num_heads``; ``head_dim`` even, for RoPE's pairs).
        vocab_size: embedding rows and logits.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        max_model_len: the most positions a request may reach.
        rope_theta: RoPE's base.
        seed: the weights' random seed.
    """

    layer_kinds: tuple[str, ...] = attrs.field(converter=_kinds)
    hidden_size: int
    conv_channels: int
    conv_kernel_size: int
    conv_dilation: int
    mlp_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: str
    max_model_len: int
    rope_theta: float
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        self._check_kinds()
        for name in (
            "hidden_size",
            "conv_channels",
            "conv_kernel_size",
            "conv_dilation",
            "mlp_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
        ):
            _positive_int(name, getattr(self, name))
        _within("conv_kernel_size", self.conv_kernel_size, _KERNEL_SIZES)
        _within("conv_dilation", self.conv_dilation, _DILATIONS)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads: must divide num_heads = {self.num_heads}, got {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size: must be at least 2, got {self.vocab_size}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype: must be one of {tuple(DTYPE_BYTES)}, got {self.dtype!r}")
        _positive_int("max_model_len", self.max_model_len)
        theta = self.rope_theta
        if not isinstance(theta, numbers.Real) or isinstance(theta, bool) or not theta > 0:
            raise ValueError(f"rope_theta: must be a positive number, got {theta!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed: must be a non-negative integer, got {self.seed!r}")

    def _check_kinds(self) -> None:
        kinds = self.layer_kinds
        if not isinstance(kinds, tuple) or not kinds:
            raise ValueError(f"layer_kinds: must be a non-empty list of layer kinds, got {kinds!r}")
        for layer, kind in enumerate(kinds):
            if kind not in LAYER_KINDS:
                raise ValueError(
                    f"layer_kinds[{layer}]: must be 'conv' or 'attention', got {kind!r}"
                )
        if CONV not in kinds:
            raise ValueError(
                "layer_kinds: needs at least one 'conv' layer (the executor runs them)"
            )

    @property
    def num_layers(self) -> int:
        """Layers of either kind."""
        return len(self.layer_kinds)

    @property
    def conv_layers(self) -> tuple[int, ...]:
        """Model layer index of each conv layer; conv layer ``i`` is the executor's layer ``i``."""
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == CONV)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Model layer index of each attention layer; attention layer ``i`` owns KV cache ``i``."""
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == ATTENTION)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of :attr:`dtype`."""
        return DTYPE_BYTES[self.dtype]

    @property
    def torch_dtype(self) -> Any:
        """:attr:`dtype` as a ``torch.dtype``."""
        import torch

        return getattr(torch, self.dtype)

    @property
    def reach(self) -> int:
        """``L = (K - 1) * D``: the history entries a conv token reads."""
        return (self.conv_kernel_size - 1) * self.conv_dilation

    def state_window(self, query_len_max: int) -> int:
        """``W = L + Q - 1``: conv-state entries per slot and channel (SPEC §2)."""
        return self.reach + query_len_max - 1

    @property
    def qkv_size(self) -> int:
        """Output width of the fused q, k, v projection: ``(H + 2 * KV) * head_dim``."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one position over every attention layer (keys and values)."""
        per_layer = 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes
        return len(self.attention_layers) * per_layer

    def conv_state_bytes_per_slot(self, query_len_max: int) -> int:
        """Conv-state bytes of one slot over every conv layer: ``C * W`` entries each."""
        entries = self.conv_channels * self.state_window(query_len_max)
        return len(self.conv_layers) * entries * self.dtype_bytes

    @property
    def num_params(self) -> int:
        """Parameters: embedding, LM head and final norm, then per layer two norms, the
        SwiGLU MLP and the mixer (conv: in/out projections and taps; attention: q, k, v, o)."""
        hidden = self.hidden_size
        per_layer = 2 * hidden + 3 * hidden * self.mlp_size
        conv = 2 * hidden * self.conv_channels + self.conv_channels * self.conv_kernel_size
        attention = hidden * (self.qkv_size + self.num_heads * self.head_dim)
        ends = 2 * self.vocab_size * hidden + hidden
        return (
            ends
            + self.num_layers * per_layer
            + len(self.conv_layers) * conv
            + len(self.attention_layers) * attention
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight: ``num_params * dtype_bytes``."""
        return self.num_params * self.dtype_bytes


def _positive_int(name: str, value: object) -> None:
    if not _is_int(value) or value < 1:  # type: ignore[operator]
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def _within(name: str, value: int, allowed: range) -> None:
    if value not in allowed:
        raise ValueError(
            f"{name}: must be in {allowed.start}..{allowed.stop - 1} (the executor's kernels), "
            f"got {value}"
        )
