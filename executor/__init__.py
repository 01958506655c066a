"""stepplan.executor: replays plans (kernels, runtime, vLLM builder, a toy engine)."""

from .runtime import (
    BACKENDS,
    Executor,
    ReplayMismatchError,
    ReplaySignature,
    StepGraphs,
    check_replay,
)

__all__ = [
    "BACKENDS",
    "Executor",
    "ReplayMismatchError",
    "ReplaySignature",
    "StepGraphs",
    "check_replay",
]
