"""``stepplan report`` and ``simulate --report``: one self-contained HTML page of a run,
or of both runs of a ``stepplan compare`` folder."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stepplan.planner import ExecutionPlan, StepBatch, compile_plan

from ..buckets.demand import BucketError, compare_to_defaults
from ..progress import CountProgress, count_progress
from ..results.outfile import OutputFile
from ..results.schema import KIND_ROWS, KIND_TOKENS, RESULT_FILES
from ..results.sim_result import SimResult
from ..results.table import ResultsError
from ..settings.config import ConfigError, SimConfig
from .buckets import bucketing_of, comparison_table, run_config, run_demand
from .outputs import REPORT
from .report_capacity import cheapest_page, is_cheapest_folder, read_cheapest_folder
from .report_reading import ReportRun, read_latency, read_report_run
from .report_sweep import build_sweep_report, is_sweep_folder
from .report_verdict import differences, summary_table, verdict_of
from .tables import compare_table

if TYPE_CHECKING:
    from stepplan.plots.report import ReportTable

#: Errors this command raises for bad input; ``cli.main`` reports them as one line
#: (exit code 2) rather than a traceback, as it does for every subcommand.
ERRORS = (ResultsError, BucketError, ConfigError, OSError)
#: What ``stepplan report`` takes, as its error message says it.
EXPECTS = (
    "stepplan report takes a results folder (summary.json, steps.csv and requests.csv, "
    "as `stepplan simulate` writes) or a compare folder (a/ and b/, as `stepplan compare` "
    "writes)"
)
SIDES = ("a", "b")
#: A run of at least this many steps shows its reading's progress (a few seconds).
PROGRESS_STEPS = 200_000


def reading_progress(quiet: bool) -> Callable[[int], CountProgress | None]:
    """What ``read_report_run`` reports the steps read to: progress on stderr for a
    large run, unless ``quiet``."""

    def progress(steps: int) -> CountProgress | None:
        if steps < PROGRESS_STEPS:
            return None
        return count_progress(steps, sys.stderr, unit="step", quiet=quiet, label="report: read")

    return progress


def richest_row(results: SimResult) -> int:
    """The row of the run's richest step: most kinds of rows, then most rows."""
    steps = results.steps
    steps.require_rows("the op-graph figure")
    kinds = sum((steps.column(name) > 0).astype(np.int64) for name in KIND_ROWS.values())
    return int(np.lexsort((-steps.column("num_rows"), -kinds))[0])


def example_plan(results: SimResult, config: SimConfig) -> ExecutionPlan:
    """A plan like the run's richest step (:func:`richest_row`), rebuilt from that step's
    counts: for the op-graph figure."""
    steps = results.steps
    row = richest_row(results)
    counts = {kind: steps.column(name) for kind, name in KIND_ROWS.items()}
    lengths = [
        _spread(int(steps.column(name)[row]), int(counts[kind][row]))
        for kind, name in KIND_TOKENS.items()
    ]
    spec, decode, prefill = (len(part) for part in lengths)
    live = spec + decode + prefill
    batch = StepBatch(
        query_lens=np.concatenate(lengths),
        num_computed_tokens=np.repeat([8, 8, 0], [spec, decode, prefill]),
        slots=np.tile(np.arange(1, live + 1), (config.scheduler.num_groups, 1)),
        num_draft_tokens=np.concatenate([lengths[0] - 1, np.full(decode + prefill, -1)]),
        num_accepted_tokens=np.ones(live, dtype=np.int64),
    )
    return compile_plan(batch, config.plan)


