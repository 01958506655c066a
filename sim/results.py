"""Simulation results: per-request and per-step tables, the summary, and their files.

A results folder holds three files, written atomically (all appear together or none
does; an older folder of the same name is replaced whole):

``steps.csv`` -- one row per step, in order:
    ``step`` (0-based), ``start_s``, ``duration_s`` (simulated clock);
    ``num_spec_rows, num_decode_rows, num_prefill_rows``,
    ``num_spec_tokens, num_decode_tokens, num_prefill_tokens``, ``num_rows, num_tokens``
    (live rows and tokens of the plan);
    ``graph_kind`` (``spec``, ``decode``, ``mixed``, or empty when the step ran
    eagerly), ``graph_tokens, graph_rows`` (the bucket; 0 when eager), ``graph_hit``
    (0/1); ``padded_tokens, padded_rows`` (the plan's capacity minus its live part);
    ``plan_us`` (measured host time of ``StepBatch`` validation + ``Planner.compile``,
    not deterministic); ``model_s, conv_s, host_s, launch_s`` (the cost terms,
    ``duration_s`` is their sum; see ``cost.py``); ``num_waiting, num_preempted,
    kv_used_blocks, kv_cached_blocks, kv_usage`` (``docs/memory.md``).

``requests.csv`` -- one row per request, in arrival order:
    ``request_id`` (row of the trace after filtering), ``arrival_s, prompt_tokens,
    output_tokens, first_token_s, finish_s``, ``ttft_s`` (first token - arrival),
    ``tpot_s`` ((finish - first token) / (output - 1); empty for one-token outputs),
    ``e2e_s`` (finish - arrival), ``num_steps`` (steps the request was scheduled in),
    ``accepted_tokens, drafted_tokens`` (drafts over its spec steps),
    ``num_preemptions, recomputed_tokens, cached_tokens`` (``docs/memory.md``).

``summary.json``::

    {"stepplan_version", "config": {every setting, by section},
     "trace": {"path", "format", "requests", "span_s", "skipped"},
     "requests", "duration_s" (first arrival to last finish),
     "throughput": {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"},
     "goodput": {"slo": {"ttft_ms", "tpot_ms"}, "requests_per_s", "share"},
     "latency_ms": {"ttft" | "tpot" | "itl" | "e2e": {"mean", "p50", "p90", "p99"}},
     "itl_ms_quantiles": [101 values, q = 0..100],
     "steps": {"count", "graph_hits", "graph_hit_rate", "padded_tokens",
               "padded_token_share" (padding / (live + padding) tokens), "padded_rows",
               "tokens" (live)},
     "acceptance": {"mean_accepted_per_spec_step", "mean_acceptance_length",
                    "draft_acceptance_rate", "spec_steps", "drafted_tokens",
                    "accepted_tokens"},
     "host": {"plan_us_p50", "plan_us_p90", "plan_us_mean"} (measured),
     "time_s": {"model", "short_conv", "host", "launch", "busy", "idle"},
     "memory", "gpu": the cache and the GPU figures (``capacity.memory_summary``,
                      ``capacity.gpu_summary``),
     "run": {"wall_s", "steps_per_s"} (measured),
     "live": true when a real toy model ran every step (``live.py``; then
             "acceptance" is its real verification), else false,
     "live_run": {"backend", "device", "device_name", "dtype", "time",
                  "reproducible", "model" (the toy model's shape), "slots",
                  "graphs_captured", "model_wall_s" (measured)} (live runs only)}

In a live run with ``live.time = "measured"``, ``model_s`` is the model run's
measured wall time and ``conv_s`` and ``launch_s`` are 0 (it includes them).

ITL is the gap between consecutive steps in which a request emitted tokens. A
request is *good* when its TTFT and TPOT meet the SLOs. Latency statistics of an
empty set are ``null``. Parquet files (``steps.parquet``, ``requests.parquet``)
replace the CSVs when asked for and ``pyarrow`` is importable.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .capacity import memory_rows

GRAPH_KINDS = ("", "spec", "decode", "mixed")  # code 0 is eager

#: ``steps.csv``'s memory columns (``scheduler.StepMemory``'s fields, in order).
MEMORY_STEP_COLUMNS = ("num_waiting", "num_preempted", "kv_used_blocks", "kv_cached_blocks")
MEMORY_STEP_COLUMNS += ("kv_usage",)
#: ``steps.csv`` columns in order; the first block is recorded per step by the loop.
STEP_RECORD = (
    "start_s",
    "duration_s",
    "num_spec_rows",
    "num_decode_rows",
    "num_prefill_rows",
    "num_spec_tokens",
    "num_decode_tokens",
    "num_prefill_tokens",
    "graph_code",
    "graph_tokens",
    "graph_rows",
    "padded_tokens",
    "padded_rows",
    "plan_us",
    "model_s",
    "conv_s",
    "host_s",
    "launch_s",
    *MEMORY_STEP_COLUMNS,
)
STEP_COLUMNS = (
    "step",
    *STEP_RECORD[:8],
    "num_rows",
    "num_tokens",
    "graph_kind",
    "graph_tokens",
    "graph_rows",
    "graph_hit",
    *STEP_RECORD[11:],
)
REQUEST_COLUMNS = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "num_steps",
    "accepted_tokens",
    "drafted_tokens",
    "num_preemptions",
    "recomputed_tokens",
    "cached_tokens",
)
_FLOAT_STEP_COLUMNS = frozenset(
    ("start_s", "duration_s", "plan_us", "model_s", "conv_s", "host_s", "launch_s", "kv_usage")
)
_FLOAT_COLUMNS = _FLOAT_STEP_COLUMNS | frozenset(
    ("arrival_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s")
)


class RequestLog:
    """Per-request accumulators the loop updates after every step.

    Arrays are ``[N]``: ``first_token_s``, ``finish_s``, ``last_emit_s`` (float64,
    NaN until set), ``num_steps``, ``drafted``, ``accepted`` (int64); ``itl_s`` collects
    ``[k], float64`` chunks of inter-token gaps.
    """

    def __init__(self, num_requests: int) -> None:
        self.first_token_s = np.full(num_requests, np.nan)
        self.finish_s = np.full(num_requests, np.nan)
        self.last_emit_s = np.full(num_requests, np.nan)
        self.num_steps = np.zeros(num_requests, np.int64)
        self.drafted = np.zeros(num_requests, np.int64)
        self.accepted = np.zeros(num_requests, np.int64)
        self.itl_s: list[np.ndarray] = []

    def record(
        self,
        ids: np.ndarray,
        emitted: np.ndarray,
        finished: np.ndarray,
        end_s: float,
    ) -> None:
        """One step's rows: ``ids``, ``emitted`` (``[R], int64``), ``finished`` (``[R], bool``)."""
        self.num_steps[ids] += 1
        emitting = ids[emitted > 0]
        last = self.last_emit_s[emitting]
        seen = ~np.isnan(last)
        if seen.any():
            self.itl_s.append(end_s - last[seen])
        if not seen.all():
            self.first_token_s[emitting[~seen]] = end_s
        self.last_emit_s[emitting] = end_s
        if finished.any():
            self.finish_s[ids[finished]] = end_s

    def record_spec(self, ids: np.ndarray, drafts: np.ndarray, accepted: np.ndarray) -> None:
        """Spec rows' drafts and accepted drafts (``[S], int64`` each)."""
        self.drafted[ids] += drafts
        self.accepted[ids] += accepted


