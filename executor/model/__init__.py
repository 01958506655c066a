"""stepplan.executor.model: a hybrid model engine (short conv + attention) built from a
:class:`ModelShape`, its conv layers run by the :class:`~stepplan.executor.Executor`."""

from .kv_cache import KVCache, MemoryNeed, MemoryTooSmallError, check_memory
from .metadata import StepShape, sample_positions
from .runner import HybridModelRunner, StepTiming
from .shape import ATTENTION, CONV, LAYER_KINDS, ModelShape
from .weights import ModelWeights, make_weights

__all__ = [
    "ATTENTION",
    "CONV",
    "LAYER_KINDS",
    "HybridModelRunner",
    "KVCache",
    "MemoryNeed",
    "MemoryTooSmallError",
    "ModelShape",
    "ModelWeights",
    "StepShape",
    "StepTiming",
    "check_memory",
    "make_weights",
    "sample_positions",
]
