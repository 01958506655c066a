"""The ``[deployment]`` section of the settings: engine replicas behind a router
(``deployment/``). ``config.py`` re-exports it.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..deployment.routers import ROUTER_NAMES
from .config_values import INT, ConfigError, _one_of

#: The most replicas one run takes: each holds its own arrays over the whole trace.
MAX_REPLICAS = 1024


def _replica_count(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not 1 <= value <= MAX_REPLICAS:
        raise ConfigError(f"{attribute.name}: must be 1 to {MAX_REPLICAS}, got {value}")


@attrs.frozen
class DeploymentConfig:
    """Engine replicas behind a router (``deployment/``): each replica is a whole engine
    with this config's scheduler, memory and cost; the router picks one per arrival.

    Attributes:
        replicas: engine instances (1: one engine, no ``replica`` column in the tables).
        router: a name of ``deployment.routers.ROUTERS``.
    """

    replicas: int = attrs.field(default=1, converter=INT, validator=_replica_count)
    router: str = attrs.field(default="round-robin", validator=_one_of(ROUTER_NAMES))


def check_replicas(replicas: int, config: Any) -> None:
    """The settings that take one engine only, refused with more ``replicas`` (``config``:
    the whole ``SimConfig``)."""
    if replicas == 1:
        return
    for taken, why in (
        (config.live.enabled, "live.enabled: live mode runs one engine"),
        (
            config.acceptance.model == "replay",
            "acceptance.model: replay reads accepted counts by a single engine's request ids",
        ),
        (
            config.scheduler.implementation != "stepplan",
            "scheduler.implementation: replicas run stepplan's own scheduler",
        ),
    ):
        if taken:
            raise ConfigError(f"{why}; it takes deployment.replicas = 1, got {replicas}")