@attrs.frozen(eq=False)
class SimResult:
    """A finished simulation.

    Attributes:
        steps: ``steps.csv`` columns, ``[num_steps]`` each (``graph_kind`` as str).
        requests: ``requests.csv`` columns, ``[N]`` each.
        itl_s: ``[k], float64`` every inter-token gap.
        summary: the ``summary.json`` document.
    """

    steps: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    itl_s: np.ndarray
    summary: dict[str, Any]


def step_columns(records: list[tuple[float, ...]]) -> dict[str, np.ndarray]:
    """``steps.csv`` columns from the loop's per-step tuples (``STEP_RECORD`` order)."""
    table = np.array(records, dtype=np.float64).reshape(len(records), len(STEP_RECORD))
    columns = {
        name: table[:, i] if name in _FLOAT_STEP_COLUMNS else table[:, i].astype(np.int64)
        for i, name in enumerate(STEP_RECORD)
    }
    code = columns.pop("graph_code")
    columns["step"] = np.arange(len(records), dtype=np.int64)
    columns["num_rows"] = sum(columns[f"num_{k}_rows"] for k in ("spec", "decode", "prefill"))
    columns["num_tokens"] = sum(columns[f"num_{k}_tokens"] for k in ("spec", "decode", "prefill"))
    columns["graph_kind"] = np.asarray(GRAPH_KINDS, dtype=object)[code]
    columns["graph_hit"] = (code > 0).astype(np.int64)
    return {name: columns[name] for name in STEP_COLUMNS}


