"""What vLLM's scheduler cannot carry through, told in one line: a request longer than
``model.max_model_len``, refused before the run (vLLM would end it early, capped, and the
run would wait for the rest), and, once a vLLM-scheduled run stalls, the request vLLM
holds and why it goes no further, read from vLLM's queues and block pool
(``stall.py`` writes the line).
"""

from __future__ import annotations

from typing import Any

from ..settings.config import ConfigError
from ..settings.config_model import ModelConfig
from ..traces import RequestTable, TraceError


def check_model_len(table: RequestTable, max_model_len: int) -> None:
    """Refuse ``table`` when a request's prompt plus output exceeds ``max_model_len``
    (:meth:`RequestTable.beyond_model_len`, the rule by which ``prepare_requests`` drops
    them), naming the first of them; a :class:`TraceError` in one line."""
    beyond = table.beyond_model_len(max_model_len)
    if beyond.size == 0:
        return
    first = int(beyond[0])
    source, line, what = table.where(first)
    prompt, output = int(table.prompt_tokens[first]), int(table.output_tokens[first])
    more = beyond.size - 1
    others = f" ({more:,} more request{'s' if more > 1 else ''} too)" if more else ""
    raise TraceError(
        source,
        line,
        f"{what}has prompt {prompt:,} + output {output:,} tokens, more than "
        f"model.max_model_len = {max_model_len:,}{others}, which vLLM's scheduler never "
        "finishes: drop such requests as the command line does "
        "(stepplan.sim.run.prepare_requests) or raise model.max_model_len",
    )


def check_page_bytes(model: ModelConfig) -> None:
    """Refuse a hybrid ``model`` (resolved) whose ``kv_bytes_per_token`` is not whole K
    and V values in each of its attention layers: vLLM sizes a hybrid model's blocks by
    whole heads, so its pool would part from stepplan's; a :class:`ConfigError` in one
    line. (An attention-only model's blocks are handed to vLLM counted, not sized.)"""
    attention = model.layers - model.conv_layers
    if not 0 < model.conv_layers < model.layers:
        return
    value = 2 * model.dtype_bytes * attention  # a K and a V value of every attention layer
    if model.kv_bytes_per_token % value == 0:
        return
    raise ConfigError(
        f"model.kv_bytes_per_token = {model.kv_bytes_per_token:g} is not whole K and V "
        f"values of {model.dtype_bytes}-byte elements in each of the {attention} attention "
        f"layers (a multiple of {value:,}), as vLLM's pages of a hybrid model are sized: "
        "give the model's real figure to --scheduler vllm"
    )


def held_request(scheduler: Any) -> tuple[int, str] | None:
    """The request that holds a stalled ``scheduler`` (a
    :class:`~.vllm_engine_scheduler.VllmEngineScheduler`) and what holds it, in words
    that follow its lengths in the stall line; ``None`` when vLLM holds none of the
    unfinished requests. In order: one vLLM ended before its output was out, the first
    vLLM keeps running without scheduling it, the first vLLM would admit next."""
    engine, entries = scheduler.engine, list(scheduler.unfinished.values())
    for entry in entries:
        if entry.request.request_id not in engine.requests:
            return entry.index, _ended(scheduler, entry)
    running = {request.request_id for request in engine.running}
    for entry in entries:
        if entry.request.request_id in running:
            return entry.index, _unscheduled(scheduler, entry)
    # vLLM drains the waiting requests that hold blocks before the others
    for request in [*engine.kv_holding_waiting, *engine.waiting]:
        entry = scheduler.unfinished.get(request.request_id)
        if entry is not None:
            return entry.index, _not_admitted(scheduler, entry)
    return None


def _ended(scheduler: Any, entry: Any) -> str:
    request = entry.request
    said = (
        f"was ended by vLLM's scheduler ({request.status}) after "
        f"{request.num_output_tokens:,} of its {int(scheduler.output[entry.index]):,} "
        "output tokens"
    )
    return f"{said}: {_too_long(scheduler, entry) or 'vLLM finished it early'}"


def _unscheduled(scheduler: Any, entry: Any) -> str:
    computed = entry.request.num_computed_tokens
    said = (
        "is held running by vLLM's scheduler, which schedules none of its tokens past "
        f"the {computed:,} computed"
    )
    return f"{said}: {_too_long(scheduler, entry) or _settings(scheduler)}"


def _not_admitted(scheduler: Any, entry: Any) -> str:
    engine, request = scheduler.engine, entry.request
    said = "is held waiting by vLLM's scheduler while nothing runs"
    manager = engine.kv_cache_manager
    groups = len(engine.kv_cache_config.kv_cache_groups)
    tokens = request.num_tokens
    # vLLM's own count for the whole request, no block taken from the prefix cache
    needs = manager.coordinator.get_num_blocks_to_allocate(
        request.request_id, tokens, ((),) * groups, 0, 0, 0, tokens
    )
    pool = manager.block_pool
    free, capacity = pool.get_num_free_blocks(), pool.num_gpu_blocks - 1  # less its null block
    if needs > free:
        return (
            f"{said}: its {tokens:,} tokens need {needs:,} blocks of vLLM's KV cache, which "
            f"has {free:,} free of {capacity:,} (memory.kv_cache_gib)"
        )
    return f"{said}: {_settings(scheduler)}"


def _too_long(scheduler: Any, entry: Any) -> str | None:
    """Why vLLM caps ``entry``: it is longer than ``max_model_len``; ``None`` if not."""
    limit = scheduler.engine.max_model_len
    if entry.index not in scheduler.table.beyond_model_len(limit):
        return None
    return f"prompt + output exceed model.max_model_len = {limit:,} tokens"


def _settings(scheduler: Any) -> str:
    config = scheduler.config
    return (
        f"vLLM's scheduler schedules nothing (scheduler.max_num_batched_tokens = "
        f"{config.max_num_batched_tokens:,}, scheduler.max_num_seqs = "
        f"{config.max_num_seqs:,})"
    )
