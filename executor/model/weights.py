"""Seeded random weights of a :class:`ModelShape`, drawn on the device they live on.

A ``torch.Generator`` of the target device draws every tensor in place, so an 8B model
initialises in seconds on a GPU without passing through host memory; the same seed on
the same device type gives the same weights (CPU and CUDA generators differ).

Scales keep activations O(1) through any depth: every projection is drawn with standard
deviation ``1 / sqrt(fan_in)`` (its input is RMS-normalized, or the output of one such
projection), norms near 1, the embedding at 1. The LM head gets ``4 / sqrt(hidden)``:
logits spread wide enough that greedy choices are far from ties, so fp32 rounding never
flips one and greedy tokens do not depend on the schedule.

Projection weights are stored ``[out, in]``, ``F.linear``'s layout.

Under tensor parallelism every rank draws every tensor whole, in the same order, and
keeps its block (:class:`~.parallel.TensorShard`), one tensor at a time: the ranks'
blocks are exactly the single-process weights cut apart, and no rank holds more than
its shard and the one tensor being drawn.
"""

from __future__ import annotations

import attrs
import torch

from .parallel import TensorShard
from .shape import ModelShape

_HEAD_SCALE = 4.0
_NORM_JITTER = 0.1  # norms are 1 + N(0, 0.1): a forgotten norm weight shows in the tests


@attrs.frozen(eq=False)
class ConvMixer:
    """A short-conv block's weights (``h`` hidden, ``C`` channels, ``K`` taps).

    Attributes:
        in_proj: ``[C, h]``.
        conv: ``[C, K]``, the executor's taps.
        out_proj: ``[h, C]``.
    """

    in_proj: torch.Tensor
    conv: torch.Tensor
    out_proj: torch.Tensor


@attrs.frozen(eq=False)
class AttentionMixer:
    """An attention block's weights (``H`` heads, ``KV`` KV heads of ``Dh`` dims).

    Attributes:
        qkv: ``[(H + 2 KV) * Dh, h]``, rows ``q | k | v``, head-major within each.
        o_proj: ``[h, H * Dh]``.
    """

    qkv: torch.Tensor
    o_proj: torch.Tensor


@attrs.frozen(eq=False)
class LayerWeights:
    """One layer: norm, mixer, norm, SwiGLU MLP (``m`` inner width).

    Attributes:
        mixer_norm, mlp_norm: ``[h]`` RMSNorm weights.
        mixer: the conv or attention block.
        gate_up: ``[2 m, h]``, rows ``gate | up``.
        down: ``[h, m]``.
    """

    mixer_norm: torch.Tensor
    mixer: ConvMixer | AttentionMixer
    mlp_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@attrs.frozen(eq=False)
class ModelWeights:
    """Every weight of the model (``V`` vocabulary).

    Attributes:
        embedding: ``[V, h]``.
        layers: one per layer, in order.
        final_norm: ``[h]``.
        lm_head: ``[V, h]`` (untied from the embedding).
    """

    embedding: torch.Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        """Every weight tensor once."""
        found = [self.embedding, self.final_norm, self.lm_head]
        for layer in self.layers:
            found += [layer.mixer_norm, layer.mlp_norm, layer.gate_up, layer.down]
            found += [getattr(layer.mixer, f.name) for f in attrs.fields(type(layer.mixer))]
        return found

    def num_params(self) -> int:
        """Elements over every tensor (counted, not derived from the shape)."""
        return sum(t.numel() for t in self.tensors())


class _Drawer:
    """Draws tensors from one generator on one device, in one dtype."""

    def __init__(self, seed: int, dtype: torch.dtype, device: torch.device) -> None:
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.dtype, self.device = dtype, device

    def normal(self, *shape: int, scale: float, mean: float = 0.0) -> torch.Tensor:
        out = torch.empty(shape, dtype=self.dtype, device=self.device)
        return out.normal_(mean, scale, generator=self.generator)

    def linear(self, out_features: int, in_features: int) -> torch.Tensor:
        return self.normal(out_features, in_features, scale=in_features**-0.5)

    def norm(self, size: int) -> torch.Tensor:
        return self.normal(size, scale=_NORM_JITTER, mean=1.0)


def make_weights(
    shape: ModelShape, device: torch.device | str, shard: TensorShard | None = None
) -> ModelWeights:
    """The model's weights, seeded by ``shape.seed``, in ``shape.dtype`` on ``device``:
    whole, or ``shard``'s block of each split tensor (its shapes those of
    ``shard.rank_shape(shape)``)."""
    shard = shard or TensorShard()
    shard.rank_shape(shape)  # refuses a degree that does not divide the model
    draw = _Drawer(shape.seed, shape.torch_dtype, torch.device(device))
    hidden, channels = shape.hidden_size, shape.conv_channels
    layers = []
    for kind in shape.layer_kinds:
        mixer: ConvMixer | AttentionMixer
        if kind == "conv":
            mixer = ConvMixer(
                in_proj=shard.block(draw.linear(channels, hidden), 0),
                conv=shard.block(
                    draw.normal(
                        channels, shape.conv_kernel_size, scale=shape.conv_kernel_size**-0.5
                    ),
                    0,
                ),
                out_proj=shard.block(draw.linear(hidden, channels), 1),
            )
        else:
            heads = shape.num_heads * shape.head_dim
            kv = shape.num_kv_heads * shape.head_dim
            mixer = AttentionMixer(
                qkv=shard.blocks(draw.linear(shape.qkv_size, hidden), (heads, kv, kv)),
                o_proj=shard.block(draw.linear(hidden, heads), 1),
            )
        layers.append(
            LayerWeights(
                mixer_norm=draw.norm(hidden),
                mixer=mixer,
                mlp_norm=draw.norm(hidden),
                gate_up=shard.blocks(
                    draw.linear(2 * shape.mlp_size, hidden), (shape.mlp_size, shape.mlp_size)
                ),
                down=shard.block(draw.linear(hidden, shape.mlp_size), 1),
            )
        )
    return ModelWeights(
        embedding=draw.normal(shape.vocab_size, hidden, scale=1.0),
        layers=tuple(layers),
        final_norm=draw.norm(hidden),
        lm_head=draw.normal(shape.vocab_size, hidden, scale=_HEAD_SCALE * hidden**-0.5),
    )
