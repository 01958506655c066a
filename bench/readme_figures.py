"""The README's bucketing figure and its section, regenerated from the current code.

Runs the README's commands: ``stepplan simulate`` on the whole bundled Azure code trace
with the default settings (Q = 4, full CUDA graphs), then ``stepplan buckets --figure``,
which redraws the figure. Prints the README's "The bucketing figure" section in markdown,
every number in it computed here: the run, vLLM's default list, the optimal list of the
same budget, SGLang's default list, and the optimal list of 8 graphs.

    python bench/readme_figures.py [--figure docs/figures/bucketing.png] [--results DIR]
    python bench/readme_figures.py --check README.md   # is the README's section current?

Under a minute on a 2-core machine. Run it from the repository root and paste what it
prints into README.md (the command stays written there). ``--check`` draws nothing: it
exits 1 when the README's text differs from what the code gives
(``tests/test_readme_figures.py`` runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import textwrap
from pathlib import Path

from stepplan.sim import cli
from stepplan.sim.buckets.demand import Score, compare_to_defaults, usable_sizes
from stepplan.sim.cli.buckets import run_config, run_demand
from stepplan.sim.results.sim_result import SimResult, read_results

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "sim" / "data" / "azure_llm_2023_code.csv"
FIGURE = Path("docs/figures/bucketing.png")
WIDTH = 86  # the README's paragraphs wrap here


def run(argv: list[str]) -> None:
    """One ``stepplan`` command; what it prints goes to stderr, out of the markdown."""
    with contextlib.redirect_stdout(sys.stderr):
        code = cli.main(argv)
    if code != 0:
        raise SystemExit(f"stepplan {' '.join(argv)}: exit code {code}")


def scores(results: SimResult) -> dict[str, Score]:
    """The four lists of the README's table, by their row title."""
    demand = run_demand(results, run_config(results))
    whole = compare_to_defaults(demand)
    vllm, optimal, sglang = whole.scores[0], whole.recommended, whole.scores[2]
    if not (vllm.label.startswith("vLLM") and sglang.label.startswith("SGLang")):
        raise SystemExit(f"unexpected comparison rows: {[s.label for s in whole.scores]}")
    eight = compare_to_defaults(demand, max_graphs=8).recommended
    floor = whole.scores[-1]
    return {
        "vLLM default capture sizes": vllm,
        "optimal for this trace, same budget": optimal,
        "SGLang default list": sglang,
        "optimal with only 8 graphs": eight,
        "floor": floor,
    }


def section(results: SimResult, figure: Path) -> str:
    """The README section: figure, what ran, the table and what it shows."""
    summary, config = results.summary, run_config(results)
    trace, steps = summary["trace"], summary["steps"]
    eager = results.steps.column("graph_hit") == 0
    with_prefill = int((eager & (results.steps.column("num_prefill_rows") > 0)).sum())
    if with_prefill == eager.sum():
        rest = "carry a prefill chunk and run eagerly"
    else:
        rest = f"run eagerly ({with_prefill:,} of them carry a prefill chunk)"
    by_row = scores(results)
    vllm = by_row["vLLM default capture sizes"]
    largest_row = usable_sizes(run_demand(results, config), vllm.sizes)[-1]
    lines = [
        "![Step sizes of the Azure code trace against vLLM's default CUDA-graph sizes and "
        f"the optimal ones]({figure.as_posix()})",
        "",
        f"The figure covers the whole bundled Azure code trace ({trace['requests']:,} requests, "
        f"{trace['span_s'] / 60:.0f} minutes) with `Q = {config.scheduler.num_spec_tokens + 1}` "
        f"and {config.planner.graph_mode} CUDA graphs. Of its {steps['count']:,} steps, "
        f"{steps['graph_hit_rate']:.1%} replay a graph; the other {int(eager.sum()):,} {rest}.",
        "",
        f"| size list (same steps in graphs, largest row size {largest_row}) | graphs "
        "| padded tokens | share of all tokens | share of graph tokens |",
        "|---|---|---|---|---|",
    ]
    for title, score in by_row.items():
        if title != "floor":
            lines.append(
                f"| {title} | {len(score.sizes)} | {score.padded_tokens:,} "
                f"| {score.padded_share:.2%} | {score.padded_share_of_graphs:.1%} |"
            )
    lines += ["", textwrap.fill(conclusion(by_row), WIDTH)]
    lines[2] = textwrap.fill(lines[2], WIDTH)
    return "\n".join(lines)


def conclusion(by_row: dict[str, Score]) -> str:
    """The paragraph under the table, its comparisons computed."""
    vllm, optimal = (
        by_row["vLLM default capture sizes"],
        by_row["optimal for this trace, same budget"],
    )
    eight, floor = by_row["optimal with only 8 graphs"], by_row["floor"]
    ratio = optimal.padded_tokens / vllm.padded_tokens
    than = "less" if eight.padded_tokens < vllm.padded_tokens else "more"
    reached = (
        ", which the optimal list reaches" if optimal.padded_tokens == floor.padded_tokens else ""
    )
    return (
        f"With vLLM's default capture sizes, {vllm.padded_share:.2%} of all tokens the GPU "
        f"processes are padding. The optimal list pads {ratio:.0%} as much "
        f"({optimal.padded_tokens:,} against {vllm.padded_tokens:,} tokens) within the same "
        f"budget of {len(vllm.sizes)} graphs, and with 8 graphs it still pads {than} than "
        f"vLLM's {len(vllm.sizes)} ({eight.padded_tokens:,} tokens). The padding that remains "
        "is a floor that no list removes: spec rows with fewer than Q tokens are padded to Q "
        f"({floor.padded_tokens:,} tokens here{reached})."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figure", type=Path, default=FIGURE, help="where the figure goes")
    parser.add_argument("--results", help="keep the simulation's results folder here")
    parser.add_argument("--check", type=Path, metavar="README", help="compare, draw nothing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="readme-figures-") as scratch:
        folder = Path(args.results or Path(scratch) / "azure-code-q4")
        run(["simulate", str(TRACE), "--out", str(folder), "--quiet"])
        if args.check is None:
            run(["buckets", str(folder), "--figure", str(args.figure), "--overwrite"])
        text = section(read_results(folder), args.figure)
    if args.check is None:
        print(text)
    elif text not in args.check.read_text():
        raise SystemExit(f"{args.check}: the bucketing section is not what the code gives:\n{text}")
    else:
        print(f"{args.check}: the bucketing section is what the code gives")


if __name__ == "__main__":
    main()
