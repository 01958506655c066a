"""The summary of a simulation (``summary.json`` with ``measured.json``'s section; its
keys are in ``schema.py``), and its lines as the CLI's and the report's tables show them.

The steps come in chunks (``records.CHUNK_STEPS``): :class:`StepTotals` keeps what the
summary needs of them, so the steps themselves need not stay in memory. A float summed
over steps is numpy's sum over each block of :data:`SUM_STEPS` steps (from step 0),
the blocks' sums added exactly (``math.fsum``): the same figure wherever the steps went
and however they were chunked, and for a run of one block numpy's sum of the column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import numpy as np

from ..memory_sizing import memory_rows
from ..timing.cost import COST_TERMS
from ..timing.pricing import dollar_rows, figure_rows
from .schema import COST_COLUMNS, MEASURED, TIME_NAMES


def _stats_ms(values_s: np.ndarray) -> dict[str, float | None]:
    """Mean and percentiles in ms of the values that are not NaN (one scaled copy of
    them, partitioned in place)."""
    missing = np.isnan(values_s)
    values = (values_s[~missing] if missing.any() else values_s) * 1e3
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    mean = float(values.mean())
    p50, p90, p99 = np.percentile(values, [50, 90, 99], overwrite_input=True).tolist()
    return {"mean": mean, "p50": p50, "p90": p90, "p99": p99}


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator / denominator) if denominator else 0.0


def _version() -> str:
    try:
        return metadata.version("stepplan")
    except metadata.PackageNotFoundError:
        return "unknown"


#: Integer step columns the summary adds up, and float ones (``kv_busy``: ``kv_usage``
#: times ``duration_s``, for the time-weighted KV usage).
_STEP_COUNTS = ("graph_hit", "num_tokens", "padded_tokens", "padded_rows")
_STEP_SUMS = ("duration_s", *(column.name for column in COST_COLUMNS), "kv_busy")


#: Steps whose float figures numpy sums at once (see the module docstring).
SUM_STEPS = 1 << 16


class StepTotals:
    """What the summary needs of the steps, gathered chunk by chunk (:meth:`add`): counts,
    sums (see the module docstring), the peak KV usage, the steps timed by an engine
    profile, and every ``plan_us`` (``[num_steps], float64``, for its percentiles)."""

    def __init__(self) -> None:
        self.count = 0
        self.counts = dict.fromkeys(_STEP_COUNTS, 0)
        self.from_profile = 0
        self.peak_kv_usage = 0.0
        self._sums: dict[str, list[float]] = {name: [] for name in _STEP_SUMS}
        self._block: dict[str, list[np.ndarray]] = {name: [] for name in _STEP_SUMS}
        self._plan_us: list[np.ndarray] = []

    def add(self, steps: Mapping[str, np.ndarray]) -> None:
        """One chunk of ``schema.STEPS_IN_MEMORY`` columns (``[k]`` each)."""
        self.count += int(steps["step"].size)
        for name in _STEP_COUNTS:
            self.counts[name] += int(steps[name].sum())
        self.from_profile += int(np.count_nonzero(steps["engine_s"]))
        usage = steps["kv_usage"]
        if usage.size:
            self.peak_kv_usage = max(self.peak_kv_usage, float(usage.max()))
        for name in _STEP_SUMS[:-1]:
            self._block[name].append(np.array(steps[name], dtype=np.float64))
        # Not ``usage @ duration``: BLAS splits a long dot product over its threads, so its
        # last bits would depend on the core count, and its threads spin on after it.
        self._block["kv_busy"].append(usage * steps["duration_s"])
        self._plan_us.append(np.array(steps["plan_us"], dtype=np.float64))
        while sum(part.size for part in self._block["kv_busy"]) >= SUM_STEPS:
            self._sum_block(SUM_STEPS)

    def _sum_block(self, size: int) -> None:
        """Sum the first ``size`` steps held (a block), keeping the rest for the next."""
        for name, parts in self._block.items():
            held = np.concatenate(parts)
            self._sums[name].append(float(held[:size].sum()))
            self._block[name] = [held[size:]] if held.size > size else []

    def sum(self, name: str) -> float:
        """The float column ``name`` (or ``kv_busy``) summed over every step."""
        held = sum(part.size for part in self._block[name])
        if held:
            self._sum_block(held)  # the last block, shorter: the run is over
        return math.fsum(self._sums[name])

    @property
    def plan_us(self) -> np.ndarray:
        """``[num_steps], float64`` every step's measured planning time."""
        return np.concatenate([np.zeros(0), *self._plan_us])


