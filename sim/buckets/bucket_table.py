"""The table a person reads of ``stepplan buckets``: each size list's predicted total step
time and its change against vLLM's and SGLang's default lists, hit rate, padded tokens
and graph memory; and what ``--write`` records beside the sizes."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .bucket_search import TOTAL, Objective, fastest_list, within_memory
from .bucket_time import SizeCosts, predict
from .demand import (
    BucketError,
    Score,
    StepDemand,
    best_sizes,
    default_lists,
    score,
    usable_sizes,
)


@attrs.frozen
class TimedScore:
    """One size list's row of the table a person reads: its bucketing and its prediction.

    Attributes:
        score: padding and graph hits (:func:`stepplan.sim.buckets.demand.score`).
        total_s: predicted total step time (s).
        percentile_us: the objective's percentile of step time (µs), ``None`` when the
            objective is the total.
        memory_mib: graph memory (MiB), ``None`` without figures.
    """

    score: Score
    total_s: float
    percentile_us: float | None
    memory_mib: float | None


@attrs.frozen
class TimeComparison:
    """The time objective's lists against the default lists on one simulation.

    Attributes:
        rows: the default lists (cut to the graph budget), the fastest lists at each
            default's graph count and graph memory, today's least-padding list, and
            the recommended list, duplicates left out.
        recommended: the fastest list within ``--max-graphs`` and ``--graph-memory``:
            what ``--write`` writes.
        objective: what was minimized.
        references: ``(name, total_s)`` of each default list, the table's baselines.
    """

    rows: tuple[TimedScore, ...]
    recommended: TimedScore
    objective: Objective
    references: tuple[tuple[str, float], ...]


def timed_score(
    demand: StepDemand, costs: SizeCosts, sizes: Sequence[int], label: str, objective: Objective
) -> TimedScore:
    """:class:`TimedScore` of one list."""
    prediction = predict(demand, costs, sizes)
    value = None if objective.percentile is None else objective.of(prediction, demand.counts)
    return TimedScore(
        score(demand, prediction.sizes, label), prediction.total_s, value, prediction.memory_mib
    )


def compare_times(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int | None = None,
    memory_mib: float | None = None,
    objective: Objective = TOTAL,
) -> TimeComparison:
    """The default lists, each cut to ``max_graphs`` (as in :func:`compare_to_defaults`),
    and the fastest lists of as many sizes and no more graph memory; then the fastest of
    ``max_graphs`` sizes (vLLM's count when not given) within ``memory_mib``."""
    if max_graphs is not None and max_graphs < 1:
        raise BucketError(f"--max-graphs must be positive, got {max_graphs}")
    if memory_mib is not None and costs.graph_mib is None:
        raise BucketError(f"--graph-memory needs graph memory figures: {costs.memory_missing}")
    defaults = [
        (name, usable_sizes(demand, sizes)[:max_graphs])
        for name, sizes in default_lists(demand.max_num_seqs, demand.num_spec_tokens)
    ]
    defaults = [(name, sizes) for name, sizes in defaults if sizes and sizes[-1] <= costs.largest]
    references = [sizes for _, sizes in defaults]
    searched: dict[tuple[int, float | None], tuple[int, ...]] = {}

    def best(graphs: int, memory: float | None) -> tuple[int, ...]:
        """The fastest list of a budget, each budget searched once (they often repeat)."""
        if (graphs, memory) not in searched:
            found = _best(demand, costs, graphs, memory, objective, references)
            searched[graphs, memory] = found
        return searched[graphs, memory]

    rows = [timed_score(demand, costs, s, f"{name} ({len(s)})", objective) for name, s in defaults]
    for (_, sizes), row in zip(defaults, list(rows), strict=True):
        chosen = best(len(sizes), row.memory_mib)
        label = f"fastest, <= {len(sizes)} graphs"
        if row.memory_mib is not None:
            label += f", <= {row.memory_mib:,.0f} MiB"
        rows.append(timed_score(demand, costs, chosen, label, objective))
    vllm = usable_sizes(demand, default_lists(demand.max_num_seqs, demand.num_spec_tokens)[0][1])
    budget = len(vllm) if max_graphs is None else max_graphs
    if vllm[-1] <= costs.largest:
        padding = best_sizes(demand, vllm, budget)
        label = f"least padding, <= {budget} up to {vllm[-1]}"
        rows.append(timed_score(demand, costs, padding, label, objective))
    chosen = best(budget, memory_mib)
    label = f"fastest, <= {budget} graphs" + (
        "" if memory_mib is None else f", <= {memory_mib / 1024:g} GiB"
    )
    recommended = timed_score(demand, costs, chosen, label, objective)
    unique = {(r.score.label, r.score.sizes): r for r in [*rows, recommended]}
    named = tuple((name, rows[i].total_s) for i, (name, _) in enumerate(defaults))
    return TimeComparison(tuple(unique.values()), recommended, objective, named)


def _best(
    demand: StepDemand,
    costs: SizeCosts,
    max_graphs: int,
    memory_mib: float | None,
    objective: Objective,
    references: Sequence[Sequence[int]],
) -> tuple[int, ...]:
    if memory_mib is None:
        return fastest_list(
            demand, costs, max_graphs=max_graphs, objective=objective, references=references
        )
    return within_memory(
        demand,
        costs,
        max_graphs=max_graphs,
        memory_mib=memory_mib,
        objective=objective,
        references=references,
    )


def format_time_table(comparison: TimeComparison) -> str:
    """The comparison as a fixed-width text table, one row per list."""
    names = [name.split()[0] for name, _ in comparison.references]
    percentile = comparison.objective.percentile
    header = f"{'sizes list':<40} {'graphs':>6} {'largest':>7} {'step time s':>11}"
    header += "".join(f" {'vs ' + n:>9}" for n in names)
    if percentile is not None:
        header += f" {f'p{percentile:g} ms':>9}"
    header += f" {'hit rate':>8} {'padded tokens':>13} {'graph MiB':>9}"
    lines = [header, "-" * len(header)]
    for row in comparison.rows:
        s = row.score
        line = f"{s.label:<40} {len(s.sizes):>6} {s.sizes[-1]:>7} {row.total_s:>11,.3f}"
        for _, total in comparison.references:
            line += f" {(row.total_s / total - 1.0) if total else 0.0:>+9.2%}"
        if row.percentile_us is not None:
            line += f" {row.percentile_us / 1e3:>9.3f}"
        memory = "n/a" if row.memory_mib is None else f"{row.memory_mib:,.0f}"
        line += f" {s.hit_rate:>8.2%} {s.padded_tokens:>13,} {memory:>9}"
        lines.append(line)
    return "\n".join(lines)


def prediction_lines(comparison: TimeComparison, source: str) -> list[str]:
    """What ``--write`` records beside the sizes: the prediction they were chosen for."""
    best = comparison.recommended
    lines = [
        f"chosen for: least {comparison.objective.name}, {best.score.label}",
        f"predicted total step time: {best.total_s:.3f} s over {best.score.steps:,} steps "
        f"({source})",
    ]
    for name, total in comparison.references:
        lines.append(
            f"against {name}: {best.total_s - total:+.3f} s ({best.total_s / total - 1:+.2%})"
        )
    if best.percentile_us is not None:
        lines.append(f"predicted {comparison.objective.name}: {best.percentile_us / 1e3:.3f} ms")
    lines.append(f"hit rate {best.score.hit_rate:.2%}, padded tokens {best.score.padded_tokens:,}")
    if best.memory_mib is not None:
        lines.append(f"graph memory: {best.memory_mib:,.1f} MiB")
    return lines
