"""The ``[gpu]`` section of the settings: the accelerator, a preset of ``gpus.py`` and the
figures that override it. ``config.py`` re-exports it.
"""

from __future__ import annotations

import attrs

from .config_values import (
    INT,
    REAL,
    ConfigError,
    _non_negative,
    _optional,
    _positive,
    _real,
)
from .gpus import find_preset


def _gpu_name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    try:
        find_preset(value)
    except KeyError as exc:
        raise ConfigError(f"{attribute.name}: {exc.args[0]}") from None


@attrs.frozen
class GpuConfig:
    """The accelerator: ``name`` picks a preset of ``gpus.py`` (default H200, whose
    roofline figures are stepplan's measurements: the SPEC §4 copy ceiling and 790
    TFLOP/s bf16 dense); ``memory_gb``, ``memory_bw_bytes_s`` and ``peak_flops`` left
    ``None`` come from the preset, and given override it (``name = "custom"`` needs
    all three). :meth:`resolved` fills them in.

    ``link_bw_bytes_s`` (per direction) and ``link_latency_us`` (per ring step) time
    tensor parallelism's all-reduces; ``price_per_hour`` (US dollars per GPU-hour) prices
    the run; each left ``None`` is the preset's (a custom GPU without them has no
    all-reduce time to give and no price).

    Launch numbers (chosen, not measured; see ``cost.py``): replaying one CUDA graph
    of a whole forward costs ``graph_launch_us`` of host time; without a full graph a
    step launches ``eager_launches_per_layer`` times per layer (vLLM's piecewise mode:
    one graph piece plus the attention or conv op and its metadata copy), each
    ``kernel_launch_us``.
    """

    name: str = attrs.field(default="H200", validator=_gpu_name)
    memory_gb: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_positive
    )
    memory_bw_bytes_s: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_positive
    )
    peak_flops: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_positive
    )
    link_bw_bytes_s: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_positive
    )
    link_latency_us: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_non_negative
    )
    price_per_hour: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_non_negative
    )
    graph_launch_us: float = attrs.field(default=15.0, converter=REAL, validator=_non_negative)
    kernel_launch_us: float = attrs.field(default=5.0, converter=REAL, validator=_non_negative)
    eager_launches_per_layer: int = attrs.field(default=3, converter=INT, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        figures = ("memory_gb", "memory_bw_bytes_s", "peak_flops")
        missing = [f for f in figures if getattr(self, f) is None]
        if find_preset(self.name) is None and missing:
            raise ConfigError(f"{missing[0]}: a custom GPU needs {', '.join(figures)}")

    def resolved(self) -> GpuConfig:
        """This GPU with every figure given: the explicit ones, else the preset's."""
        preset = find_preset(self.name)
        if preset is None:
            return self
        figures = {name: getattr(self, name) for name in _GPU_FIGURES}
        return attrs.evolve(
            self,
            name=preset.name,
            **{k: getattr(preset, k) if v is None else v for k, v in figures.items()},
        )


#: The figures a GPU preset gives and a setting overrides.
_GPU_FIGURES = (
    "memory_gb",
    "memory_bw_bytes_s",
    "peak_flops",
    "link_bw_bytes_s",
    "link_latency_us",
    "price_per_hour",
)
