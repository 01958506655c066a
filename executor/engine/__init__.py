"""A small real serving engine on the hybrid model (the demo of the planner and executor).

:mod:`.engine` serves requests on a :class:`~stepplan.executor.model.HybridModelRunner`
with continuous batching, chunked prefill and n-gram speculative decoding;
:class:`NgramIndex` (prompt-lookup drafts in time independent of the stream's length)
and :func:`accepted_prefix` are what sim's live mode drafts and verifies with too;
:func:`launch_ranks` runs one engine per tensor-parallel rank in a process group.
"""

from .engine import (
    Engine,
    EngineConfig,
    EngineStats,
    NgramIndex,
    Proposer,
    SlotPool,
    accepted_prefix,
    propose_drafts,
)
from .ranks import launch_ranks

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "NgramIndex",
    "Proposer",
    "SlotPool",
    "accepted_prefix",
    "launch_ranks",
    "propose_drafts",
]
