"""The ``[live]`` section of the settings: live mode (``live.py``), where a real model
decides acceptance. ``config.py`` holds the other sections and re-exports every name
here, so settings import from ``stepplan.sim.settings.config`` alone.
"""

from __future__ import annotations

import attrs

from .config_values import INT, _flag, _integer, _one_of, _optional, _optional_one_of, _positive

LIVE_BACKENDS = ("reference", "triton")
LIVE_DEVICES = ("cpu", "cuda")
LIVE_TIMES = ("model", "measured")
LIVE_DTYPES = ("float32", "bfloat16", "float16")
LIVE_ATTENTION = ("flash", "sdpa")


@attrs.frozen
class LiveConfig:
    """Live mode (``live.py``): every step runs the simulated model (``model.name``'s
    preset, at full size, seeded random weights), whose greedy tokens verify the drafts in
    place of the acceptance model.

    Attributes:
        enabled: run live (``--live``).
        backend: the executor's ``reference`` (PyTorch) or ``triton`` kernels; ``None``
            picks triton on CUDA, the reference elsewhere.
        device: ``cpu`` or ``cuda``.
        time: ``model`` (the cost model's step time, as without live mode) or
            ``measured`` (each step lasts what the engine took: not reproducible).
        dtype: the model's precision; ``None`` keeps the preset's.
        attention: ``flash`` (CUDA, bf16/fp16) or ``sdpa`` (per-row reference);
            ``None`` picks flash on CUDA.
        max_len: KV-cache positions per slot; ``None`` sizes them for the trace's longest
            request.
        seed: draws the model's weights.
        ngram_max: longest suffix the prompt-lookup draft proposer matches.
    """

    enabled: bool = attrs.field(default=False, converter=attrs.Converter(_flag, takes_field=True))
    backend: str | None = attrs.field(default=None, validator=_optional_one_of(LIVE_BACKENDS))
    device: str = attrs.field(default="cpu", validator=_one_of(LIVE_DEVICES))
    time: str = attrs.field(default="model", validator=_one_of(LIVE_TIMES))
    dtype: str | None = attrs.field(default=None, validator=_optional_one_of(LIVE_DTYPES))
    attention: str | None = attrs.field(default=None, validator=_optional_one_of(LIVE_ATTENTION))
    max_len: int | None = attrs.field(
        default=None, converter=_optional(_integer), validator=_positive
    )
    seed: int = attrs.field(default=0, converter=INT)
    ngram_max: int = attrs.field(default=3, converter=INT, validator=_positive)

    @property
    def engine_backend(self) -> str:
        """The executor backend live mode uses (``backend``, or the device's default)."""
        if self.backend is not None:
            return self.backend
        return "triton" if self.device == "cuda" else "reference"
