"""Simulation results: per-request and per-step tables, the summary, and their files.

A results folder (see ``outdir.py`` for what ``--out`` may touch) holds:

``steps.csv`` -- one row per step, in order:
    ``step`` (0-based), ``start_s``, ``duration_s`` (simulated clock);
    ``num_spec_rows, num_decode_rows, num_prefill_rows``,
    ``num_spec_tokens, num_decode_tokens, num_prefill_tokens``, ``num_rows, num_tokens``
    (live rows and tokens of the plan);
    ``graph_kind`` (``spec``, ``decode``, ``mixed``, or empty when the step ran
    eagerly), ``graph_tokens, graph_rows`` (the bucket; 0 when eager), ``graph_hit``
    (0/1); ``padded_tokens, padded_rows`` (the plan's capacity minus its live part);
    ``model_s, conv_s, host_s, launch_s, engine_s`` (the cost terms of ``cost.StepCost``,
    ``duration_s`` is their sum); ``num_waiting, num_preempted, kv_used_blocks,
    kv_cached_blocks, kv_usage`` (``docs/memory.md``).

``requests.csv`` -- one row per request, in arrival order:
    ``request_id`` (row of the trace after filtering), ``arrival_s, prompt_tokens,
    output_tokens, first_token_s, finish_s``, ``ttft_s`` (first token - arrival),
    ``tpot_s`` ((finish - first token) / (output - 1); empty for one-token outputs),
    ``e2e_s`` (finish - arrival), ``num_steps`` (steps the request was scheduled in),
    ``accepted_tokens, drafted_tokens`` (drafts over its spec steps),
    ``num_preemptions, recomputed_tokens, cached_tokens`` (``docs/memory.md``). In a
    partial run the requests not finished have empty ``finish_s`` (and
    ``first_token_s``, ``ttft_s`` until their first token).

``summary.json``::

    {"stepplan_version", "config": {every setting, by section},
     "trace": {"path", "format", "requests", "span_s", "skipped"},
     "complete": false when the run was stopped early (Ctrl-C, SIGTERM), else true,
     "requests", "finished_requests", "duration_s" (first arrival to last finish),
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
     "time_s": {"model", "short_conv", "host", "launch", "busy", "idle"},
     "memory", "gpu": the cache and the GPU figures (``capacity.memory_summary``,
                      ``capacity.gpu_summary``),
     "live": true when a real toy model ran every step (``live.py``; then
             "acceptance" is its real verification), else false,
     "live_run": {"backend", "device", "device_name", "dtype", "time",
                  "reproducible", "model" (the toy model's shape), "slots",
                  "graphs_captured"} (live runs only)}

Throughput, goodput and latency are over the finished requests (all of them in a
complete run); the step figures over the steps simulated.

``measured_steps.csv`` (``step``, ``plan_us``: host time of ``StepBatch`` validation +
``Planner.compile``) and ``measured.json`` (``{"host": {"plan_us_p50", "plan_us_p90",
"plan_us_mean"}, "run": {"wall_s", "steps_per_s"}, "live_run": {"model_wall_s"}}``)
hold what is measured on the machine and varies from run to run. Everything else is
a function of the inputs: the same command gives byte-identical ``steps.csv``,
``requests.csv`` and ``summary.json`` (unless ``cost.host_cost`` or ``live.time`` is
``measured``, which feed measured times into the clock). In memory
(:class:`SimResult`) ``plan_us`` is a column of ``steps`` and ``measured.json`` is the
summary's ``"measured"`` section; :func:`read_results` puts them back there.

In a live run with ``live.time = "measured"``, ``model_s`` is the model run's
measured wall time and ``conv_s`` and ``launch_s`` are 0 (it includes them).

ITL is the gap between consecutive steps in which a request emitted tokens. A
request is *good* when its TTFT and TPOT meet the SLOs. Latency statistics of an
empty set are ``null``. Parquet files (``*.parquet``) replace the CSVs when asked for
and ``pyarrow`` is importable.
"""

from __future__ import annotations

import csv
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .capacity import memory_rows
from .cost import COST_TERMS
from .outdir import ResultsFolder

GRAPH_KINDS = ("", "spec", "decode", "mixed")  # code 0 is eager
#: Names of the cost terms in the summary's ``time_s`` where they differ from the term's.
_TIME_NAMES = {"conv": "short_conv"}
#: ``steps.csv``'s memory columns (``scheduler.StepMemory``'s fields, in order).
MEMORY_STEP_COLUMNS = ("num_waiting", "num_preempted", "kv_used_blocks", "kv_cached_blocks")
MEMORY_STEP_COLUMNS += ("kv_usage",)

