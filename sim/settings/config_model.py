"""The ``[model]`` section of the settings: which model is served, by preset
(``presets.py``) with explicit figures overriding it. ``config.py`` re-exports it, so
settings import from ``stepplan.sim.settings.config`` alone.
"""

from __future__ import annotations

from typing import Any

import attrs

from .config_values import ConfigError, _integer, _non_negative, _optional, _positive, _real, _text
from .presets import CUSTOM_MODEL, MODEL_PRESETS, model_figures


def _model_name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    _text(instance, attribute, value)
    if value != CUSTOM_MODEL and value not in MODEL_PRESETS:
        known = ", ".join([*MODEL_PRESETS, CUSTOM_MODEL])
        raise ConfigError(f"{attribute.name}: unknown model {value!r} (known: {known})")


@attrs.frozen
class ModelConfig:
    """The served model: ``name`` picks a preset of ``presets.py`` (default ``hybrid-8b``,
    the model live mode builds), whose every dimension the cost model, the memory model
    and the live engine share; a field given here overrides the preset's (``custom``
    needs them all). Fields left ``None`` take the preset's: :meth:`resolved` fills them.

    ``num_heads`` and ``num_kv_heads`` (attention's query and KV heads) matter only to
    tensor parallelism (``parallel.py``), so a custom model may leave them out.

    ``params`` and ``kv_bytes_per_token`` follow from the preset's dimensions
    (``presets.num_params``, ``presets.kv_bytes_per_token``). ``max_model_len`` is the
    context in tokens: a request whose prompt plus output exceeds it is rejected before
    the simulation, as vLLM rejects it (``RequestTable.within_model_len``).
    """

    name: str = attrs.field(default="hybrid-8b", validator=_model_name)
    params: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_positive
    )
    layers: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    hidden_size: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    conv_layers: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_non_negative
    )
    kv_bytes_per_token: float | None = attrs.field(
        default=None, converter=_optional(_real), validator=_non_negative
    )
    dtype_bytes: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    conv_channels: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    conv_kernel_size: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    conv_dilation: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    max_model_len: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    num_heads: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    num_kv_heads: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )

    def __attrs_post_init__(self) -> None:
        figures = self._figures()
        if figures["conv_layers"] > figures["layers"]:
            raise ConfigError(
                f"conv_layers: {figures['conv_layers']} exceeds layers = {figures['layers']}"
            )

    def _figures(self) -> dict[str, Any]:
        """Every figure: the explicit ones, else the preset's (``custom``: all explicit)."""
        preset = model_figures(self.name)
        given = {name: getattr(self, name) for name in _MODEL_FIGURES}
        missing = [
            name
            for name, value in given.items()
            if value is None and name not in preset and name not in _OPTIONAL_FIGURES
        ]
        if missing:
            raise ConfigError(f"model: a custom model needs {', '.join(missing)}")
        return {k: preset.get(k) if v is None else v for k, v in given.items()}

    def resolved(self) -> ModelConfig:
        """This model with every figure given: the explicit ones, else the preset's."""
        if all(getattr(self, name) is not None for name in _MODEL_FIGURES):
            return self
        return attrs.evolve(self, **self._figures())


_MODEL_FIGURES = tuple(f.name for f in attrs.fields(ModelConfig) if f.name != "name")
#: Figures a custom model may leave out (``None`` after :meth:`ModelConfig.resolved`).
_OPTIONAL_FIGURES = ("num_heads", "num_kv_heads")
