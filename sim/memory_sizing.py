"""How much memory the cache gets and how it is split: conv-state slots, KV blocks and
the states kept for cached prefixes (``docs/memory.md``).

The cache's budget is ``memory.kv_cache_gib`` when given, else
``gpu.memory_gb * memory.gpu_memory_utilization`` less the model's weights. With
``parallel.tensor = n`` every figure is one rank's (``parallel.py``): its GPU, its share of
the weights, of each KV block and of each conv state; each rank holds every block's and
every slot's share, so the counts are the replica's. The
conv-state slot pool is reserved first -- ``min(scheduler.slots, budget // slot
bytes)`` slots, allocated once as the executor's slot pool is -- and the rest is cut
into KV blocks of ``memory.block_size`` tokens. A hybrid model without prefix caching
is laid out as vLLM lays one out instead (:func:`_shared_pool`): its conv states are
blocks of the same pool, held by each running request, and its attention layers may form
several groups, each taking its own block per ``block_size`` tokens. A request's blocks hold
its attention KV. Where a hybrid model caches prefixes, the reserved slots stay and chunks
and entries follow vLLM's "align" mode (:attr:`MemoryLayout.align_tokens`); its kept conv
states are not charged to the pool.

Checked before the run: the weights leave a budget, it holds a slot, and the
longest request fits in the whole block pool (else it could never finish).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from .settings.config import ConfigError, GpuConfig, ModelConfig, SimConfig
from .settings.gpus import PRICE_SOURCE, find_preset
from .timing.parallel import split_model
from .traces import RequestTable

if TYPE_CHECKING:
    from .results.summary import StepTotals

GIB = 2**30
#: Blocks of a pool that never binds (a model without attention layers).
UNBOUNDED_BLOCKS = 2**62


@attrs.frozen
class ModelFootprint:
    """What the served model puts in one GPU's memory (one tensor-parallel rank's share).

    Attributes:
        weights_bytes: the weights.
        kv_bytes_per_token: attention KV of one token, all attention layers.
        slot_bytes: one running request's conv state, all conv layers:
            ``conv_layers * C * W * dtype_bytes``, ``W = (K - 1) * D + Q - 1``.
        kept_state_bytes: one conv state kept at a prefix boundary (the history a
            later token reads, ``L = (K - 1) * D`` entries, no spec scratch).
    """

    weights_bytes: float
    kv_bytes_per_token: float
    slot_bytes: int
    kept_state_bytes: int


def model_footprint(model: ModelConfig, num_spec_tokens: int, tensor: int = 1) -> ModelFootprint:
    """The model's memory figures on one of ``tensor`` tensor-parallel ranks (the one place
    they are computed; the split is ``parallel.split_model``'s)."""
    model = model.resolved()
    share = split_model(model, tensor)
    reach = (model.conv_kernel_size - 1) * model.conv_dilation
    per_entry = model.conv_layers * share.conv_channels * model.dtype_bytes
    return ModelFootprint(
        weights_bytes=share.weights_bytes,
        kv_bytes_per_token=share.kv_bytes_per_token,
        slot_bytes=per_entry * (reach + num_spec_tokens),
        kept_state_bytes=per_entry * reach,
    )


def one_rank_model(model: ModelConfig, tensor: int) -> ModelConfig:
    """``model`` as the cache of one of ``tensor`` tensor-parallel ranks holds it: the
    rank's KV bytes per token and conv channels (``parallel.split_model``), as vLLM
    plans each worker's cache from that worker's layers."""
    model = model.resolved()
    if tensor == 1:
        return model
    share = split_model(model, tensor)
    return attrs.evolve(
        model, kv_bytes_per_token=share.kv_bytes_per_token, conv_channels=share.conv_channels
    )


