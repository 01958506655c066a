"""``stepplan buckets``: the graph-size optimizer on a results folder, and the pieces of it
the report shows.

The figure modules load matplotlib (about 0.6 s), so they are imported inside the
functions that draw: every other command starts without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buckets.bucket_search import Objective, time_memory_front
from ..buckets.bucket_table import compare_times, format_time_table, prediction_lines
from ..buckets.bucket_time import SizeCosts, size_costs
from ..buckets.demand import (
    BucketError,
    Comparison,
    Score,
    StepDemand,
    assign,
    default_lists,
    graph_edges,
    row_context_of,
    sizes_snippet,
    step_demand,
    usable_sizes,
)
from ..live import engine_setup
from ..results.outfile import OutputFile
from ..results.schema import REQUESTS
from ..results.sim_result import SimResult, iter_table, read_step_shapes
from ..results.table import ResultsError
from ..settings.config import ConfigError, SimConfig, flatten, with_settings
from ..timing.cost import CostModel
from ..timing.engine_profile import EngineProfileError
from .outputs import GRAPH_SIZES, SIZES_HEADER, claim_figure, save_figure

if TYPE_CHECKING:
    from stepplan.plots.bucketing import Bucketing
    from stepplan.plots.report import ReportTable

#: Errors these commands raise for bad input; ``cli.main`` reports them as one line
#: (exit code 2) rather than a traceback, as it does for every subcommand.
ERRORS = (ResultsError, BucketError, ConfigError, EngineProfileError, OSError)


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
        row_context=run_row_context(results),
    )


def run_row_context(results: SimResult) -> int:
    """The run's mean context per row and step (:func:`row_context_of`) from its
    ``requests.csv``; 0 where the folder has none (times then at zero context)."""
    folder = results.path
    if folder is None or not any(
        (Path(folder) / REQUESTS.file).with_suffix(ext).exists() for ext in (".csv", ".parquet")
    ):
        return 0
    names = ("prompt_tokens", "output_tokens", "num_steps")
    parts: dict[str, list] = {name: [] for name in names}
    for chunk in iter_table(Path(folder), REQUESTS, names):
        for name in names:
            parts[name].append(chunk.column(name))
    prompt, output, steps = (np.concatenate(parts[n]) if parts[n] else np.zeros(0) for n in names)
    return row_context_of(prompt, output, steps)


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
    """``stepplan buckets``: the fastest lists against vLLM's and SGLang's default lists."""
    objective = Objective(args.percentile)
    if args.graph_memory is not None and not args.graph_memory > 0:
        raise BucketError(f"--graph-memory must be positive GiB, got {args.graph_memory:g}")
    sizes_file, figure_file, front_file = _claim_outputs(args)
    results = read_step_shapes(args.results)  # a chunk at a time: any run fits
    config = run_config(results)
    demand = run_demand(results, config, args)
    costs, source = run_costs(demand, config, args)
    memory = None if args.graph_memory is None else args.graph_memory * 1024.0
    comparison = compare_times(
        demand, costs, max_graphs=args.max_graphs, memory_mib=memory, objective=objective
    )
    print(f"predicted by: {source}; objective: least {objective.name}")
    print(format_time_table(comparison))
    best = comparison.recommended
    print(f"\n{best.score.label}: graph_sizes = {list(best.score.sizes)}")
    if sizes_file is not None:
        notes = "".join(f"# {line}\n" for line in prediction_lines(comparison, source))
        snippet = sizes_snippet(best.score.sizes, "toml")
        sizes_file.write(f"{SIZES_HEADER}\n{notes}{snippet}".encode())
        print(f"wrote {sizes_file.shown}")
    if figure_file is not None:
        from stepplan.plots.bucketing import plot_bucketing

        first = comparison.rows[0].score
        bucketings = [bucketing_of(demand, first), bucketing_of(demand, best.score)]
        title = f"{_run_title(results, demand)}: steps and CUDA-graph buckets"
        save_figure(plot_bucketing(results, bucketings, title), figure_file)
        print(f"figure: {figure_file.shown}")
    if front_file is not None:
        figure = front_figure(results, demand, costs, comparison, args.max_graphs, objective)
        save_figure(figure, front_file)
        print(f"figure: {front_file.shown}")
    return 0


def front_figure(
    results: SimResult,
    demand: StepDemand,
    costs: SizeCosts,
    comparison: Any,
    max_graphs: int | None,
    objective: Objective,
) -> Any:
    """The figure of predicted total step time against graph memory: the fastest list at
    each memory (at most ``max_graphs`` graphs, by default vLLM's count) and the lists of
    ``comparison`` as points."""
    from stepplan.plots.graph_front import plot_time_memory

    budget = max_graphs or len(comparison.rows[0].score.sizes)  # vLLM's count
    front = time_memory_front(demand, costs, max_graphs=budget, objective=objective)
    points = [(r.score.label, r.memory_mib or 0.0, r.total_s) for r in comparison.rows]
    curve = [(p.memory_mib or 0.0, p.total_s) for p in front]
    title = f"{_run_title(results, demand)}: step time against graph memory"
    return plot_time_memory(curve, points, title)


def run_costs(
    demand: StepDemand, config: SimConfig, args: argparse.Namespace
) -> tuple[SizeCosts, str]:
    """Graph and eager times (and graph memory) for ``demand`` from the engine profile
    ``--profile`` names (the run's own when not given), else the cost model, and which."""
    if args.profile is not None:
        config = with_settings(config, {"cost.profile": args.profile})
    cost = CostModel.create(config.model, config.gpu, config.cost, config.scheduler.num_groups)
    if cost.engine is not None:  # a profile of another model or planner would mislead
        cost.engine.check_setup(*engine_setup(config, config.plan))
    largest = args.largest or _default_largest(demand)
    if args.largest is not None and args.largest < 1:
        raise BucketError(f"--largest must be positive, got {args.largest}")
    costs = size_costs(demand, cost, largest, config.planner.prefill_tile_tokens)
    source = "the cost model" if cost.engine is None else f"engine profile {cost.engine.source}"
    return costs, source


def _default_largest(demand: StepDemand) -> int:
    """The largest size searched: the largest size of vLLM's or SGLang's default list the
    planner can use."""
    defaults = default_lists(demand.max_num_seqs, demand.num_spec_tokens)
    return max(usable_sizes(demand, sizes)[-1] for _, sizes in defaults)


def _run_title(results: SimResult, demand: StepDemand) -> str:
    trace = results.summary.get("trace", {})
    source = Path(str(trace.get("path", results.label))).stem if isinstance(trace, dict) else ""
    return (
        f"{source or results.label}, {demand.num_steps:,} steps, Q = {demand.num_spec_tokens + 1}, "
        f"{demand.graph_mode} graphs"
    )


def _claim_outputs(
    args: argparse.Namespace,
) -> tuple[OutputFile | None, OutputFile | None, OutputFile | None]:
    """The files ``--write``, ``--figure`` and ``--front`` name, checked before any work
    (``sim/results/outfile.py``'s rule)."""
    sizes_file = figure_file = front_file = None
    if args.write:
        if Path(args.write).suffix.lower() != ".toml":
            raise BucketError(f"{args.write}: --write takes a .toml file (what --config reads)")
        sizes_file = OutputFile.claim(args.write, GRAPH_SIZES, overwrite=args.overwrite)
    if args.figure:
        figure_file = claim_figure(args.figure, args.overwrite)
    if args.front:
        front_file = claim_figure(args.front, args.overwrite)
    return sizes_file, figure_file, front_file


def add_buckets(subparsers: Any) -> None:
    """``buckets RESULTS_DIR [--max-graphs N] [--graph-memory GIB] [--write FILE] ...``."""
    parser = subparsers.add_parser(
        "buckets",
        help="choose CUDA-graph sizes for a simulated workload (least predicted step time)",
        description="Find the CUDA-graph sizes with the least predicted total step time "
        "(exact) for the steps of a results folder, within a graph count and graph memory, "
        "and compare them with vLLM's and SGLang's default sizes.",
    )
    parser.add_argument("results", help="results folder of `stepplan simulate`")
    parser.add_argument("--max-graphs", type=int, help="graph budget (default: vLLM's count)")
    parser.add_argument(
        "--graph-memory",
        type=float,
        metavar="GIB",
        help="graph memory budget in GiB (needs an engine profile with graph memory figures)",
    )
    parser.add_argument(
        "--profile",
        help="engine profile predicting graph and eager step times (default: the run's; "
        "without one, the cost model)",
    )
    parser.add_argument(
        "--percentile",
        type=float,
        help="minimize this percentile of step time (0-100) instead of the total",
    )
    parser.add_argument(
        "--largest", type=int, help="largest size searched (default: the default lists' largest)"
    )
    parser.add_argument("--write", help="write the chosen sizes as a .toml config file")
    parser.add_argument("--figure", help="write the bucketing figure (.png, .svg or .pdf)")
    parser.add_argument(
        "--front", help="write the figure of step time against graph memory (.png, .svg, .pdf)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --write, --figure and --front files that stepplan wrote earlier "
        "(never others)",
    )
    parser.add_argument("--num-spec-tokens", type=int, help="Q - 1 (default: the run's)")
    parser.add_argument(
        "--graph-mode", choices=("full", "mixed"), help="graph mode (default: the run's)"
    )
    parser.add_argument("--max-num-seqs", type=int, help="row limit (default: the run's)")
    parser.set_defaults(handler=run_buckets)
