"""Latency CDFs (TTFT, TPOT, ITL) of one or several runs on common axes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import ResultsError

from .canvas import new_figure, plain_log_labels

#: Quantiles ``0, 0.01, ..., 1`` of the inter-token latency, as the summary stores them.
ITL_QUANTILES = np.linspace(0.0, 1.0, 101)
#: A CDF of more values is drawn through this many of them, evenly spread in rank (the
#: smallest and the largest among them): a curve no eye tells from all of them.
CDF_POINTS = 20_000


def request_latency_ms(results: SimResult, column: str) -> np.ndarray:
    """``[n], float64``: a per-request latency column in ms, requests without one
    (a one-token output has no TPOT) left out."""
    values = results.requests.column(column) * 1e3
    return np.sort(values[np.isfinite(values)])


def itl_quantiles_ms(results: SimResult) -> np.ndarray:
    """``[101], float64``: the run's inter-token latency quantiles from ``summary.json``
    (``[0]`` when the run has no inter-token gap, e.g. only one-token outputs)."""
    values = results.summary.get("itl_ms_quantiles")
    try:
        array = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        array = np.zeros(0)
    if array.shape == (0,):
        return array
    if array.shape != ITL_QUANTILES.shape or (np.diff(array) < 0).any():
        raise ResultsError(
            f"{results.label}: summary.json 'itl_ms_quantiles' must hold 101 ascending "
            "numbers (or none)"
        )
    return array


def plot_latency_cdfs(
    runs: Sequence[SimResult],
    labels: Sequence[str] | None = None,
    slo_ms: Mapping[str, float] | None = None,
) -> Figure:
    """CDFs of TTFT, TPOT (per request) and ITL (per token) for every run, one curve each;
    ``slo_ms`` (``{"TTFT": 1000.0, "TPOT": 50.0}``) draws each objective as a dashed
    line on its panel. The runs' legend sits below the panels, off the curves."""
    runs = tuple(runs)
    if not runs:
        raise ResultsError("latency CDFs need at least one run")
    labels = tuple(labels) if labels is not None else tuple(run.label for run in runs)
    if len(labels) != len(runs):
        raise ResultsError(f"{len(labels)} labels for {len(runs)} runs")
    figure = new_figure(11.0, 3.6)
    ttft, tpot, itl = figure.subplots(1, 3, sharey=True)
    for run, label in zip(runs, labels, strict=True):
        run.requests.require_rows("the latency CDFs")
        _cdf(ttft, request_latency_ms(run, "ttft_s"), label)
        _cdf(tpot, request_latency_ms(run, "tpot_s"), label)
        quantiles = itl_quantiles_ms(run)
        if quantiles.size:
            itl.plot(quantiles, ITL_QUANTILES, label=label)
    for axes, name in ((ttft, "TTFT"), (tpot, "TPOT"), (itl, "ITL")):
        axes.set_xlabel(f"{name} (ms)")
        axes.set_xscale("log")
        plain_log_labels(axes.xaxis)
        axes.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
        axes.grid(alpha=0.3)
    for axes, name in ((ttft, "TTFT"), (tpot, "TPOT")):
        target = (slo_ms or {}).get(name)
        if target:
            axes.axvline(target, color="#C44E52", linestyle="--", linewidth=1.2)
            axes.annotate(f"SLO {target:,g} ms", (target, 0.02), xytext=(3, 0),
                          textcoords="offset points", color="#C44E52", fontsize=8)  # fmt: skip
    ttft.set_ylabel("share of requests (ITL: of tokens)")
    handles, names = ttft.get_legend_handles_labels()
    figure.legend(handles, names, loc="outside lower center", ncols=min(4, len(names)), fontsize=8)
    figure.suptitle("Latency CDFs" + (" with the SLOs (dashed)" if slo_ms else ""))
    return figure


def cdf_points(ordered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points that draw the CDF of ``ordered`` (``[n]``, sorted): values and their
    shares of all, at most :data:`CDF_POINTS` of them."""
    share = np.arange(1, ordered.size + 1) / ordered.size
    if ordered.size <= CDF_POINTS:
        return ordered, share
    ranks = np.unique(np.linspace(0, ordered.size - 1, CDF_POINTS).astype(np.int64))
    return ordered[ranks], share[ranks]


def _cdf(axes: Axes, values: np.ndarray, label: str) -> None:
    if values.size:
        axes.step(*cdf_points(values), where="post", label=label)
