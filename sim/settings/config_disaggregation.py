"""The ``[disaggregation]`` section of the settings: a prefill pool apart from the
decode pool (``deployment/disaggregated.py``). ``config.py`` re-exports it.

The decode pool is the deployment the other sections describe (``gpu``,
``parallel.tensor``, ``deployment.replicas``); this section adds the prefill pool
beside it (its replicas, GPU preset and tensor-parallel ranks) and the link a request's
KV blocks and conv state cross between them (``links.py``). ``prefill_replicas = 0``
keeps prefill and decode on the same replicas.
"""

from __future__ import annotations

from typing import Any

import attrs

from .config_deployment import MAX_REPLICAS
from .config_parallel import MAX_TENSOR_RANKS, check_tensor_parallel
from .config_values import INT, ConfigError, _integer, _one_of, _optional
from .gpus import find_preset
from .links import KV_LINK_NAMES


def _prefill_count(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not 0 <= value <= MAX_REPLICAS:
        raise ConfigError(f"{attribute.name}: must be 0 (off) to {MAX_REPLICAS}, got {value}")


def _ranks(instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and not 1 <= value <= MAX_TENSOR_RANKS:
        raise ConfigError(f"{attribute.name}: must be 1 to {MAX_TENSOR_RANKS}, got {value}")


def _preset(instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    if value is None:
        return
    try:
        preset = find_preset(value)
    except KeyError as exc:
        raise ConfigError(f"{attribute.name}: {exc.args[0]}") from None
    if preset is None:
        raise ConfigError(f"{attribute.name}: name a preset (a custom GPU is the decode pool's)")


@attrs.frozen
class DisaggregationConfig:
    """A prefill pool beside the decode pool (see the module docstring).

    Attributes:
        prefill_replicas: replicas of the prefill pool (0: no disaggregation).
        prefill_gpu: the prefill pool's GPU preset (``None``: ``gpu.name``'s GPU).
        prefill_tensor: its tensor-parallel ranks (``None``: ``parallel.tensor``).
        link: a name of ``links.KV_LINKS``: what the state crosses.
    """

    prefill_replicas: int = attrs.field(default=0, converter=INT, validator=_prefill_count)
    prefill_gpu: str | None = attrs.field(default=None, validator=_preset)
    prefill_tensor: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_ranks
    )
    link: str = attrs.field(default="infiniband-400", validator=_one_of(KV_LINK_NAMES))

    @property
    def enabled(self) -> bool:
        """Prefill runs on a pool of its own."""
        return self.prefill_replicas > 0


def prefill_pool_config(config: Any) -> Any:
    """The settings of the prefill pool's replicas (``config``: the whole ``SimConfig``):
    the run's, with the pool's GPU, ranks and replica count, and no disaggregation."""
    section = config.disaggregation
    gpu = config.gpu
    if section.prefill_gpu is not None and find_preset(section.prefill_gpu) != find_preset(
        gpu.name
    ):  # another preset: its own figures, the run's launch settings
        gpu = type(gpu)(
            name=section.prefill_gpu,
            graph_launch_us=gpu.graph_launch_us,
            kernel_launch_us=gpu.kernel_launch_us,
            eager_launches_per_layer=gpu.eager_launches_per_layer,
        )
    tensor = config.parallel.tensor if section.prefill_tensor is None else section.prefill_tensor
    return attrs.evolve(
        config,
        gpu=gpu,
        parallel=attrs.evolve(config.parallel, tensor=tensor),
        deployment=attrs.evolve(config.deployment, replicas=section.prefill_replicas),
        disaggregation=DisaggregationConfig(),
    )


def check_disaggregation(config: Any) -> None:
    """Refuse a prefill pool with settings that take one engine, or whose ranks do not
    split the model (``config``: the whole ``SimConfig``)."""
    if not config.disaggregation.enabled:
        return
    for taken, why in (
        (config.live.enabled, "live.enabled: live mode runs one engine"),
        (config.acceptance.model == "replay", "acceptance.model: replay reads one engine's ids"),
        (
            config.scheduler.implementation != "stepplan",
            "scheduler.implementation: the pools run stepplan's own scheduler",
        ),
    ):
        if taken:
            raise ConfigError(f"{why}; it takes disaggregation.prefill_replicas = 0")
    prefill = prefill_pool_config(config)
    if prefill.parallel.tensor > 1:
        measured = "cost.profile" if config.cost.profile is not None else None
        try:
            check_tensor_parallel(prefill.parallel.tensor, config.model, True, measured)
        except ConfigError as exc:
            raise ConfigError(f"disaggregation.prefill_tensor: {exc}") from None