def _spread(tokens: int, rows: int) -> np.ndarray:
    """``[rows], int64`` query lengths summing to ``tokens``, as even as can be."""
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.full(rows, tokens // rows, dtype=np.int64)
    lengths[: tokens % rows] += 1
    return lengths


def build_run_report(
    run: ReportRun,
    out: OutputFile,
    others: tuple[SimResult, ...] = (),
    max_graphs: int | None = None,
    differs: tuple[str, ...] = (),
    **page: Any,
) -> Path:
    """Write the HTML report of ``run`` into ``out``: its figures, with the optimal
    sizes beside the run's own, and the bucket comparison table, under its verdict;
    ``others`` join the latency CDFs; ``differs`` (what a compare's runs differ in) goes
    into the verdict; ``page`` goes to ``build_report`` (``title``, ``leading_tables``)."""
    from stepplan.plots.report import build_report, report_figures

    config = run_config(run.shapes)
    tables, bucketings, front = _graph_parts(run.shapes, config, max_graphs)
    plan = example_plan(run.richest, config)
    step = int(run.richest.steps.column("step")[richest_row(run.richest)])
    summary = run.latency.summary
    slo = summary.get("config", {}).get("slo", {})
    figures = report_figures(
        run.latency,
        bucketings=bucketings,
        others=others,
        plan=plan,
        head=run.head,
        sample=run.sample,
        shapes=run.shapes,
        every=run.every,
        composition=run.composition,
        slo_ms={"TTFT": slo.get("ttft_ms"), "TPOT": slo.get("tpot_ms")},
        plan_title=f"Op graph of one plan: step {step:,}, the run's richest "
        f"({plan.num_rows} rows, {plan.num_tokens:,} tokens; rebuilt from its counts)",
    )
    if front is not None:
        figures["CUDA graphs: predicted step time against graph memory"] = front
    notes = _deployment_parts(run, tables, figures)
    if run.every > 1:
        notes.append(
            f"The host-time and KV-cache figures draw every {run.every:,}th step (the "
            f"KV-cache and queue figure each {run.every:,} steps' peaks); the step "
            "composition over the run, the bucket figure, the tables and the verdict count "
            "every step."
        )
    verdict = verdict_of(summary, run.sample, differs)
    text = build_report(
        run.latency,
        figures=figures,
        tables=tables,
        notes=notes,
        verdict=verdict,
        summary_table=summary_table(summary),
        **page,
    )
    return out.write(text.encode())


def _graph_parts(shapes: SimResult, config: SimConfig, max_graphs: int | None) -> tuple:
    """The report's CUDA-graph parts: the sizes table, the bucketings to draw (the run's,
    then the optimal list's) and the time-memory front figure (or ``None``)."""
    from stepplan.plots.bucketing import run_bucketing

    tables, bucketings = [], [run_bucketing(shapes)]
    if config.planner.graph_mode == "none":
        return tables, bucketings, None
    demand = run_demand(shapes, config)
    comparison = compare_to_defaults(demand, max_graphs=max_graphs)
    tables.append(comparison_table(comparison))
    bucketings.append(bucketing_of(demand, comparison.recommended))
    return tables, bucketings, graph_memory_front(shapes, config, demand, max_graphs)


def graph_memory_front(
    results: SimResult, config: SimConfig, demand: Any, max_graphs: int | None
) -> Any:
    """The figure of predicted step time against graph memory where the run's engine
    profile measured graph memory (``stepplan buckets --front`` draws the same); ``None``
    where it did not, or where the profile cannot be read or does not fit the run."""
    if config.cost.profile is None:
        return None
    from ..buckets.bucket_search import Objective
    from ..buckets.bucket_table import compare_times
    from ..timing.engine_profile import EngineProfileError
    from .buckets import front_figure, run_costs

    try:
        costs, _ = run_costs(demand, config, argparse.Namespace(profile=None, largest=None))
    except (BucketError, ConfigError, EngineProfileError, OSError):
        return None
    if costs.graph_mib is None:
        return None
    objective = Objective(None)
    comparison = compare_times(demand, costs, max_graphs=max_graphs, objective=objective)
    return front_figure(results, demand, costs, comparison, max_graphs, objective)


def _deployment_parts(run: ReportRun, tables: list, figures: dict) -> list[str]:
    """A deployment's replicas table and figure, added to ``tables`` and ``figures``, and
    the notes they need (none for one engine)."""
    deployment = run.latency.summary.get("deployment")
    if isinstance(deployment, dict):
        tables.append(replicas_table(deployment))
    if run.replicas is None:
        return []
    from stepplan.plots.deployment import plot_replicas

    figures["Replicas: queue and KV cache over time"] = plot_replicas(run.replicas)
    return [
        "The step timeline, host-time and KV-cache figures draw replica 0's steps; "
        "the bucket figure and tables count every replica's."
    ]


def replicas_table(deployment: dict[str, Any]) -> ReportTable:
    """The report's table of a deployment's replicas, the router's balance in its title."""
    from stepplan.plots.deployment import replica_rows
    from stepplan.plots.report import ReportTable

    header, rows = replica_rows(deployment.get("per_replica", []))
    title = (
        f"{deployment.get('replicas')} replicas behind {deployment.get('router')}: load "
        f"balance {deployment.get('load_balance', 1.0):.3f} (max / mean tokens), "
        f"{deployment.get('moved_by_prefix', 0):,} requests moved by prefix affinity"
    )
    return ReportTable(title, header, rows)


def is_compare_folder(folder: Path) -> bool:
    """Whether ``folder`` holds the two runs of ``stepplan compare`` (``a/``, ``b/``)."""
    return all((folder / side / "summary.json").is_file() for side in SIDES)


def compare_labels(folder: Path) -> tuple[str, str]:
    """The runs' labels from ``compare.json`` (``A`` and ``B`` when there is none)."""
    path = folder / "compare.json"
    if not path.exists():
        return ("A", "B")
    try:
        document = json.loads(path.read_text())
        return (str(document["a"]["label"]), str(document["b"]["label"]))
    except (ValueError, KeyError, TypeError):
        raise ResultsError(
            f"{path}: expected the labels as `stepplan compare` writes them "
            '({"a": {"label": ...}, "b": {"label": ...}, ...})'
        ) from None


def build_compare_report(
    folder: Path,
    out: OutputFile,
    others: tuple[SimResult, ...] = (),
    max_graphs: int | None = None,
    quiet: bool = True,
) -> Path:
    """One page of both runs of a compare folder: their table with its differences on
    top, then run A's report with run B beside it in the latency CDFs."""
    labels = compare_labels(folder)
    a = read_report_run(folder / SIDES[0], labels[0], reading_progress(quiet))
    b = read_latency(folder / SIDES[1], labels[1])
    lead = _compare_report_table(a.latency, b)
    title = f"{a.latency.label} vs {b.label}"
    changed = differences(a.latency.summary.get("config", {}), b.summary.get("config", {}))
    differs = (
        f"Run A ({a.latency.label}) against run B ({b.label}): B differs in "
        + ("; ".join(changed) if changed else "nothing of its settings (the trace?)")
        + ". The verdict and figures are run A's; the latency CDFs show both.",
    )
    return build_run_report(
        a, out, (b, *others), max_graphs, differs, title=title, leading_tables=(lead,)
    )


def _compare_report_table(a: SimResult, b: SimResult) -> ReportTable:
    from stepplan.plots.report import ReportTable

    table = compare_table((a.label, b.label), a.summary, b.summary)
    title = (
        f"Run A ({a.label}) against run B ({b.label}); "
        "the figures show run A, the latency CDFs both"
    )
    return ReportTable(title, table.header, table.text_rows())


def run_report(args: argparse.Namespace) -> int:
    """``stepplan report``: one self-contained HTML page for a results or compare folder."""
    folder = Path(args.results)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: not a results folder (no such directory); {EXPECTS}")
    is_run = any((folder / name).exists() for name in RESULT_FILES)
    is_sweep = not is_run and is_sweep_folder(folder)
    is_cheapest = not is_run and is_cheapest_folder(folder)
    if not is_run and not is_sweep and not is_cheapest and not is_compare_folder(folder):
        raise ResultsError(f"{folder}: not a results folder; {EXPECTS}")
    out = claim_report(args.out or folder / "report.html", args.overwrite)
    others = tuple(read_latency(Path(other)) for other in args.compare or ())
    if is_sweep:
        build_sweep_report(folder, out)
    elif is_cheapest:
        table, document = read_cheapest_folder(folder)
        out.write(cheapest_page(folder.name, table, document).encode())
    elif is_run:
        run = read_report_run(folder, progress=reading_progress(args.quiet))
        build_run_report(run, out, others, args.max_graphs)
    else:
        build_compare_report(folder, out, others, args.max_graphs, args.quiet)
    print(f"report: {out.shown}")
    return 0


def claim_report(path: str | Path, overwrite: bool) -> OutputFile:
    """The report's file, checked before any work (``sim/results/outfile.py``'s rule)."""
    return OutputFile.claim(path, REPORT, overwrite=overwrite)


def add_report(subparsers: Any) -> None:
    """``report RESULTS_DIR [--out FILE] [--compare DIR ...] [--max-graphs N]``."""
    parser = subparsers.add_parser(
        "report",
        help="write one self-contained HTML report of a results, compare or sweep folder",
        description="Summary tables, the bucket comparison and every figure, embedded. "
        "On a compare folder: both runs' table with its differences, then run A's report "
        "with run B in the latency CDFs. On a sweep folder: what differs across its "
        "points, which meet each SLO, the trade-off figure and every point.",
    )
    parser.add_argument(
        "results",
        help="results folder of `stepplan simulate`, the folder of `stepplan compare` "
        "(both runs on one page) or of `stepplan sweep`",
    )
    parser.add_argument("--out", help="HTML file (default: RESULTS_DIR/report.html)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a report stepplan wrote earlier at that path (never another file)",
    )
    parser.add_argument("--compare", nargs="+", metavar="DIR", help="more runs for the CDFs")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress (a large run's reading shows it)"
    )
    parser.add_argument(
        "--max-graphs",
        type=int,
        help="graph budget of the bucket comparison (default: vLLM's count)",
    )
    parser.set_defaults(handler=run_report)


def add_report_option(parser: argparse.ArgumentParser) -> None:
    """``simulate --report [FILE]``: write the report next to the results."""
    parser.add_argument(
        "--report",
        nargs="?",
        const="",
        metavar="FILE",
        help="also write the HTML report (default file: OUT/report.html)",
    )


def report_after_simulation(
    folder: Path, report: OutputFile | None, quiet: bool = True
) -> Path | None:
    """Write the report of the simulation just written into ``folder`` into ``report``,
    the file ``--report`` claimed before the run (nothing without it)."""
    if report is None:
        return None
    return build_run_report(read_report_run(folder, progress=reading_progress(quiet)), report)
