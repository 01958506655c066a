"""How far the simulator's step times and serving figures are from the engine it models.

``stepplan fidelity`` runs the live engine on a trace slice with measured time and keeps
every step's :class:`~stepplan.sim.timing.engine_fit.StepShape` with its measured time
(:class:`StepRecord`). This module scores that record: :func:`step_errors` replays every
warm step through the cost model's engine fit and gives the absolute percentage error by
step kind (``decode``, ``spec``, ``prefill``, ``mixed``); cold steps (a kernel compiled
during the step; graphs are captured outside steps' time) are counted apart, as are steps
the profile does not cover. :func:`end_to_end` compares the live run's serving figures
with a simulation of the same slice. Errors are fractions (0.05 is 5%).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from .engine_fit import EngineFit, StepShape

STEP_KINDS = ("decode", "spec", "prefill", "mixed")
_ROW_KINDS = ("spec", "decode", "prefill")  # StepShape.rows order
#: Serving figures compared end to end: name -> path in ``summary.json``.
END_TO_END = {
    "ttft_p50_ms": ("latency_ms", "ttft", "p50"),
    "ttft_p99_ms": ("latency_ms", "ttft", "p99"),
    "tpot_p50_ms": ("latency_ms", "tpot", "p50"),
    "tpot_p99_ms": ("latency_ms", "tpot", "p99"),
    "output_tokens_per_s": ("throughput", "output_tokens_per_s"),
    "requests_per_s": ("throughput", "requests_per_s"),
}


def step_kind(shape: StepShape) -> str:
    """``spec``, ``decode`` or ``prefill`` when every live row is of that kind, else ``mixed``."""
    present = [kind for kind, rows in zip(_ROW_KINDS, shape.rows, strict=True) if rows]
    return present[0] if len(present) == 1 else "mixed"


@attrs.frozen
class StepRecord:
    """One live step: its shape, its measured time (and the GPU's part of it, where
    measured), and whether it was cold."""

    shape: StepShape
    measured_us: float
    cold: bool = False
    gpu_us: float | None = None


@attrs.frozen(eq=False)
class StepErrors:
    """Per-step errors of one record (warm, covered steps only).

    Attributes:
        kinds: ``[n]`` step kind of each scored step.
        measured_us, predicted_us: ``[n], float64``.
        cold: steps left out as cold.
        uncovered: warm steps the profile does not cover (the roofline's, not scored).
    """

    kinds: np.ndarray
    measured_us: np.ndarray
    predicted_us: np.ndarray
    cold: int
    uncovered: int

    @property
    def ape(self) -> np.ndarray:
        """``[n], float64`` absolute percentage error of each step, as a fraction."""
        return np.abs(self.predicted_us - self.measured_us) / self.measured_us

    def by_kind(self) -> dict[str, dict[str, float | int]]:
        """``{kind: {"n", "mape", "median_ape", "p90_ape", "bias"}}`` (bias: mean signed
        relative error, positive when the simulator predicts too long)."""
        ape, signed = self.ape, (self.predicted_us - self.measured_us) / self.measured_us
        table: dict[str, dict[str, float | int]] = {}
        for kind in STEP_KINDS:
            mask = self.kinds == kind
            if not mask.any():
                continue
            table[kind] = {
                "n": int(mask.sum()),
                "mape": float(ape[mask].mean()),
                "median_ape": float(np.median(ape[mask])),
                "p90_ape": float(np.percentile(ape[mask], 90)),
                "bias": float(signed[mask].mean()),
            }
        return table


def step_errors(records: Sequence[StepRecord], fit: EngineFit) -> StepErrors:
    """Replay every warm record through ``fit`` (see the module docstring)."""
    kinds, measured, predicted = [], [], []
    cold = uncovered = 0
    for record in records:
        if record.cold:
            cold += 1
            continue
        guess = fit.predict_us(record.shape)
        if guess is None:
            uncovered += 1
            continue
        kinds.append(step_kind(record.shape))
        measured.append(record.measured_us)
        predicted.append(guess)
    return StepErrors(
        kinds=np.asarray(kinds, dtype=object),
        measured_us=np.asarray(measured, dtype=np.float64),
        predicted_us=np.asarray(predicted, dtype=np.float64),
        cold=cold,
        uncovered=uncovered,
    )


def _figure(summary: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return None if value is None else float(value)


def end_to_end(
    live: Mapping[str, Any], simulated: Mapping[str, Any]
) -> dict[str, dict[str, float | None]]:
    """``{figure: {"live", "sim", "error"}}`` of two ``summary.json`` documents; ``error``
    is ``(sim - live) / live``, ``None`` where either side has no value."""
    table = {}
    for name, path in END_TO_END.items():
        a, b = _figure(live, path), _figure(simulated, path)
        error = None if a in (None, 0.0) or b is None else (b - a) / a
        table[name] = {"live": a, "sim": b, "error": error}
    return table
