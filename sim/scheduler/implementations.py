"""The schedulers a run may take its decisions from, one entry per
``scheduler.implementation`` name (``config.SCHEDULER_IMPLEMENTATIONS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..memory_sizing import MemoryLayout, one_rank_model
from ..settings.config import SimConfig
from ..state_blocks import block_pool
from ..traces import RequestTable
from .core import Scheduler


def _stepplan(table: RequestTable, config: SimConfig, layout: MemoryLayout) -> Scheduler:
    return Scheduler(table, config.scheduler, block_pool(layout, table))


def _vllm(table: RequestTable, config: SimConfig, layout: MemoryLayout) -> Any:
    from .vllm_engine_scheduler import VllmEngineScheduler  # imports vLLM: only when chosen

    # vLLM plans one worker's cache, as the layout holds one rank's figures
    model = one_rank_model(config.model, config.parallel.tensor)
    return VllmEngineScheduler(table, config.scheduler, layout, model)


#: name -> a scheduler over a trace, its settings and its memory layout.
SCHEDULERS: dict[str, Callable[[RequestTable, SimConfig, MemoryLayout], Any]] = {
    "stepplan": _stepplan,
    "vllm": _vllm,
}


def make_scheduler(table: RequestTable, config: SimConfig, layout: MemoryLayout) -> Any:
    """The scheduler ``config.scheduler.implementation`` names, over ``table``."""
    return SCHEDULERS[config.scheduler.implementation](table, config, layout)
