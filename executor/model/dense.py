"""The oracle: one request's whole token stream through the model at once, no cache, no
plan, no executor.

Written apart from the engine's forward on purpose: the conv is a dense depthwise
dilated causal ``F.conv1d``, RoPE a complex rotation in float64, attention
``scaled_dot_product_attention`` with a causal mask, norms spelled out. Schedule
invariance says the engine, for any split of the stream into prefill chunks, decodes and
spec steps, gives every accepted token the logits this gives it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .shape import ModelShape
from .weights import AttentionMixer, ConvMixer, ModelWeights

_EPS = 1e-5


def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    scale = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + _EPS)
    return (x.float() * scale).to(x.dtype) * weight


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE of ``x`` ``[T, heads, Dh]`` at positions ``0..T-1``: pair ``(x[i], x[i + Dh/2])``
    as one complex number, turned by ``p * theta ** (-2 i / Dh)``."""
    tokens, _, dim = x.shape
    half = dim // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    angle = torch.arange(tokens, dtype=torch.float64)[:, None] * freq[None, :]
    turn = torch.polar(torch.ones_like(angle), angle).to(x.device)[:, None, :]
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat((pairs.real, pairs.imag), dim=-1).to(x.dtype)


def _conv(shape: ModelShape, mixer: ConvMixer, x: torch.Tensor) -> torch.Tensor:
    u = x @ mixer.in_proj.T  # [T, C]
    padded = F.pad(u.T[None], (shape.reach, 0))  # zero history before the first token
    conv = F.conv1d(
        padded, mixer.conv[:, None, :], dilation=shape.conv_dilation, groups=shape.conv_channels
    )
    return (u + F.silu(conv[0].T)) @ mixer.out_proj.T


def _attention(shape: ModelShape, mixer: AttentionMixer, x: torch.Tensor) -> torch.Tensor:
    heads, kv_heads, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
    tokens = x.shape[0]
    q, k, v = (x @ mixer.qkv.T).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q = _rotate(q.reshape(tokens, heads, dim), shape.rope_theta).transpose(0, 1)
    k = _rotate(k.reshape(tokens, kv_heads, dim), shape.rope_theta).transpose(0, 1)
    v = v.reshape(tokens, kv_heads, dim).transpose(0, 1)
    groups = heads // kv_heads
    k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [H, T, Dh]
    return out.transpose(0, 1).reshape(tokens, heads * dim) @ mixer.o_proj.T


def dense_logits(weights: ModelWeights, shape: ModelShape, token_ids: torch.Tensor) -> torch.Tensor:
    """``[T, V]`` logits after each token of one stream ``token_ids`` ``[T], int64``
    (positions ``0..T-1``, empty history)."""
    hidden = weights.embedding[token_ids.to(weights.embedding.device)]
    for layer in weights.layers:
        x = _norm(hidden, layer.mixer_norm)
        if isinstance(layer.mixer, ConvMixer):
            hidden = hidden + _conv(shape, layer.mixer, x)
        else:
            hidden = hidden + _attention(shape, layer.mixer, x)
        x = _norm(hidden, layer.mlp_norm)
        gate, up = (x @ layer.gate_up.T).split(shape.mlp_size, dim=-1)
        hidden = hidden + (F.silu(gate) * up) @ layer.down.T
    return _norm(hidden, weights.final_norm) @ weights.lm_head.T
