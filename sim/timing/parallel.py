"""Tensor parallelism within one replica: what each rank holds and computes, and what its
all-reduces cost (``docs/presets.md``, "Tensor parallelism").

vLLM's tensor parallelism shards every matmul over the ``n`` ranks: column-parallel q, k,
v, the MLP's gate and up projections and the conv block's ``in_proj``; row-parallel
``o_proj``, the MLP's down projection and ``out_proj``, each followed by an all-reduce of
the layer's output, ``[tokens, hidden]`` in the model's dtype. So every layer of the
hybrid model, conv or attention, has two all-reduces: one after its mixer, one after its
MLP. The short conv is depthwise (a channel reads only its own history), so its channels
split with ``in_proj``'s columns and it needs no communication of its own: a rank
convolves, and keeps the conv state of, ``C / n`` channels. Attention splits by heads: a
rank holds ``num_kv_heads / n`` KV heads, or one copied KV head when ``n`` exceeds them
(vLLM copies them so). The norms' weights are copied to every rank. The embedding and the
LM head split by vocabulary; their own collectives (the embedding's all-reduce, the
logits' gather over the sampled rows) are left out.

Every rank runs the whole batch: the scheduler and the planner see one batch per replica,
and each rank's step takes what one rank's share of the work takes, plus the all-reduces
(no overlap of communication with compute, as vLLM's default).

A ring all-reduce of ``M`` bytes over ``n`` ranks moves ``2 (n - 1) / n * M`` bytes in and
out of every rank over ``2 (n - 1)`` steps: it takes
``2 (n - 1) * step_latency + 2 (n - 1) / n * M / link_bandwidth`` (bandwidth per direction).
"""

from __future__ import annotations

import attrs

from ..settings.config_model import ModelConfig

#: All-reduces per layer: after the mixer (attention or short conv) and after the MLP.
ALLREDUCES_PER_LAYER = 2


@attrs.frozen
class RankShare:
    """One tensor-parallel rank's part of the model.

    Attributes:
        ranks: the tensor-parallel ranks ``n``.
        params: parameters a rank holds (its shards and the copied ones).
        weights_bytes: their bytes (``params * dtype_bytes``).
        copied_bytes: bytes every rank holds whole: the norms, and the KV projections'
            copies when ``n`` exceeds the KV heads.
        kv_bytes_per_token: attention KV one token position puts on a rank.
        conv_channels: conv channels a rank convolves and keeps state for (``C / n``).
    """

    ranks: int
    params: float
    weights_bytes: float
    copied_bytes: float
    kv_bytes_per_token: float
    conv_channels: int


def split_problem(model: ModelConfig, ranks: int) -> str | None:
    """Why ``model`` cannot split over ``ranks`` tensor-parallel ranks, as one line naming
    ``parallel.tensor``; ``None`` when it can."""
    if ranks == 1:
        return None
    model = model.resolved()
    heads, kv_heads = model.num_heads, model.num_kv_heads
    where = f"parallel.tensor: {ranks}"
    if heads is None or kv_heads is None:
        return f"{where} needs model.num_heads and model.num_kv_heads (a custom model's)"
    if heads % ranks:
        return f"{where} does not divide model.num_heads = {heads} (a rank holds whole heads)"
    if kv_heads % ranks and ranks % kv_heads:
        return (
            f"{where} neither divides model.num_kv_heads = {kv_heads} nor is a multiple of "
            "it (a rank holds whole KV heads, or one copied)"
        )
    if model.conv_layers and model.conv_channels % ranks:
        return (
            f"{where} does not divide model.conv_channels = {model.conv_channels} "
            "(a rank convolves whole channels)"
        )
    return None


def split_model(model: ModelConfig, ranks: int) -> RankShare:
    """What one of ``ranks`` ranks holds of ``model`` (see the module docstring); the
    split must be possible (:func:`split_problem`)."""
    model = model.resolved()
    dtype = model.dtype_bytes
    if ranks == 1:  # the whole model, with no float round trip
        whole = model.params * dtype
        return RankShare(
            1, model.params, whole, whole, model.kv_bytes_per_token, model.conv_channels
        )
    problem = split_problem(model, ranks)
    if problem is not None:
        raise ValueError(problem)
    kv_heads = model.num_kv_heads
    attention_layers = model.layers - model.conv_layers
    norms = (2 * model.layers + 1) * model.hidden_size
    # a rank holds 1 / min(n, kv_heads) of the KV projections, not 1 / n, when n > kv_heads
    kv_width = model.kv_bytes_per_token / (2 * dtype * attention_layers) if attention_layers else 0
    kv_params = attention_layers * 2 * model.hidden_size * kv_width
    kv_holders = min(ranks, kv_heads)
    copied = norms + kv_params * (1 / kv_holders - 1 / ranks)
    params = (model.params - norms) / ranks + copied
    return RankShare(
        ranks=ranks,
        params=params,
        weights_bytes=params * dtype,
        copied_bytes=copied * dtype,
        kv_bytes_per_token=model.kv_bytes_per_token / kv_holders,
        conv_channels=model.conv_channels // ranks,
    )


def ring_allreduce_s(
    message_bytes: float, ranks: int, link_bw_bytes_s: float, step_latency_us: float
) -> float:
    """Seconds of one ring all-reduce of ``message_bytes`` over ``ranks`` ranks:
    ``2 (n - 1) * step_latency + 2 (n - 1) / n * message / bandwidth``; 0 on one rank."""
    if ranks == 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * step_latency_us * 1e-6 + steps / ranks * message_bytes / link_bw_bytes_s