def _latency(finished: Mapping[str, np.ndarray], itl: dict[str, float | None]) -> dict[str, Any]:
    return {
        "ttft": _stats_ms(finished["ttft_s"]),
        "tpot": _stats_ms(finished["tpot_s"]),
        "itl": itl,
        "e2e": _stats_ms(finished["e2e_s"]),
    }


def _goodput(finished: Mapping[str, np.ndarray], slo: dict[str, float], duration: float) -> dict:
    """Over ``finished``, the finished requests' columns."""
    ttft_ok = finished["ttft_s"] * 1e3 <= slo["ttft_ms"]
    tpot = finished["tpot_s"]
    tpot_ok = np.isnan(tpot) | (tpot * 1e3 <= slo["tpot_ms"])
    good = int((ttft_ok & tpot_ok).sum())
    n = finished["ttft_s"].size
    return {
        "slo": dict(slo),
        "requests": good,
        "requests_per_s": _ratio(good, duration),
        "share": _ratio(good, n),
    }


def _step_summary(steps: StepTotals) -> dict[str, Any]:
    hits, count = steps.counts["graph_hit"], steps.count
    tokens, padded = steps.counts["num_tokens"], steps.counts["padded_tokens"]
    return {
        "count": count,
        "graph_hits": hits,
        "graph_hit_rate": _ratio(hits, count),
        "padded_tokens": padded,
        "padded_token_share": _ratio(padded, tokens + padded),
        "padded_rows": steps.counts["padded_rows"],
        "tokens": tokens,
    }


def _acceptance(requests: Mapping[str, np.ndarray], spec_steps: int) -> dict[str, Any]:
    drafted, accepted = (
        int(requests["drafted_tokens"].sum()),
        int(requests["accepted_tokens"].sum()),
    )
    return {
        "mean_accepted_per_spec_step": _ratio(accepted, spec_steps),
        "mean_acceptance_length": 1.0 + _ratio(accepted, spec_steps) if spec_steps else 0.0,
        "draft_acceptance_rate": _ratio(accepted, drafted),
        "spec_steps": spec_steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
    }


def _times(steps: StepTotals, duration: float) -> dict[str, float]:
    busy = steps.sum("duration_s")
    return {
        **{
            TIME_NAMES.get(term, term): steps.sum(column.name)
            for term, column in zip(COST_TERMS, COST_COLUMNS, strict=True)
        },
        "busy": busy,
        "idle": max(0.0, duration - busy),
    }


#: The finished requests' columns :func:`summarize` reads.
FINISHED_COLUMNS = ("finish_s", "output_tokens", "prompt_tokens", "ttft_s", "tpot_s", "e2e_s")


def summarize(
    config: dict[str, Any],
    trace: dict[str, Any],
    steps: StepTotals,
    requests: Mapping[str, np.ndarray],
    finished: Mapping[str, np.ndarray],
    itl_s: np.ndarray,
    spec_steps: int,
    wall_s: float,
    *,
    complete: bool = True,
    itl_in_place: bool = False,
) -> dict[str, Any]:
    """The ``summary.json`` document, with the ``"measured"`` section (``schema.SUMMARY``
    and ``schema.MEASURED_SUMMARY``). ``requests``: every request's columns (those it
    sums, at least); ``finished``: the finished requests' :data:`FINISHED_COLUMNS`
    (``[finished]`` each), which the request figures are over; ``itl_s``: every
    inter-token gap (``itl_in_place``: scaled and reordered in place)."""
    n = int(requests["finish_s"].size)
    count = int(finished["finish_s"].size)
    duration = float(finished["finish_s"].max()) if count else 0.0
    output, prompt = int(finished["output_tokens"].sum()), int(finished["prompt_tokens"].sum())
    itl = _itl_ms(itl_s, itl_in_place)
    return {
        "stepplan_version": _version(),
        "config": config,
        "trace": trace,
        "complete": complete,
        "requests": n,
        "finished_requests": count,
        "duration_s": duration,
        "throughput": {
            "requests_per_s": _ratio(count, duration),
            "output_tokens_per_s": _ratio(output, duration),
            "total_tokens_per_s": _ratio(output + prompt, duration),
        },
        "goodput": _goodput(finished, config["slo"], duration),
        "latency_ms": _latency(finished, itl[0]),
        "itl_ms_quantiles": itl[1],
        "steps": _step_summary(steps),
        "acceptance": _acceptance(requests, spec_steps),
        "time_s": _times(steps, duration),
        MEASURED: _measured(steps.plan_us, wall_s),
    }


