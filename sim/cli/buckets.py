"""``stepplan buckets``: the graph-size optimizer on a results folder, and the pieces of it
the report shows.

The figure modules load matplotlib (about 0.6 s), so they are imported inside the
functions that draw: every other command starts without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..buckets import (
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
from ..config import ConfigError, SimConfig, flatten, with_settings
from ..outfile import OutputFile
from ..results import SimResult, read_step_shapes
from ..table import ResultsError
from .outputs import GRAPH_SIZES, SIZES_HEADER, claim_figure, save_figure

if TYPE_CHECKING:
    from stepplan.plots.bucketing import Bucketing
    from stepplan.plots.report import ReportTable

#: Errors these commands raise for bad input; ``cli.main`` reports them as one line
#: (exit code 2) rather than a traceback, as it does for every subcommand.
ERRORS = (ResultsError, BucketError, ConfigError, OSError)


def run_config(results: SimResult) -> SimConfig:
    """The run's settings, read back from its ``summary.json``."""
    try:
        return with_settings(SimConfig(), flatten(dict(results.config)))
    except ConfigError as exc:
        raise ResultsError(f"{results.label}: summary.json config: {exc}") from None


def run_demand(
    results: SimResult, config: SimConfig, args: argparse.Namespace | None = None
) -> StepDemand:
    """Every step's demand under the run's settings ``config`` (flags in ``args`` win)."""
    return step_demand(
        results.steps,
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
    sizes_file, figure_file = _claim_outputs(args)
    results = read_step_shapes(args.results)  # a chunk at a time: any run fits
    demand = run_demand(results, run_config(results), args)
    comparison = compare_to_defaults(demand, max_graphs=args.max_graphs)
    print(format_table(comparison.scores))
    best = comparison.recommended
    print(f"\n{best.label}: graph_sizes = {list(best.sizes)}")
    if sizes_file is not None:
        sizes_file.write(f"{SIZES_HEADER}\n{sizes_snippet(best.sizes, 'toml')}".encode())
        print(f"wrote {sizes_file.shown}")
    if figure_file is not None:
        from stepplan.plots.bucketing import plot_bucketing

        bucketings = [bucketing_of(demand, comparison.scores[0]), bucketing_of(demand, best)]
        title = f"{_run_title(results, demand)}: steps and CUDA-graph buckets"
        save_figure(plot_bucketing(results, bucketings, title), figure_file)
        print(f"figure: {figure_file.shown}")
    return 0


def _run_title(results: SimResult, demand: StepDemand) -> str:
    trace = results.summary.get("trace", {})
    source = Path(str(trace.get("path", results.label))).stem if isinstance(trace, dict) else ""
    return (
        f"{source or results.label}, {demand.num_steps:,} steps, Q = {demand.num_spec_tokens + 1}, "
        f"{demand.graph_mode} graphs"
    )


def _claim_outputs(args: argparse.Namespace) -> tuple[OutputFile | None, OutputFile | None]:
    """The files ``--write`` and ``--figure`` name, checked before any work
    (``sim/outfile.py``'s rule)."""
    sizes_file = figure_file = None
    if args.write:
        if Path(args.write).suffix.lower() != ".toml":
            raise BucketError(f"{args.write}: --write takes a .toml file (what --config reads)")
        sizes_file = OutputFile.claim(args.write, GRAPH_SIZES, overwrite=args.overwrite)
    if args.figure:
        figure_file = claim_figure(args.figure, args.overwrite)
    return sizes_file, figure_file


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
    parser.add_argument("--write", help="write the optimal sizes as a .toml config file")
    parser.add_argument("--figure", help="write the bucketing figure (.png, .svg or .pdf)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --write and --figure files that stepplan wrote earlier (never others)",
    )
    parser.add_argument("--num-spec-tokens", type=int, help="Q - 1 (default: the run's)")
    parser.add_argument(
        "--graph-mode", choices=("full", "mixed"), help="graph mode (default: the run's)"
    )
    parser.add_argument("--max-num-seqs", type=int, help="row limit (default: the run's)")
    parser.set_defaults(handler=run_buckets)