#: The loop's per-step record, in order.
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
    *(f"{term}_s" for term in COST_TERMS),
    *MEMORY_STEP_COLUMNS,
)
#: In-memory step columns in order: ``steps.csv``'s, then the measured ``plan_us``
#: (``measured_steps.csv``), where a reader that joins the two files puts it too.
STEP_COLUMNS = (
    "step",
    *STEP_RECORD[:8],
    "num_rows",
    "num_tokens",
    "graph_kind",
    "graph_tokens",
    "graph_rows",
    "graph_hit",
    *(name for name in STEP_RECORD[11:] if name != "plan_us"),
    "plan_us",
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
#: ``measured_steps.csv``: the measured per-step column, apart from ``steps.csv``.
MEASURED_STEP_COLUMNS = ("step", "plan_us")
#: The summary's section that goes to ``measured.json``.
MEASURED = "measured"
#: Every file a results folder may get (CSV or Parquet tables).
RESULT_FILES = (
    *(
        f"{name}{ext}"
        for name in ("steps", "requests", "measured_steps")
        for ext in (".csv", ".parquet")
    ),
    "summary.json",
    "measured.json",
)
#: Float columns of the step tables (the rest are int64, and ``graph_kind`` text).
FLOAT_STEP_COLUMNS = frozenset(
    ("start_s", "duration_s", "plan_us", *(f"{term}_s" for term in COST_TERMS), "kv_usage")
)
_FLOAT_COLUMNS = FLOAT_STEP_COLUMNS | frozenset(
    ("arrival_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s")
)


@attrs.frozen(eq=False)
class SimResult:
    """A simulation, finished or stopped early (``summary["complete"]``).

    Attributes:
        steps: ``steps.csv`` columns and ``plan_us`` (``measured_steps.csv``),
            ``[num_steps]`` each (``graph_kind`` as str).
        requests: ``requests.csv`` columns, ``[N]`` each.
        itl_s: ``[k], float64`` every inter-token gap.
        summary: the ``summary.json`` document, with ``measured.json``'s under
            ``"measured"``.
    """

    steps: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    itl_s: np.ndarray
    summary: dict[str, Any]


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
    """Over ``requests``, the finished requests' columns."""
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
        **{_TIME_NAMES.get(t, t): float(steps[f"{t}_s"].sum()) for t in COST_TERMS},
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
    *,
    complete: bool = True,
) -> dict[str, Any]:
    """The ``summary.json`` document, with the ``"measured"`` section (see the module
    docstring); request figures are over the finished requests."""
    n = int(requests["request_id"].size)
    done = ~np.isnan(requests["finish_s"])
    finished = {name: column[done] for name, column in requests.items()}
    duration = float(finished["finish_s"].max()) if done.any() else 0.0
    output, prompt = int(finished["output_tokens"].sum()), int(finished["prompt_tokens"].sum())
    count = int(done.sum())
    itl_ms = itl_s * 1e3
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
        "latency_ms": _latency(finished, itl_s),
        "itl_ms_quantiles": np.percentile(itl_ms, np.arange(101)).tolist() if itl_ms.size else [],
        "steps": _step_summary(steps),
        "acceptance": _acceptance(requests, spec_steps),
        "time_s": _times(steps, duration),
        MEASURED: _measured(steps["plan_us"], wall_s),
    }


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


def _write_files(stage: Path, result: SimResult, parquet: bool) -> list[str]:
    """Write the result's files into ``stage``; their names."""
    use_parquet = parquet and parquet_available()
    write_table = _write_parquet if use_parquet else _write_csv
    suffix = ".parquet" if use_parquet else ".csv"
    steps = {k: v for k, v in result.steps.items() if k not in MEASURED_STEP_COLUMNS[1:]}
    measured_steps = {k: result.steps[k] for k in MEASURED_STEP_COLUMNS if k in result.steps}
    summary = {k: v for k, v in result.summary.items() if k != MEASURED}
    tables = {"steps": steps, "requests": result.requests, "measured_steps": measured_steps}
    names = []
    for name, columns in tables.items():
        write_table(stage / f"{name}{suffix}", columns)
        names.append(f"{name}{suffix}")
    documents = {"summary.json": summary, "measured.json": result.summary.get(MEASURED, {})}
    for name, document in documents.items():
        (stage / name).write_text(json.dumps(document, indent=2) + "\n")
        names.append(name)
    return names


def write_results(
    result: SimResult,
    out: str | Path | ResultsFolder,
    *,
    parquet: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write ``result`` into the results folder ``out``; returns the folder.

    ``out`` is a folder already claimed (:class:`ResultsFolder`), or a path that is
    claimed for the write: new or empty, or -- with ``overwrite`` -- an earlier stepplan
    run, whose listed files alone are replaced (see ``outdir.py``). Files are staged
    and renamed into place; a failed write leaves the folder as it was.
    """
    summary_complete = bool(result.summary.get("complete", True))
    if isinstance(out, ResultsFolder):
        out.put(lambda stage: _write_files(stage, result, parquet), complete=summary_complete)
        return out.path
    with ResultsFolder.claim(out, overwrite=overwrite, names=RESULT_FILES) as folder:
        folder.put(lambda stage: _write_files(stage, result, parquet), complete=summary_complete)
    return folder.path


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
    empty, ``summary["itl_ms_quantiles"]`` has its distribution). The measured files,
    when present, come back as the ``plan_us`` column and the ``"measured"`` section."""
    out = Path(out_dir)
    summary = json.loads((out / "summary.json").read_text())
    steps = _read_csv(out / "steps.csv")
    if (out / "measured_steps.csv").exists():
        steps["plan_us"] = _read_csv(out / "measured_steps.csv")["plan_us"]
    if (out / "measured.json").exists():
        summary[MEASURED] = json.loads((out / "measured.json").read_text())
    return SimResult(
        steps=steps,
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
    for term in ("model", "short_conv", "host", "launch", "idle"):
        rows.append((f"time {term} s", _cell(times[term], 3)))
    return rows
