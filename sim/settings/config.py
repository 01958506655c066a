"""Simulation settings: frozen sections read from TOML and overridden from the command line.

A TOML file has one table per section, each key a field of that section's class::

    name = "azure-q4"
    seed = 7

    [scheduler]
    max_num_seqs = 128

    [memory]            # KV cache, conv-state slots, prefix cache (docs/memory.md)
    kv_cache_gib = 40

    [gpu]               # a preset of gpus.py (docs/presets.md)
    name = "A100"

    [deployment]        # replicas behind a router (``deployment/``)
    replicas = 4
    router = "prefix-aware"

Unknown sections or keys are errors (a misspelt key must not be silently ignored), and
values are checked as the flags check them (``config_values.py``: ``64.5`` is not an
integer). Rules across sections hold on the final settings (:func:`check_config`).
Overrides use dotted keys, ``scheduler.max_num_seqs = 128``. The ``[live]``, ``[parallel]``,
``[deployment]``, ``[disaggregation]`` and ``[gpu]`` sections' classes are in
``config_*.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import tomllib

from stepplan.planner import GRAPH_MODES, PlanError, PlannerConfig

from ..admission import POLICY_NAMES
from .config_deployment import DeploymentConfig, check_replicas
from .config_disaggregation import DisaggregationConfig, check_disaggregation
from .config_gpu import GpuConfig
from .config_live import (  # noqa: F401 (re-exported: every setting imports from here)
    LIVE_ATTENTION,
    LIVE_BACKENDS,
    LIVE_DEVICES,
    LIVE_DTYPES,
    LIVE_TIMES,
    LiveConfig,
)
from .config_model import ModelConfig
from .config_parallel import ParallelConfig, check_tensor_parallel
from .config_values import (
    INT,
    REAL,
    ConfigError,
    _at_least_one,
    _flag,
    _floats,
    _integer,
    _non_negative,
    _one_of,
    _optional,
    _optional_ints,
    _positive,
    _real,
    _run_name,
    _text,
    flatten,
    read_text,
)

HOST_COSTS = ("model", "measured", "seed")
#: Whose decisions schedule the steps: stepplan's scheduler (``sim/scheduler/core.py``) or
#: the installed vLLM's (``sim/scheduler/vllm_engine_scheduler.py``); ``make_scheduler``
#: in ``sim/scheduler/implementations.py`` holds one entry per name.
SCHEDULER_IMPLEMENTATIONS = ("stepplan", "vllm")
ACCEPTANCE_MODELS = ("per-position", "fixed", "replay")


@attrs.frozen
class SchedulerConfig:
    """The continuous-batching scheduler (vLLM v1 semantics, see ``scheduler.py``).

    Attributes:
        max_num_seqs: most requests running at once (and live rows per step).
        max_num_batched_tokens: token budget per step, spec lookahead included.
        num_spec_tokens: drafts per spec step (``Q = num_spec_tokens + 1``); 0 turns
            speculative decoding off.
        slot_capacity: conv-state slots usable by requests (slots ``1..capacity``;
            slot 0 is NULL). ``None`` means ``max_num_seqs``. The cache's memory may
            allow fewer (``memory_sizing.py``).
        num_groups: layer groups; each gives a request the same slot index in its pool.
        policy: the order waiting requests are admitted in, a name of
            ``admission.POLICIES`` (``fcfs``: first come first served).
        policy_age_limit_s: a request waiting longer than this goes before the policy's
            order, the oldest first (``None``: no limit).
        implementation: whose decisions schedule the steps (``--scheduler``): stepplan's
            own scheduler, or the installed vLLM's (``docs/scheduler_vllm.md``).
    """

    max_num_seqs: int = attrs.field(default=256, converter=INT, validator=_positive)
    max_num_batched_tokens: int = attrs.field(default=8192, converter=INT, validator=_positive)
    num_spec_tokens: int = attrs.field(default=3, converter=INT, validator=_non_negative)
    slot_capacity: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    num_groups: int = attrs.field(default=1, converter=INT, validator=_positive)
    policy: str = attrs.field(default="fcfs", validator=_one_of(POLICY_NAMES))
    policy_age_limit_s: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_non_negative
    )
    implementation: str = attrs.field(
        default="stepplan", validator=_one_of(SCHEDULER_IMPLEMENTATIONS)
    )

    @property
    def slots(self) -> int:
        """Usable slots, never ``None``."""
        return self.max_num_seqs if self.slot_capacity is None else self.slot_capacity


def _fraction(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{attribute.name}: must be in (0, 1], got {value}")


@attrs.frozen
class MemoryConfig:
    """The KV cache, the conv-state slots and the prefix cache (``memory_sizing.py``,
    ``memory.py``; ``docs/memory.md``).

    Attributes:
        block_size: tokens per attention KV block.
        gpu_memory_utilization: share of the GPU's memory the engine may use; the
            cache gets it less the model's weights (vLLM's setting of that name).
        kv_cache_gib: the cache's memory (KV blocks, conv-state slots and kept prefix
            states) in GiB, given directly in place of the share above.
        prefix_caching: reuse cached prompt blocks where the trace carries block
            hashes (Mooncake's ``hash_ids``); without hashes it is off anyway.
        prefix_block_tokens: tokens per hashed block of the trace (Mooncake: 512).
        align_state_blocks: a hybrid model caching prefixes holds its conv states as
            blocks of the one shared pool, each running, left and kept state block
            counted as vLLM's "align" mode holds it (``docs/memory.md``); off: conv-state
            slots reserved apart and ``block_size``-token KV blocks, a simpler model
            that does not bind where vLLM's pool does.
        check: verify the block and slot accounting after every step (slow; a debug
            setting the tests turn on).
    """

    block_size: int = attrs.field(default=16, converter=INT, validator=_positive)
    gpu_memory_utilization: float = attrs.field(default=0.9, converter=REAL, validator=_fraction)
    kv_cache_gib: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_positive
    )
    prefix_caching: bool = attrs.field(
        default=True, converter=attrs.Converter(_flag, takes_field=True)
    )
    prefix_block_tokens: int = attrs.field(default=512, converter=INT, validator=_positive)
    align_state_blocks: bool = attrs.field(
        default=True, converter=attrs.Converter(_flag, takes_field=True)
    )
    check: bool = attrs.field(default=False, converter=attrs.Converter(_flag, takes_field=True))


@attrs.frozen
class PlannerSettings:
    """What the simulator passes to ``PlannerConfig`` besides the scheduler's limits.

    Attributes:
        graph_mode: ``none``, ``full`` (the seed's uniform-batch graphs) or ``mixed``.
        graph_sizes: capture sizes in tokens; ``None`` is vLLM's default list.
        prefill_tile_tokens: tokens per prefill work tile of the kernels.
    """

    graph_mode: str = attrs.field(default="full", validator=_one_of(GRAPH_MODES))
    graph_sizes: tuple[int, ...] | None = attrs.field(
        default=None, converter=attrs.Converter(_optional_ints, takes_field=True)
    )
    prefill_tile_tokens: int = attrs.field(default=64, converter=INT)


@attrs.frozen
class CostConfig:
    """Host-time model and kernel profile.

    Attributes:
        host_cost: ``model`` (deterministic: ``host_base_us + host_per_row_us * rows``
            plus ``host_mixed_us`` when the step is not uniform), ``measured`` (the
            planner's measured time feeds the clock; results are then not
            bit-reproducible) or ``seed`` (the seed builder's SPEC §4 figures).
        host_base_us, host_per_row_us, host_mixed_us: the ``model`` terms, calibrated
            from ``bench/planner_bench.py`` (see ``cost.py``).
        profile: an engine profile JSON (``stepplan profile``): each step it covers lasts
            what the profile's fit predicts for the measured engine, in place of the
            four modelled terms; the rest keep the roofline (``summary["cost"]`` counts
            both).
        kernel_profile: path of a kernel profile JSON, or ``public`` for SPEC §4's
            public kernel; ``None`` uses stepplan's kernels as measured on an H200
            (``stepplan/sim/data/kernel_profile.json``).
    """

    host_cost: str = attrs.field(default="model", validator=_one_of(HOST_COSTS))
    host_base_us: float = attrs.field(default=8.0, converter=REAL, validator=_non_negative)
    host_per_row_us: float = attrs.field(default=0.02, converter=REAL, validator=_non_negative)
    host_mixed_us: float = attrs.field(default=3.5, converter=REAL, validator=_non_negative)
    kernel_profile: str | None = attrs.field(default=None, validator=_text)
    profile: str | None = attrs.field(default=None, validator=_text)


@attrs.frozen
class AcceptanceConfig:
    """How many drafts a spec step accepts (``acceptance.py``).

    Attributes:
        model: ``per-position``, ``fixed`` or ``replay``.
        probs: per-position conditional acceptance probabilities; positions past the
            list reuse its last value. Default: DeepSeek-V3's MTP figure (0.85-0.9).
        length: mean acceptance length (accepted drafts + 1) for ``fixed``, at most
            ``Q`` (:func:`check_config`).
        trace: JSONL path of per-request accepted counts for ``replay``.
    """

    model: str = attrs.field(default="per-position", validator=_one_of(ACCEPTANCE_MODELS))
    probs: tuple[float, ...] = attrs.field(
        default=(0.87,), converter=attrs.Converter(_floats, takes_field=True)
    )
    length: float = attrs.field(default=3.5, converter=REAL, validator=_at_least_one)
    trace: str | None = attrs.field(default=None, validator=_text)

    def __attrs_post_init__(self) -> None:
        if not self.probs or not all(0.0 <= p <= 1.0 for p in self.probs):
            raise ConfigError(f"probs: need probabilities in [0, 1], got {list(self.probs)}")
        if self.model == "replay" and not self.trace:
            raise ConfigError("trace: the replay acceptance model needs a trace path")


@attrs.frozen
class WorkloadConfig:
    """What part of the trace runs, and how fast.

    Attributes:
        rate_scale: arrival rate multiplier (2 halves every inter-arrival gap).
        start_s, end_s: keep arrivals in ``[start_s, end_s)`` of the trace's own clock.
        limit: keep the first ``limit`` requests (after the window).
        rate: requests per second for traces without arrival times (Poisson).
    """

    rate_scale: float = attrs.field(default=1.0, converter=REAL, validator=_positive)
    start_s: float | None = attrs.field(default=None, converter=_optional(_real))
    end_s: float | None = attrs.field(default=None, converter=_optional(_real))
    limit: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    rate: float | None = attrs.field(default=None, converter=_optional(_real), validator=_positive)


@attrs.frozen
class SloConfig:
    """Service-level objectives for goodput: a request is good when both hold."""

    ttft_ms: float = attrs.field(default=1000.0, converter=REAL, validator=_positive)
    tpot_ms: float = attrs.field(default=50.0, converter=REAL, validator=_positive)


SECTIONS: dict[str, type] = {
    "scheduler": SchedulerConfig,
    "memory": MemoryConfig,
    "planner": PlannerSettings,
    "model": ModelConfig,
    "gpu": GpuConfig,
    "cost": CostConfig,
    "acceptance": AcceptanceConfig,
    "workload": WorkloadConfig,
    "slo": SloConfig,
    "live": LiveConfig,
    "parallel": ParallelConfig,
    "deployment": DeploymentConfig,
    "disaggregation": DisaggregationConfig,
}


#: Each field of the planner's ``PlannerConfig`` and the one setting (section, key) it
#: comes from: :attr:`SimConfig.plan` is made from these, and a value the planner refuses
#: is named by its setting.
PLANNER_SETTINGS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "num_spec_tokens": ("scheduler", "num_spec_tokens"),
        "max_num_seqs": ("scheduler", "max_num_seqs"),
        "graph_mode": ("planner", "graph_mode"),
        "graph_sizes": ("planner", "graph_sizes"),
        "prefill_tile_tokens": ("planner", "prefill_tile_tokens"),
    }
)


@attrs.frozen
class SimConfig:
    """Every setting of one simulation (written whole into ``summary.json``), and the
    planner's config they make (:attr:`plan`)."""

    name: str = attrs.field(default="", validator=_run_name)
    seed: int = attrs.field(default=0, converter=INT, validator=_non_negative)
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    memory: MemoryConfig = attrs.Factory(MemoryConfig)
    planner: PlannerSettings = attrs.Factory(PlannerSettings)
    model: ModelConfig = attrs.Factory(ModelConfig)
    gpu: GpuConfig = attrs.Factory(GpuConfig)
    cost: CostConfig = attrs.Factory(CostConfig)
    acceptance: AcceptanceConfig = attrs.Factory(AcceptanceConfig)
    workload: WorkloadConfig = attrs.Factory(WorkloadConfig)
    slo: SloConfig = attrs.Factory(SloConfig)
    live: LiveConfig = attrs.Factory(LiveConfig)
    parallel: ParallelConfig = attrs.Factory(ParallelConfig)
    deployment: DeploymentConfig = attrs.Factory(DeploymentConfig)
    disaggregation: DisaggregationConfig = attrs.Factory(DisaggregationConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (tuples become lists)."""
        return attrs.asdict(self)

    @functools.cached_property
    def plan(self) -> PlannerConfig:
        """The ``PlannerConfig`` every step is compiled with, made from the settings
        :data:`PLANNER_SETTINGS` names; a value the planner refuses is a
        :class:`ConfigError` naming its setting (``scheduler.num_spec_tokens: ...``)."""
        values = {
            field: getattr(getattr(self, section), key)
            for field, (section, key) in PLANNER_SETTINGS.items()
        }
        try:
            return PlannerConfig(**values)
        except PlanError as exc:
            section, key = PLANNER_SETTINGS[exc.field]
            raise ConfigError(f"{section}.{key}{str(exc)[len(exc.field) :]}") from None


def _section(name: str, base: object, values: dict[str, Any]) -> object:
    known = {f.name for f in attrs.fields(type(base))}
    for key in values:
        if key not in known:
            raise ConfigError(f"{name}.{key}: unknown setting (known: {', '.join(sorted(known))})")
    try:
        return attrs.evolve(base, **values)
    except ConfigError as exc:
        raise ConfigError(f"{name}.{exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {exc}") from None


def with_settings(config: SimConfig, settings: dict[str, Any]) -> SimConfig:
    """``config`` with dotted-key settings applied (``{"scheduler.max_num_seqs": 64}``);
    ``name`` and ``seed`` have no section. ``None`` values are skipped."""
    top: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        if value is None:
            continue
        section, _, field = key.partition(".")
        if not field:
            if section not in ("name", "seed"):
                raise ConfigError(f"{key}: unknown setting (use section.key)")
            top[section] = value
        elif section not in SECTIONS:
            raise ConfigError(f"{key}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
        else:
            grouped.setdefault(section, {})[field] = value
    for section, values in grouped.items():
        top[section] = _section(section, getattr(config, section), values)
    return attrs.evolve(config, **top)


def load_config(path: str | Path, base: SimConfig | None = None) -> SimConfig:
    """Read a TOML file over ``base`` (defaults when ``None``)."""
    path = Path(path)
    try:
        document = tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return with_settings(base or SimConfig(), flatten(document))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def check_config(config: SimConfig) -> SimConfig:
    """``config``, once the rules across settings hold; checked on the final settings
    (a file's graph sizes may need the budget a later flag raises). Every limit that
    keeps a run finite is checked here, before anything is allocated."""
    scheduler, sizes = config.scheduler, config.planner.graph_sizes
    budget, q = scheduler.max_num_batched_tokens, scheduler.num_spec_tokens + 1
    budget_name = f"scheduler.max_num_batched_tokens = {budget}"
    if sizes and sizes[-1] > budget:
        raise ConfigError(f"planner.graph_sizes: {sizes[-1]} exceeds {budget_name}")
    if scheduler.max_num_seqs > budget:  # vLLM's rule too: every running request may step
        raise ConfigError(f"scheduler.max_num_seqs: {scheduler.max_num_seqs} exceeds {budget_name}")
    if budget < q:  # a prompt with one token left is padded to Q rows: it would never start
        raise ConfigError(f"{budget_name} is less than Q = scheduler.num_spec_tokens + 1 = {q}")
    acceptance = config.acceptance
    if acceptance.model == "fixed" and q > 1 and acceptance.length > q:
        raise ConfigError(
            f"acceptance.length: {acceptance.length} exceeds Q = scheduler.num_spec_tokens + 1 "
            f"= {q} (a spec step emits at most Q tokens)"
        )
    check_replicas(config.deployment.replicas, config)
    check_disaggregation(config)
    start, end = config.workload.start_s, config.workload.end_s
    if start is not None and end is not None and start >= end:
        raise ConfigError(f"workload.start_s: {start} is not before workload.end_s = {end}")
    if scheduler.implementation != "stepplan" and (
        scheduler.policy != "fcfs" or scheduler.policy_age_limit_s is not None
    ):  # vLLM's own scheduler keeps its own admission order
        raise ConfigError(
            f"scheduler.policy: {scheduler.policy} (and an age limit) needs "
            "scheduler.implementation = stepplan"
        )
    if config.parallel.tensor > 1:
        gpu = config.gpu.resolved()
        has_link = gpu.link_bw_bytes_s is not None and gpu.link_latency_us is not None
        measured = "cost.profile" if config.cost.profile is not None else None
        measured = "live.enabled" if config.live.enabled else measured
        check_tensor_parallel(config.parallel.tensor, config.model, has_link, measured)
    return config
