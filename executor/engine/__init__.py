"""A small real serving engine on the hybrid model (the demo of the planner and executor).

:mod:`.engine` serves requests on a :class:`~stepplan.executor.model.HybridModelRunner`
with continuous batching, chunked prefill and n-gram speculative decoding;
:class:`NgramIndex` (prompt-lookup drafts in time independent of the stream's length)
and :func:`accepted_prefix` are what sim's live mode drafts and verifies with too.
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

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "NgramIndex",
    "Proposer",
    "SlotPool",
    "accepted_prefix",
    "propose_drafts",
]
