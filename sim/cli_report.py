"""The ``buckets`` and ``report`` subcommands, and ``simulate --report``.

Part of the command line: the one place where simulation results meet the plots
(``stepplan.plots`` never imports the simulator, and the simulator never draws).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stepplan.planner import ExecutionPlan, StepBatch, compile_plan
from stepplan.plots.results_io import Results, ResultsError, load_results, results_from_columns

from .buckets import (
    BucketError,
    Comparison,
    Score,
    StepDemand,
    assign,
    compare_to_defaults,
    format_table,
    graph_edges,
    sizes_snippet,
    step_demand,
)
from .config import ConfigError, SimConfig, flatten, with_settings
from .results import SimResult
from .run import planner_config

if TYPE_CHECKING:
    from stepplan.plots.bucketing import Bucketing
    from stepplan.plots.report import ReportTable

# The figure modules load matplotlib (about 0.6 s), so they are imported inside the
# functions that draw: every other command starts without it.

#: Errors these commands raise for bad input; ``cli.main`` reports them as one line
#: (exit code 2) rather than a traceback, as it does for every subcommand.
ERRORS = (ResultsError, BucketError, ConfigError, OSError)


def run_config(results: Results) -> SimConfig:
    """The run's settings, read back from its ``summary.json``."""
    try:
        return with_settings(SimConfig(), flatten(dict(results.config)))
    except ConfigError as exc:
        raise ResultsError(f"{results.label}: summary.json config: {exc}") from None


def run_demand(
    results: Results, config: SimConfig, args: argparse.Namespace | None = None
) -> StepDemand:
    """Every step's demand under the run's settings ``config`` (flags in ``args`` win)."""
    return step_demand(
        results.steps.columns,
        num_spec_tokens=_flag(args, "num_spec_tokens", config.scheduler.num_spec_tokens),
        graph_mode=_flag(args, "graph_mode", config.planner.graph_mode),
        max_num_seqs=_flag(args, "max_num_seqs", config.scheduler.max_num_seqs),
    )


def _flag(args: argparse.Namespace | None, name: str, default: Any) -> Any:
    value = getattr(args, name, None) if args is not None else None
    return default if value is None else value


def bucketing_of(demand: StepDemand, score: Score) -> Bucketing:
    """The figure's view of one scored size list."""
    from stepplan.plots.bucketing import Bucketing

    graphs = assign(demand, score.sizes)
    tokens, rows = graph_edges(demand, score.sizes)
    return Bucketing(score.label, graphs.graph_tokens, graphs.graph_rows, tokens, rows)


def comparison_table(comparison: Comparison) -> ReportTable:
    """The bucket comparison as a report table."""
    from stepplan.plots.report import ReportTable

    header = ("sizes list", "graphs", "largest", "hit rate", "padded tokens")
    header += ("padded / all tokens", "padded / graph tokens")
    rows = [
        (
            s.label,
            len(s.sizes),
            s.sizes[-1],
            f"{s.hit_rate:.2%}",
            s.padded_tokens,
            f"{s.padded_share:.3%}",
            f"{s.padded_share_of_graphs:.2%}",
        )
        for s in comparison.scores
    ]
    return ReportTable("CUDA-graph sizes: default lists vs optimal", header, rows)


def run_buckets(args: argparse.Namespace) -> int:
    """``stepplan buckets``: the optimizer against vLLM's and SGLang's default lists."""
    results = load_results(args.results)
    demand = run_demand(results, run_config(results), args)
    comparison = compare_to_defaults(demand, max_graphs=args.max_graphs)
    print(format_table(comparison.scores))
    best = comparison.recommended
    print(f"\n{best.label}: graph_sizes = {list(best.sizes)}")
    if args.write:
        _write_snippet(Path(args.write), best.sizes)
    if args.figure:
        from stepplan.plots.bucketing import plot_bucketing
        from stepplan.plots.canvas import save_figure

        bucketings = [bucketing_of(demand, comparison.scores[0]), bucketing_of(demand, best)]
        title = f"{_run_title(results, demand)}: steps and CUDA-graph buckets"
        save_figure(plot_bucketing(results, bucketings, title), args.figure)
        print(f"figure: {args.figure}")
    return 0


def _run_title(results: Results, demand: StepDemand) -> str:
    trace = results.summary.get("trace", {})
    source = Path(str(trace.get("path", results.label))).stem if isinstance(trace, dict) else ""
    return (
        f"{source or results.label}, {demand.num_steps:,} steps, Q = {demand.num_spec_tokens + 1}, "
        f"{demand.graph_mode} graphs"
    )