def request_columns(
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    log: RequestLog,
) -> dict[str, np.ndarray]:
    """``requests.csv`` columns (``[N]`` each) from the trace and the log."""
    ttft = log.first_token_s - arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (log.finish_s - log.first_token_s) / (output - 1), np.nan)
    return {
        "request_id": np.arange(arrival_s.size, dtype=np.int64),
        "arrival_s": arrival_s,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "first_token_s": log.first_token_s,
        "finish_s": log.finish_s,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": log.finish_s - arrival_s,
        "num_steps": log.num_steps,
        "accepted_tokens": log.accepted,
        "drafted_tokens": log.drafted,
    }


def _stats_ms(values_s: np.ndarray) -> dict[str, float | None]:
    values = values_s[~np.isnan(values_s)] * 1e3
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"mean": float(values.mean()), "p50": p50, "p90": p90, "p99": p99}


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator / denominator) if denominator else 0.0


def _version() -> str:
    try:
        return metadata.version("stepplan")
    except metadata.PackageNotFoundError:
        return "unknown"


def _latency(requests: dict[str, np.ndarray], itl_s: np.ndarray) -> dict[str, Any]:
    return {
        "ttft": _stats_ms(requests["ttft_s"]),
        "tpot": _stats_ms(requests["tpot_s"]),
        "itl": _stats_ms(itl_s),
        "e2e": _stats_ms(requests["e2e_s"]),
    }


def _goodput(requests: dict[str, np.ndarray], slo: dict[str, float], duration: float) -> dict:
    ttft_ok = requests["ttft_s"] * 1e3 <= slo["ttft_ms"]
    tpot = requests["tpot_s"]
    tpot_ok = np.isnan(tpot) | (tpot * 1e3 <= slo["tpot_ms"])
    good = int((ttft_ok & tpot_ok).sum())
    n = requests["request_id"].size
    return {"slo": dict(slo), "requests_per_s": _ratio(good, duration), "share": _ratio(good, n)}


def _step_summary(steps: dict[str, np.ndarray]) -> dict[str, Any]:
    hits = int(steps["graph_hit"].sum())
    tokens, padded = int(steps["num_tokens"].sum()), int(steps["padded_tokens"].sum())
    count = int(steps["step"].size)
    return {
        "count": count,
        "graph_hits": hits,
        "graph_hit_rate": _ratio(hits, count),
        "padded_tokens": padded,
        "padded_token_share": _ratio(padded, tokens + padded),
        "padded_rows": int(steps["padded_rows"].sum()),
        "tokens": tokens,
    }


def _acceptance(requests: dict[str, np.ndarray], spec_steps: int) -> dict[str, Any]:
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


def _times(steps: dict[str, np.ndarray], duration: float) -> dict[str, float]:
    busy = float(steps["duration_s"].sum())
    return {
        "model": float(steps["model_s"].sum()),
        "short_conv": float(steps["conv_s"].sum()),
        "host": float(steps["host_s"].sum()),
        "launch": float(steps["launch_s"].sum()),
        "busy": busy,
        "idle": max(0.0, duration - busy),
    }


def summarize(
    config: dict[str, Any],
    trace: dict[str, Any],
    steps: dict[str, np.ndarray],
    requests: dict[str, np.ndarray],
    itl_s: np.ndarray,
    spec_steps: int,
    wall_s: float,
) -> dict[str, Any]:
    """The ``summary.json`` document (see the module docstring)."""
    n = int(requests["request_id"].size)
    duration = float(np.nanmax(requests["finish_s"])) if n else 0.0
    output, prompt = int(requests["output_tokens"].sum()), int(requests["prompt_tokens"].sum())
    plan_us = steps["plan_us"]
    itl_ms = itl_s * 1e3
    return {
        "stepplan_version": _version(),
        "config": config,
        "trace": trace,
        "requests": n,
        "duration_s": duration,
        "throughput": {
            "requests_per_s": _ratio(n, duration),
            "output_tokens_per_s": _ratio(output, duration),
            "total_tokens_per_s": _ratio(output + prompt, duration),
        },
        "goodput": _goodput(requests, config["slo"], duration),
        "latency_ms": _latency(requests, itl_s),
        "itl_ms_quantiles": np.percentile(itl_ms, np.arange(101)).tolist() if itl_ms.size else [],
        "steps": _step_summary(steps),
        "acceptance": _acceptance(requests, spec_steps),
        "host": {
            "plan_us_p50": float(np.percentile(plan_us, 50)) if plan_us.size else 0.0,
            "plan_us_p90": float(np.percentile(plan_us, 90)) if plan_us.size else 0.0,
            "plan_us_mean": float(plan_us.mean()) if plan_us.size else 0.0,
        },
        "time_s": _times(steps, duration),
        "run": {"wall_s": wall_s, "steps_per_s": _ratio(plan_us.size, wall_s)},
    }


