"""A toy model and a small real engine on the executor (the demo, and sim's live mode).

:mod:`.toy_model` is a seeded toy language model whose blocks run the short conv
through an :class:`~stepplan.executor.Executor`, with a dense oracle;
:mod:`.engine` serves requests on it with continuous batching, chunked prefill
and n-gram speculative decoding.
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
from .toy_model import (
    ToyModelConfig,
    ToyModelRunner,
    ToyWeights,
    dense_greedy_tokens,
    make_weights,
    new_state_pool,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "NgramIndex",
    "Proposer",
    "SlotPool",
    "ToyModelConfig",
    "ToyModelRunner",
    "ToyWeights",
    "accepted_prefix",
    "dense_greedy_tokens",
    "make_weights",
    "new_state_pool",
    "propose_drafts",
]
