"""The ``[parallel]`` section of the settings: how one replica spreads over GPUs
(``parallel.py``), and the rule it must meet across sections. ``config.py`` re-exports it.
"""

from __future__ import annotations

import attrs

from ..timing.parallel import split_problem
from .config_model import ModelConfig
from .config_values import INT, ConfigError

#: Most tensor-parallel ranks: the GPUs of one NVLink node.
MAX_TENSOR_RANKS = 8


def _tensor_ranks(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not 1 <= value <= MAX_TENSOR_RANKS:
        raise ConfigError(
            f"{attribute.name}: must be 1 to {MAX_TENSOR_RANKS} (the GPUs of one node), got {value}"
        )


@attrs.frozen
class ParallelConfig:
    """How one replica spreads over GPUs (``parallel.py``).

    Attributes:
        tensor: tensor-parallel ranks, one GPU each (at most 8, one NVLink domain):
            weights, KV cache and conv states split across them, two all-reduces per
            layer. Every rank runs the same batch: the planner's batch is the replica's.
    """

    tensor: int = attrs.field(default=1, converter=INT, validator=_tensor_ranks)

    @property
    def gpus_per_replica(self) -> int:
        """The GPUs one replica holds (what its price counts)."""
        return self.tensor


def check_tensor_parallel(
    ranks: int, model: ModelConfig, has_link: bool, measured_by: str | None
) -> None:
    """Refuse ``parallel.tensor = ranks > 1`` where the model does not split over the
    ranks, the GPU has no link figures (``has_link`` false: a custom GPU without them),
    or a single-GPU measurement times the steps (``measured_by``: the setting asking
    for one, ``cost.profile`` or ``live.enabled``)."""
    problem = split_problem(model, ranks)
    if problem is not None:
        raise ConfigError(problem)
    if not has_link:
        raise ConfigError(
            f"gpu.link_bw_bytes_s: a custom GPU at parallel.tensor = {ranks} needs "
            "gpu.link_bw_bytes_s and gpu.link_latency_us (its all-reduces' link)"
        )
    if measured_by is not None:
        raise ConfigError(
            f"parallel.tensor: {ranks} with {measured_by}: that measures one GPU; "
            "tensor parallelism is simulated on the roofline only"
        )