@attrs.frozen
class MemoryLayout:
    """The cache's split for one run.

    Attributes:
        budget_bytes: the cache's memory; ``budget_source`` says where it came from
            (``kv_cache_gib``, or ``gpu``: the GPU's share less the weights).
        weights_bytes: the model's weights.
        slots: conv-state slots (``min(configured_slots, what memory allows)``).
        configured_slots: ``scheduler.slots``.
        slot_bytes: one slot's conv state.
        block_size: tokens per KV block; ``block_bytes`` its memory.
        num_blocks: KV blocks of the pool (:data:`UNBOUNDED_BLOCKS` without KV).
        prefix_caching: whether cached prompt blocks are reused (the setting, a trace
            with hashes, and no live model).
        prefix_block_tokens: tokens per hashed block of the trace.
        entry_tokens: tokens per prefix-cache entry, the granularity of hits: a KV block
            for an attention-only model (vLLM hashes every full block, a partial last
            hashed block of the trace shares its full KV blocks), an aligned block
            (``align_tokens``) for a hybrid model.
        state_blocks: blocks of conv state every running request holds in the pool, as
            vLLM's hybrid cache keeps them (:func:`_shared_pool`); 0 where the slots'
            memory is reserved apart.
        align_tokens: vLLM's "align" mode, where a hybrid model caches prefixes: prefill
            chunks end on multiples of this many tokens (vLLM's hybrid attention block),
            a prefix-cache entry is one such block of the prompt, and a conv state is
            kept only at a prompt's last such boundary and where a request's prefix was
            cached for attention alone (``docs/memory.md``); 0 otherwise.
        attention_groups: vLLM's KV-cache groups of attention layers: each holds its own
            block for every ``block_size`` tokens (:func:`_shared_pool`; 1 elsewhere).
        align_state_blocks: ``memory.align_state_blocks`` in force (a hybrid model
            caching prefixes): the pool is :func:`_shared_pool`'s, ``block_size`` is
            ``align_tokens``, and :class:`~stepplan.sim.memory.BlockPool` counts each
            request's conv-state blocks one by one as vLLM's align mode holds them.
        state_groups: vLLM's KV-cache groups of conv layers (0 outside that mode): one
            conv state, running, left behind or kept, is this many blocks.
        check: verify the accounting every step.
    """

    budget_bytes: float
    budget_source: str
    weights_bytes: float
    slots: int
    configured_slots: int
    slot_bytes: int
    block_size: int
    block_bytes: float
    num_blocks: int
    prefix_caching: bool
    prefix_block_tokens: int
    check: bool = False
    entry_tokens: int = attrs.field()
    state_blocks: int = 0
    align_tokens: int = 0
    attention_groups: int = 1
    align_state_blocks: bool = False
    state_groups: int = 0

    @entry_tokens.default
    def _whole_hashed_block(self) -> int:
        return self.prefix_block_tokens

    @property
    def entry_blocks(self) -> int:
        """KV blocks of one prefix-cache entry."""
        return self.kv_blocks(self.entry_tokens)

    @property
    def entries_per_hash(self) -> int:
        """Prefix-cache entries one hashed block of the trace holds."""
        return self.prefix_block_tokens // self.entry_tokens

    def cacheable_entries(self, num_hashes: Any, prompt: Any) -> Any:
        """Entries a prompt of ``prompt`` tokens with ``num_hashes`` hashed blocks can
        share: its full entries within the hashed tokens (an int, or ``[n], int64``)."""
        return np.minimum(num_hashes * self.prefix_block_tokens, prompt) // self.entry_tokens

    def kv_blocks(self, tokens: Any) -> Any:
        """KV blocks of ``tokens`` positions, one per ``block_size`` tokens in each
        attention group: an int, or ``[n], int64`` for an array."""
        return self.attention_groups * ((tokens + self.block_size - 1) // self.block_size)

    def blocks_for(self, tokens: Any) -> Any:
        """Blocks a request holds for ``tokens`` positions (an int, or ``[n], int64``):
        its KV blocks and its conv-state blocks where those are in the pool."""
        return self.kv_blocks(tokens) + self.state_blocks


def cacheable_blocks(table: RequestTable, layout: MemoryLayout) -> np.ndarray:
    """``[N], int64`` prefix-cache entries every prompt can share
    (:meth:`MemoryLayout.cacheable_entries`); zeros when the trace has no hashes."""
    offsets = table.prefix_offsets
    if offsets is None or table.prefix_blocks is None:
        return np.zeros(table.num_requests, np.int64)
    return layout.cacheable_entries(np.diff(offsets), table.prompt_tokens)


def _budget(config: SimConfig, footprint: ModelFootprint) -> tuple[float, str]:
    memory = config.memory
    if memory.kv_cache_gib is not None:
        return memory.kv_cache_gib * GIB, "kv_cache_gib"
    gpu = config.gpu.resolved()
    usable = gpu.memory_gb * 1e9 * memory.gpu_memory_utilization
    budget = usable - footprint.weights_bytes
    if budget <= 0:
        ranks = config.parallel.tensor
        weights = (
            f"a GPU's weights at parallel.tensor = {ranks}" if ranks > 1 else "the model's weights"
        )
        raise ConfigError(
            f"memory: {weights} ({footprint.weights_bytes / 1e9:.1f} GB) leave no cache in "
            f"{memory.gpu_memory_utilization:g} x {gpu.memory_gb:g} GB of the {gpu.name}; "
            "raise memory.gpu_memory_utilization or parallel.tensor, or set memory.kv_cache_gib"
        )
    return budget, "gpu"


def plan_memory(config: SimConfig, table: RequestTable, *, live: bool = False) -> MemoryLayout:
    """The cache split for ``config`` on ``table``; a :class:`ConfigError` when the
    cache cannot hold a slot or the longest request (see the module docstring)."""
    memory, scheduler = config.memory, config.scheduler
    footprint = model_footprint(config.model, scheduler.num_spec_tokens, config.parallel.tensor)
    budget, source = _budget(config, footprint)
    allowed = budget // footprint.slot_bytes if footprint.slot_bytes else scheduler.slots
    slots = int(min(scheduler.slots, allowed))
    if slots < 1:
        raise ConfigError(
            f"memory: the cache ({budget / GIB:.3g} GiB) cannot hold one conv-state slot "
            f"({footprint.slot_bytes / GIB:.3g} GiB)"
        )
    block_bytes = memory.block_size * footprint.kv_bytes_per_token
    kv_budget = budget - slots * footprint.slot_bytes
    num_blocks = int(kv_budget // block_bytes) if block_bytes else UNBOUNDED_BLOCKS
    has_hashes = table.prefix_offsets is not None
    caching = memory.prefix_caching and has_hashes and not live
    if caching and memory.prefix_block_tokens % memory.block_size:
        raise ConfigError(
            f"memory.block_size: {memory.block_size} does not divide the trace's "
            f"{memory.prefix_block_tokens}-token hashed blocks, as prefix caching needs "
            "(or set memory.prefix_caching = false)"
        )
    block_size, state_blocks, attention_groups = memory.block_size, 0, 1
    align = _align_tokens(config, footprint) if caching and block_bytes else 0
    pooled = bool(align) and memory.align_state_blocks
    if footprint.slot_bytes and block_bytes and (pooled or not caching):
        block_size, block_bytes, num_blocks, state_blocks, attention_groups = _shared_pool(
            config.model.resolved(), footprint, budget, memory.block_size, scheduler.num_spec_tokens
        )
        slots = scheduler.slots  # no memory set apart: the pool binds
    layout = MemoryLayout(
        budget_bytes=budget,
        budget_source=source,
        weights_bytes=footprint.weights_bytes,
        slots=slots,
        configured_slots=scheduler.slots,
        slot_bytes=footprint.slot_bytes,
        block_size=block_size,
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        prefix_caching=caching,
        prefix_block_tokens=memory.prefix_block_tokens,
        check=memory.check,
        state_blocks=state_blocks,
        align_tokens=align,
        # every full KV block is an entry, as vLLM's (its hybrid blocks where aligned)
        entry_tokens=align or memory.block_size if caching else memory.prefix_block_tokens,
        attention_groups=attention_groups,
        align_state_blocks=pooled,
        state_groups=state_blocks // (1 + scheduler.num_spec_tokens) if pooled else 0,
    )
    _check_longest(layout, table)
    return layout


def _align_tokens(config: SimConfig, footprint: ModelFootprint) -> int:
    """vLLM's align mode where a model caches prefixes: its hybrid block's tokens (0
    for an attention-only model); a :class:`ConfigError` when the token budget is
    below one such block."""
    if not footprint.slot_bytes:
        return 0
    align = _hybrid_block_size(config.model.resolved(), footprint, config.memory.block_size)
    budget = config.scheduler.max_num_batched_tokens
    if budget < align:  # no prefill chunk could ever run
        raise ConfigError(
            f"scheduler.max_num_batched_tokens = {budget} is less than the {align}-token "
            "blocks a hybrid model caching prefixes computes its prompt in (vLLM's align "
            "mode); raise it or set memory.prefix_caching = false"
        )
    return align


def _shared_pool(
    model: ModelConfig, footprint: ModelFootprint, budget: float, align: int, spec_tokens: int
) -> tuple[int, float, int, int, int]:
    """A hybrid model's cache as vLLM 0.33 lays it out: ``(block_size, block_bytes,
    num_blocks, state_blocks, attention_groups)``. Layers go in groups of one kind and
    equal size (the fewer layers of a kind, or the more where they are under 1.5 times
    as many; a kind's last group padded); a block is one page of every layer of a
    group; an attention page holds ``block_size`` tokens, the smallest multiple of
    ``align`` whose page holds a conv state, which is padded to it. Every group draws
    blocks from the one pool (less vLLM's null block): a running request holds
    ``1 + spec_tokens`` state blocks per conv-state group (one per draft) and a block
    per ``block_size`` tokens per attention group."""
    attention, conv = model.layers - model.conv_layers, model.conv_layers
    token_page = footprint.kv_bytes_per_token / attention  # one layer's K and V per token
    block_size = _hybrid_block_size(model, footprint, align)
    fewer, more = min(attention, conv), max(attention, conv)
    group = more if more < 1.5 * fewer else fewer
    block_bytes = block_size * token_page * group
    num_blocks = int(budget // block_bytes) - 1
    state_blocks = math.ceil(conv / group) * (1 + spec_tokens)
    return block_size, block_bytes, num_blocks, state_blocks, math.ceil(attention / group)


def _hybrid_block_size(model: ModelConfig, footprint: ModelFootprint, align: int) -> int:
    """Tokens of vLLM's hybrid attention block: the smallest multiple of ``align``
    whose page (one layer's K and V) holds a conv state."""
    token_page = footprint.kv_bytes_per_token / (model.layers - model.conv_layers)
    state_page = footprint.kept_state_bytes / model.conv_layers
    return align * math.ceil(state_page / (align * token_page))


def _check_longest(layout: MemoryLayout, table: RequestTable) -> None:
    if table.num_requests == 0:
        return
    # every position but the last output token is computed: prompt + output - 1
    positions = table.prompt_tokens + table.output_tokens - 1
    needs = layout.blocks_for(positions)
    worst = int(np.argmax(needs))
    if needs[worst] > layout.num_blocks:
        raise ConfigError(
            f"memory: request {worst} (prompt {table.prompt_tokens[worst]:,} + output "
            f"{table.output_tokens[worst]:,} tokens) needs {needs[worst]:,} KV blocks, the "
            f"cache holds {layout.num_blocks:,} ({layout.budget_bytes / GIB:.3g} GiB); raise "
            "memory.kv_cache_gib or memory.gpu_memory_utilization, or pick a GPU with more memory"
        )


def memory_summary(
    layout: MemoryLayout, steps: StepTotals, requests: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """The summary's ``memory`` section (its keys: ``results/schema.py``)."""
    busy = steps.sum("duration_s")
    prompt = int(requests["prompt_tokens"].sum())
    cached = int(requests["cached_tokens"].sum())
    unbounded = layout.num_blocks == UNBOUNDED_BLOCKS
    return {
        "budget_source": layout.budget_source,
        "budget_gib": layout.budget_bytes / GIB,
        "weights_gib": layout.weights_bytes / GIB,
        "slots": layout.slots,
        "configured_slots": layout.configured_slots,
        "slots_gib": layout.slots * layout.slot_bytes / GIB,
        "block_size": layout.block_size,
        "capacity_blocks": None if unbounded else layout.num_blocks,
        "capacity_gib": None if unbounded else layout.num_blocks * layout.block_bytes / GIB,
        "peak_usage": steps.peak_kv_usage,
        "mean_usage": steps.sum("kv_busy") / busy if busy else 0.0,
        "preemptions": int(requests["num_preemptions"].sum()),
        "preempted_requests": int((requests["num_preemptions"] > 0).sum()),
        "recomputed_tokens": int(requests["recomputed_tokens"].sum()),
        "prefix_caching": layout.prefix_caching,
        "cached_tokens": cached,
        "prefix_cache_hit_rate": cached / prompt if prompt else 0.0,
    }


def memory_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The GPU and memory lines of the summary table (none for older summaries)."""
    memory, gpu = summary.get("memory"), summary.get("gpu")
    rows = [("gpu", gpu["name"])] if gpu else []
    if memory:
        usage = f"{memory['peak_usage']:.3f} / {memory['mean_usage']:.3f}"
        rows.append(("KV usage peak / mean", usage))
        rows.append(("preemptions", f"{memory['preemptions']:,}"))
        rows.append(("prefix hit rate", f"{memory['prefix_cache_hit_rate']:.3f}"))
    return rows


def gpu_summary(gpu: GpuConfig, profile_device: str, conv_scale: float) -> dict[str, Any]:
    """The summary's ``gpu`` section: the figures the run used and where they came from."""
    resolved, preset = gpu.resolved(), find_preset(gpu.name)
    explicit = [
        name
        for name in ("memory_gb", "memory_bw_bytes_s", "peak_flops", *_LINK_AND_PRICE)
        if getattr(gpu, name) is not None
    ]
    figures = preset.figures if preset is not None else "custom"
    if explicit and preset is not None:
        figures += f"; given: {', '.join(explicit)}"
    if conv_scale == 1.0:
        profile = f"short-conv profile ({profile_device or 'device unknown'}) used as measured"
    else:
        profile = (
            f"short-conv profile measured on {profile_device}: times x {conv_scale:.4g} "
            "(memory-bandwidth ratio)"
        )
    return {
        "name": resolved.name,
        "memory_gb": resolved.memory_gb,
        "memory_bw_bytes_s": resolved.memory_bw_bytes_s,
        "peak_flops": resolved.peak_flops,
        "figures": figures,
        "short_conv_profile_device": profile_device,
        "short_conv_scale": conv_scale,
        "short_conv_note": profile,
        "link": preset.link.name if preset is not None else "custom",
        "price_source": PRICE_SOURCE if preset and gpu.price_per_hour is None else "given",
        **{name: getattr(resolved, name) for name in _LINK_AND_PRICE},
    }


#: The ``gpu`` figures beyond the roofline's: the link of the all-reduces, and the price.
_LINK_AND_PRICE = ("link_bw_bytes_s", "link_latency_us", "price_per_hour")
