"""What each setting's value is, in words, where ``--help``, ``stepplan config`` and the
run's notes show it: the one place that says what a setting left unset (``None``) means.

A setting left unset takes a value that follows from others (``model.max_model_len``:
the model preset's, 131072 for ``hybrid-8b``; ``scheduler.slot_capacity``: max_num_seqs)
or from the trace (``workload.end_s``: the trace's end). :func:`setting_text` gives that
value, or its rule where it depends on the trace or device, for a given ``SimConfig``:
``--help`` shows it for the defaults, ``stepplan config`` for the settings it prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .config import SimConfig
from .config_model import ModelConfig


def describe(value: Any) -> str:
    """A value as its flag takes it: lists comma-separated, bools on or off, large floats
    in six digits."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, float) and abs(value) >= 1e6:
        return f"{value:.6g}"  # 4.26e+12, not 4260000000000.0
    return str(value)


def setting_value(config: SimConfig, key: str) -> Any:
    """The value of the dotted setting ``key`` (``scheduler.max_num_seqs``) in ``config``."""
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def setting_keys(config: SimConfig | None = None) -> list[str]:
    """Every setting's dotted key, in ``SimConfig``'s order."""
    config = SimConfig() if config is None else config
    keys = []
    for field in attrs.fields(type(config)):
        value = getattr(config, field.name)
        if attrs.has(type(value)):
            keys += [f"{field.name}.{f.name}" for f in attrs.fields(type(value))]
        else:
            keys.append(field.name)
    return keys


def _model_figure(name: str) -> Callable[[SimConfig], str]:
    def text(config: SimConfig) -> str:
        value = getattr(config.model.resolved(), name)
        return f"{describe(value)}, the {config.model.name} preset's"

    return text


def _gpu_figure(name: str) -> Callable[[SimConfig], str]:
    def text(config: SimConfig) -> str:
        value = getattr(config.gpu.resolved(), name)
        return f"{describe(value)}, the {config.gpu.name} preset's"

    return text


#: The model's figures a preset gives.
MODEL_FIGURES = tuple(f.name for f in attrs.fields(ModelConfig) if f.name != "name")
#: What ``None`` (or the empty ``name``) means, per setting; any other reads "none".
UNSET: dict[str, Callable[[SimConfig], str]] = {
    "name": lambda c: "the trace's name",
    "scheduler.slot_capacity": lambda c: f"{c.scheduler.max_num_seqs}, max_num_seqs",
    "scheduler.policy_age_limit_s": lambda c: "none: no limit",
    "memory.kv_cache_gib": lambda c: (
        f"what memory.gpu_memory_utilization = {c.memory.gpu_memory_utilization} of the "
        "GPU's memory leaves after the weights"
    ),
    "planner.graph_sizes": lambda c: "vLLM's capture sizes for this Q and max_num_seqs",
    **{f"model.{name}": _model_figure(name) for name in MODEL_FIGURES},
    **{
        f"gpu.{name}": _gpu_figure(name)
        for name in ("memory_gb", "memory_bw_bytes_s", "peak_flops")
    },
    "cost.kernel_profile": lambda c: "stepplan's kernels as measured on an H200",
    "cost.profile": lambda c: "none: the roofline",
    "workload.start_s": lambda c: "the trace's start",
    "workload.end_s": lambda c: "the trace's end",
    "workload.limit": lambda c: "all requests; 1,000 of the embedded trace",
    "workload.rate": lambda c: "none: a trace without arrival times arrives at t = 0",
    "live.backend": lambda c: "triton on cuda, reference on cpu",
    "live.dtype": lambda c: f"the {c.model.name} preset's",
    "live.attention": lambda c: "flash on cuda with bf16 or fp16, else sdpa",
    "live.max_len": lambda c: "the trace's longest request",
    "disaggregation.prefill_gpu": lambda c: f"{c.gpu.name}, gpu.name's",
    "disaggregation.prefill_tensor": lambda c: f"{c.parallel.tensor}, parallel.tensor",
}


def setting_text(config: SimConfig, key: str) -> str:
    """``key``'s value in ``config`` as a person reads it: the value, or for an unset one
    what it stands for (``131072 (the hybrid-8b preset's)``)."""
    value = setting_value(config, key)
    if value in (None, "") and key in UNSET:
        return UNSET[key](config)
    return describe(value)