def _itl_ms(
    itl_s: np.ndarray, in_place: bool = False
) -> tuple[dict[str, float | None], list[float]]:
    """The ITL's statistics and its 101 quantiles, in ms, as :func:`_stats_ms` and
    ``np.percentile`` give them, from the gaps (``[k], float64``, never NaN) scaled once
    and partitioned once: the gaps of a long run are many. ``in_place``: scale and
    reorder ``itl_s`` itself (its owner needs it no more), no copy."""
    if itl_s.size == 0:
        return _stats_ms(itl_s), []
    values = np.multiply(itl_s, 1e3, out=itl_s if in_place else None)
    mean = float(values.mean())
    quantiles = np.percentile(values, [50, 90, 99, *range(101)], overwrite_input=True).tolist()
    p50, p90, p99 = quantiles[:3]
    return {"mean": mean, "p50": p50, "p90": p90, "p99": p99}, quantiles[3:]


def _measured(plan_us: np.ndarray, wall_s: float) -> dict[str, Any]:
    """``measured.json``'s figures of ``plan_us`` (``[num_steps], float64``) and the wall time."""
    return {
        "host": {
            "plan_us_p50": float(np.percentile(plan_us, 50)) if plan_us.size else 0.0,
            "plan_us_p90": float(np.percentile(plan_us, 90)) if plan_us.size else 0.0,
            "plan_us_mean": float(plan_us.mean()) if plan_us.size else 0.0,
        },
        "run": {"wall_s": wall_s, "steps_per_s": _ratio(plan_us.size, wall_s)},
    }


#: The ``time_s`` terms the summary table prints (``engine``: an engine profile's time).
TIME_TERMS = ("model", "short_conv", "host", "launch", "engine", "allreduce", "idle")


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _live_cell(summary: dict[str, Any]) -> str:
    run = summary.get("live_run") if summary.get("live") else None
    if run is None:
        return "off"
    return f"{run['backend']} {run['device']} {run['dtype']}, {run['time']} time"


def _plan_us_p50(summary: dict[str, Any]) -> float | None:
    """From the ``"measured"`` section (``measured.json``), or an older summary's ``host``."""
    host = summary.get(MEASURED, summary).get("host")
    return host.get("plan_us_p50") if isinstance(host, dict) else None


def _requests_cell(summary: dict[str, Any]) -> str:
    if summary.get("complete", True):
        return f"{summary['requests']:,}"
    return f"{summary.get('finished_requests', 0):,} of {summary['requests']:,} (partial)"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as ``(label, value)`` text rows, for tables in the CLI and reports."""
    latency, steps, times = summary["latency_ms"], summary["steps"], summary["time_s"]
    rows = [
        ("requests", _requests_cell(summary)),
        ("duration s", _cell(summary["duration_s"], 1)),
        ("throughput req/s", _cell(summary["throughput"]["requests_per_s"], 3)),
        ("output tok/s", _cell(summary["throughput"]["output_tokens_per_s"], 1)),
        ("goodput share", _cell(summary["goodput"]["share"], 3)),
        *dollar_rows(summary),
        *figure_rows(summary),
    ]
    for name in ("ttft", "tpot", "itl", "e2e"):
        for stat in ("mean", "p50", "p99"):
            rows.append((f"{name.upper()} {stat} ms", _cell(latency[name][stat], 2)))
    rows += [
        ("steps", f"{steps['count']:,}"),
        ("graph hit rate", _cell(steps["graph_hit_rate"], 3)),
        ("padded token share", _cell(steps["padded_token_share"], 4)),
        ("live", _live_cell(summary)),
        *memory_rows(summary),
        ("acceptance length", _cell(summary["acceptance"]["mean_acceptance_length"], 3)),
        ("plan us p50 (measured)", _cell(_plan_us_p50(summary), 1)),
    ]
    rows.append(("step times from", _sources_cell(summary)))
    for term in TIME_TERMS:
        rows.append((f"time {term} s", _cell(times.get(term), 3)))
    return rows


def _sources_cell(summary: dict[str, Any]) -> str:
    """Which model timed the steps: the live engine, or an engine profile and the roofline
    (each with its step count)."""
    cost = summary.get("cost")
    if not isinstance(cost, dict):
        return "-"
    if cost.get("source") == "measured":
        return f"live engine ({cost.get('steps_measured', 0):,})"
    profiled, roofline = cost.get("steps_from_profile", 0), cost.get("steps_from_roofline", 0)
    return f"profile {profiled:,}, roofline {roofline:,}" if profiled else f"roofline {roofline:,}"