# ----------------------------------------------------------------------------- files


def _cells(values: np.ndarray) -> list[str]:
    if values.dtype.kind == "f":
        return ["" if v != v else repr(v) for v in values.tolist()]  # NaN -> empty
    return [str(v) for v in values.tolist()]


def _write_csv(path: Path, columns: dict[str, np.ndarray]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(zip(*(_cells(v) for v in columns.values()), strict=True))


def _write_parquet(path: Path, columns: dict[str, np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({k: list(v) if v.dtype == object else v for k, v in columns.items()}), path
    )


def parquet_available() -> bool:
    """Whether ``pyarrow`` can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def write_results(result: SimResult, out_dir: str | Path, *, parquet: bool = False) -> Path:
    """Write ``result`` into ``out_dir`` atomically; returns the folder.

    Files go to a temporary folder next to ``out_dir`` that is renamed into place;
    an existing ``out_dir`` is moved aside first and removed after, so a reader
    sees the old folder or the new one, never a half-written one.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        use_parquet = parquet and parquet_available()
        write_table = _write_parquet if use_parquet else _write_csv
        suffix = ".parquet" if use_parquet else ".csv"
        write_table(scratch / f"steps{suffix}", result.steps)
        write_table(scratch / f"requests{suffix}", result.requests)
        (scratch / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
        _swap_in(scratch, out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return out


def _swap_in(scratch: Path, out: Path) -> None:
    if not out.exists():
        os.rename(scratch, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old / "previous")
    os.rename(scratch, out)
    shutil.rmtree(old, ignore_errors=True)


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = list(reader)
    columns: dict[str, np.ndarray] = {}
    for index, name in enumerate(header):
        cells = [row[index] for row in rows]
        if name == "graph_kind":
            columns[name] = np.asarray(cells, dtype=object)
        elif name in _FLOAT_COLUMNS:
            columns[name] = np.array([float(c) if c else np.nan for c in cells], np.float64)
        else:
            columns[name] = np.array([int(c) for c in cells], np.int64)
    return columns


def read_results(out_dir: str | Path) -> SimResult:
    """Read a results folder back (CSV files; ``itl_s`` is not stored and comes back
    empty, ``summary["itl_ms_quantiles"]`` has its distribution)."""
    out = Path(out_dir)
    summary = json.loads((out / "summary.json").read_text())
    return SimResult(
        steps=_read_csv(out / "steps.csv"),
        requests=_read_csv(out / "requests.csv"),
        itl_s=np.zeros(0),
        summary=summary,
    )


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _live_cell(summary: dict[str, Any]) -> str:
    run = summary.get("live_run") if summary.get("live") else None
    if run is None:
        return "off"
    return f"{run['backend']} {run['device']} {run['dtype']}, {run['time']} time"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as ``(label, value)`` text rows, for tables in the CLI and reports."""
    latency, steps, times = summary["latency_ms"], summary["steps"], summary["time_s"]
    rows = [
        ("requests", f"{summary['requests']:,}"),
        ("duration s", _cell(summary["duration_s"], 1)),
        ("throughput req/s", _cell(summary["throughput"]["requests_per_s"], 3)),
        ("output tok/s", _cell(summary["throughput"]["output_tokens_per_s"], 1)),
        ("goodput share", _cell(summary["goodput"]["share"], 3)),
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
        ("plan us p50 (measured)", _cell(summary["host"]["plan_us_p50"], 1)),
    ]
    for term in ("model", "short_conv", "host", "launch", "idle"):
        rows.append((f"time {term} s", _cell(times[term], 3)))
    return rows
