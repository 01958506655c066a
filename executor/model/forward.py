"""The model's forward over one step's metadata: embedding, the layer stack, logits.

Each layer is pre-norm: ``h += mixer(rms_norm(h))``, then ``h += mlp(rms_norm(h))``.

- conv mixer: ``u = in_proj(x)``; the executor adds ``silu(conv(u))`` into a copy of
  ``u`` (so ``y = u + silu(conv(u))``, a skip inside the block); ``out_proj(y)``.
- attention mixer: fused q, k, v projection; RoPE (rotate-half pairs ``(i, i + Dh/2)``)
  at each token's position; keys and values written into the KV cache at each token's
  flat entry; causal attention over the row's ``seqused_k`` keys; ``o_proj``.
- MLP: SwiGLU, ``down(silu(gate(x)) * up(x))``.

Under tensor parallelism (:mod:`.parallel`) ``shape`` is one rank's (its channels, heads
and MLP width), and the outputs of ``out_proj``, ``o_proj`` and ``down`` are partial sums
that one all-reduce each completes before the residual add.

Logits are computed only for the sampled tokens. Everything reads the step through
:class:`StepTensors` (device) and, for the per-row reference attention only,
:class:`StepHost`: with flash attention the forward makes no host decision from the
step's values, so a CUDA graph of it replays any step of its bucket.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .attention import flash_attention, sdpa_attention
from .kv_cache import KVCache
from .metadata import StepHost, StepTensors
from .parallel import TensorShard
from .shape import ModelShape
from .weights import AttentionMixer, ConvMixer, LayerWeights, ModelWeights

RMS_EPS = 1e-5


def rope_tables(
    max_len: int, head_dim: int, theta: float, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[max_len, head_dim / 2]``: angle ``p * theta ** (-2 i / Dh)`` of
    position ``p`` and pair ``i``, computed in float64 (positions reach 1e5) then cast."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, heads, Dh]`` rotated per token: pair ``(x[i], x[i + Dh/2])`` by the
    token's angle ``i``; ``cos``, ``sin`` ``[T, 1, Dh/2]``. A new tensor."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last dim, scaled by ``weight``."""
    return F.rms_norm(x, weight.shape, weight, RMS_EPS)


def swiglu(x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` (a partial sum when the weights are a shard)."""
    gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, layer.down)


class ModelForward:
    """The forward of one model on its executor and KV cache.

    Args:
        shape: the model's dimensions (one rank's under tensor parallelism).
        weights: its weights (``shape``'s).
        executor: runs the conv layers; conv layer ``i`` is its layer ``i``. A plan must be
            prepared (or, in a graph capture, graph-prepared) before each forward.
        cache: the KV cache, attention layer ``i`` its layer ``i``.
        attention: ``"flash"`` or ``"sdpa"`` (:mod:`.attention`).
        max_len: positions of the RoPE tables (the cache's ``max_len``).
        shard: this rank's place; default the whole model.
    """

    def __init__(
        self,
        shape: ModelShape,
        weights: ModelWeights,
        executor: Any,
        cache: KVCache,
        attention: str,
        max_len: int,
        shard: TensorShard | None = None,
    ) -> None:
        self.shape, self.weights, self.executor, self.cache = shape, weights, executor, cache
        self.shard = shard or TensorShard()
        self.attention = attention
        device = weights.embedding.device
        self.cos, self.sin = rope_tables(
            max_len, shape.head_dim, shape.rope_theta, weights.embedding.dtype, device
        )
        # (layer weights, index among layers of its kind), once: the loop runs every step.
        counters = {"conv": 0, "attention": 0}
        layers = []
        for kind, layer in zip(shape.layer_kinds, weights.layers, strict=True):
            layers.append((layer, counters[kind]))
            counters[kind] += 1
        self._layers = tuple(layers)

    def logits(self, meta: StepTensors, host: StepHost | None) -> torch.Tensor:
        """``[S, V]`` logits of the sampled tokens (model dtype)."""
        w = self.weights
        hidden = F.embedding(meta.token_ids, w.embedding)
        # One gather per step, shared by every attention layer.
        cos = self.cos.index_select(0, meta.positions)[:, None]
        sin = self.sin.index_select(0, meta.positions)[:, None]
        for layer, index in self._layers:
            x = rms_norm(hidden, layer.mixer_norm)
            if isinstance(layer.mixer, ConvMixer):
                hidden += self._conv(index, layer.mixer, x)
            else:
                hidden += self._attend(index, layer.mixer, x, cos, sin, meta, host)
            hidden += self.shard.all_reduce(swiglu(rms_norm(hidden, layer.mlp_norm), layer))
        picked = hidden.index_select(0, meta.sample_index)
        return F.linear(rms_norm(picked, w.final_norm), w.lm_head)

    def greedy(self, meta: StepTensors, host: StepHost | None) -> torch.Tensor:
        """``[S], int64`` greedy tokens of the sampled tokens."""
        return self.logits(meta, host).argmax(dim=-1)

    def _conv(self, index: int, mixer: ConvMixer, x: torch.Tensor) -> torch.Tensor:
        u = F.linear(x, mixer.in_proj)
        y = u.clone()
        self.executor.conv(index, u, y)  # y = u + silu(conv(u)), the state advanced
        return self.shard.all_reduce(F.linear(y, mixer.out_proj))

    def _attend(
        self,
        index: int,
        mixer: AttentionMixer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepTensors,
        host: StepHost | None,
    ) -> torch.Tensor:
        shape, tokens = self.shape, x.shape[0]
        heads, kv_heads = shape.num_heads, shape.num_kv_heads
        qkv = F.linear(x, mixer.qkv).view(tokens, heads + 2 * kv_heads, shape.head_dim)
        rotated = apply_rope(qkv[:, : heads + kv_heads], cos, sin)
        q, k, v = rotated[:, :heads], rotated[:, heads:], qkv[:, heads + kv_heads :]
        self.cache.write(index, meta.write_index, k, v)
        if self.attention == "flash":
            out = flash_attention(
                q, self.cache.flat_keys[index], self.cache.flat_values[index], meta
            )
        else:
            if host is None:
                raise RuntimeError("sdpa attention needs the host's metadata (not graph-safe)")
            out = sdpa_attention(q, self.cache.keys[index], self.cache.values[index], host)
        out = F.linear(out.reshape(tokens, heads * shape.head_dim), mixer.o_proj)
        return self.shard.all_reduce(out)
