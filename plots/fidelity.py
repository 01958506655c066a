"""The fidelity figure: predicted against measured step time, and the error's distribution."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from .canvas import COLORS, new_figure

_KIND_COLORS = {**COLORS, "mixed": "#8172B2"}


def plot_fidelity(
    measured_us: np.ndarray,
    predicted_us: np.ndarray,
    kinds: Sequence[str] | np.ndarray,
    title: str,
) -> Figure:
    """Two panels: each warm step's predicted against measured time (log axes, the diagonal
    is exact), and the distribution of the signed relative error per step kind.

    Args:
        measured_us, predicted_us: ``[n], float64`` per step.
        kinds: ``[n]`` step kind (``decode``, ``spec``, ``prefill`` or ``mixed``).
        title: the figure's title.
    """
    kinds = np.asarray(kinds, dtype=object)
    figure = new_figure(11.0, 4.2)
    scatter, histogram = figure.subplots(1, 2)
    error = (predicted_us - measured_us) / measured_us * 100.0
    low = float(min(measured_us.min(), predicted_us.min())) if measured_us.size else 1.0
    high = float(max(measured_us.max(), predicted_us.max())) if measured_us.size else 10.0
    scatter.plot([low, high], [low, high], color="#444444", linewidth=0.8, label="exact")
    span = max(5.0, float(np.percentile(np.abs(error), 99))) if error.size else 5.0
    bins = np.linspace(-span, span, 41)
    for kind in ("decode", "spec", "prefill", "mixed"):
        mask = kinds == kind
        if not mask.any():
            continue
        color = _KIND_COLORS[kind]
        mape = float(np.abs(error[mask]).mean())
        label = f"{kind} ({int(mask.sum())} steps, MAPE {mape:.1f}%)"
        scatter.scatter(measured_us[mask], predicted_us[mask], s=6, color=color, label=label)
        histogram.hist(error[mask], bins=bins, color=color, alpha=0.6, label=kind)
    scatter.set(xscale="log", yscale="log", xlabel="measured step time (µs)")
    scatter.set(ylabel="predicted step time (µs)", title="per step")
    scatter.legend(fontsize=8)
    histogram.axvspan(-5.0, 5.0, color="#DDDDDD", zorder=0, label="±5%")
    histogram.set(xlabel="predicted − measured (% of measured)", ylabel="steps")
    histogram.set(title="error distribution")
    histogram.legend(fontsize=8)
    figure.suptitle(title)
    return figure