def _write_snippet(path: Path, sizes: tuple[int, ...]) -> None:
    from stepplan.plots.canvas import write_atomically

    fmt = {".toml": "toml", ".json": "json"}.get(path.suffix.lower())
    if fmt is None:
        raise BucketError(f"{path}: --write takes a .toml or .json file")
    write_atomically(path, sizes_snippet(sizes, fmt).encode())
    print(f"wrote {path}")


def add_buckets(subparsers: Any) -> None:
    """``buckets RESULTS_DIR [--max-graphs N] [--write FILE] [--figure FILE]``."""
    parser = subparsers.add_parser(
        "buckets",
        help="choose CUDA-graph sizes for a simulated workload (exact optimum)",
        description="Compare vLLM's and SGLang's default CUDA-graph sizes with the optimal "
        "sizes for the steps of a results folder: same graph count, same largest size.",
    )
    parser.add_argument("results", help="results folder of `stepplan simulate`")
    parser.add_argument("--max-graphs", type=int, help="graph budget (default: vLLM's count)")
    parser.add_argument("--write", help="write the optimal sizes as a .toml or .json config")
    parser.add_argument("--figure", help="write the bucketing figure (.png or .svg)")
    parser.add_argument("--num-spec-tokens", type=int, help="override the run's Q - 1")
    parser.add_argument("--graph-mode", choices=("full", "mixed"), help="override the run's")
    parser.add_argument("--max-num-seqs", type=int, help="override the run's")
    parser.set_defaults(handler=run_buckets)


def example_plan(results: Results, config: SimConfig) -> ExecutionPlan:
    """A plan like the run's richest step (most kinds of rows, then most rows), rebuilt
    from that step's counts: for the op-graph figure."""
    steps = results.steps
    steps.require_rows("the op-graph figure")
    counts = {k: steps.column(f"num_{k}_rows") for k in ("spec", "decode", "prefill")}
    kinds = sum((c > 0).astype(np.int64) for c in counts.values())
    row = int(np.lexsort((-steps.column("num_rows"), -kinds))[0])
    lengths = [
        _spread(int(steps.column(f"num_{k}_tokens")[row]), int(counts[k][row]))
        for k in ("spec", "decode", "prefill")
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
    return compile_plan(batch, planner_config(config))


def _spread(tokens: int, rows: int) -> np.ndarray:
    """``[rows], int64`` query lengths summing to ``tokens``, as even as can be."""
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.full(rows, tokens // rows, dtype=np.int64)
    lengths[: tokens % rows] += 1
    return lengths


def build_run_report(
    results: Results, path: Path, others: tuple[Results, ...] = (), max_graphs: int | None = None
) -> Path:
    """Write the HTML report of ``results``: its figures, with the optimal sizes beside
    the run's own, and the bucket comparison table."""
    from stepplan.plots.bucketing import run_bucketing
    from stepplan.plots.report import report_figures, write_report

    config = run_config(results)
    tables, bucketings = [], [run_bucketing(results)]
    if config.planner.graph_mode != "none":
        demand = run_demand(results, config)
        comparison = compare_to_defaults(demand, max_graphs=max_graphs)
        tables.append(comparison_table(comparison))
        bucketings.append(bucketing_of(demand, comparison.recommended))
    plan = example_plan(results, config)
    figures = report_figures(results, bucketings=bucketings, others=others, plan=plan)
    return write_report(results, path, figures=figures, tables=tables)


def run_report(args: argparse.Namespace) -> int:
    """``stepplan report``: one self-contained HTML page for a results folder."""
    results = load_results(args.results)
    others = tuple(load_results(folder) for folder in args.compare or ())
    path = Path(args.out) if args.out else Path(args.results) / "report.html"
    build_run_report(results, path, others, args.max_graphs)
    print(f"report: {path}")
    return 0


def add_report(subparsers: Any) -> None:
    """``report RESULTS_DIR [--out FILE] [--compare DIR ...] [--max-graphs N]``."""
    parser = subparsers.add_parser(
        "report",
        help="write one self-contained HTML report of a results folder",
        description="Summary tables, the bucket comparison and every figure, embedded.",
    )
    parser.add_argument("results", help="results folder of `stepplan simulate`")
    parser.add_argument("--out", help="HTML file (default: RESULTS_DIR/report.html)")
    parser.add_argument("--compare", nargs="+", metavar="DIR", help="more runs for the CDFs")
    parser.add_argument("--max-graphs", type=int, help="graph budget of the bucket comparison")
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


def report_after_simulation(result: SimResult, out: Path, report: str | None) -> Path | None:
    """Write the report of a simulation just run when ``--report`` asked for it."""
    if report is None:
        return None
    path = Path(report) if report else out / "report.html"
    results = results_from_columns(result.steps, result.requests, result.summary, out)
    return build_run_report(results, path)
