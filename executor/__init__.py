"""stepplan.executor: replays plans (kernels, runtime, vLLM builder, hybrid model, engine)."""

from .backends import BACKENDS, Backend, ReferenceBackend, TritonBackend
from .graphs import ReplayMismatchError, ReplaySignature, StepGraphs, check_replay
from .runtime import Executor

__all__ = [
    "BACKENDS",
    "Backend",
    "Executor",
    "ReferenceBackend",
    "ReplayMismatchError",
    "ReplaySignature",
    "StepGraphs",
    "TritonBackend",
    "check_replay",
]
