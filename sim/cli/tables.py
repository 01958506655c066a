"""What the CLI prints and saves about runs: the line naming what was simulated, aligned
text tables, and ``compare``'s table with its difference columns.

``compare``'s table has one row per line of the summary table (``summary_rows``) and
the columns A, B, ``B - A`` and ``(B - A) / A``. The differences are computed from the
summaries' full-precision numbers (:data:`METRIC_PATHS` says where each row's number
lives), never from the rounded text; rows that are not numbers (``live``) have none.
It is saved beside the runs as ``compare.csv`` and ``compare.json``.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..results.schema import MEASURED
from ..results.summary import TIME_TERMS, summary_rows

_LATENCY = {
    f"{metric.upper()} {stat} ms": ("latency_ms", metric, stat)
    for metric in ("ttft", "tpot", "itl", "e2e")
    for stat in ("mean", "p50", "p99")
}
_TIMES = {f"time {term} s": ("time_s", term) for term in TIME_TERMS}
#: Numeric rows of ``summary_rows`` -> the path of their value in ``summary.json``.
METRIC_PATHS: Mapping[str, tuple[str, ...]] = {
    "requests": ("requests",),
    "duration s": ("duration_s",),
    "throughput req/s": ("throughput", "requests_per_s"),
    "output tok/s": ("throughput", "output_tokens_per_s"),
    "goodput share": ("goodput", "share"),
    "GPUs": ("dollars", "gpus"),
    "$ per hour": ("dollars", "per_hour"),
    "$ per M output tokens": ("dollars", "per_million_output_tokens"),
    "good requests per $": ("dollars", "good_requests_per_dollar"),
    **_LATENCY,
    "steps": ("steps", "count"),
    "graph hit rate": ("steps", "graph_hit_rate"),
    "padded token share": ("steps", "padded_token_share"),
    "acceptance length": ("acceptance", "mean_acceptance_length"),
    "plan us p50 (measured)": ("measured", "host", "plan_us_p50"),
    "preemptions": ("memory", "preemptions"),
    "prefix hit rate": ("memory", "prefix_cache_hit_rate"),
    **_TIMES,
}
#: The files ``compare`` writes beside its two runs.
COMPARE_FILES = ("compare.csv", "compare.json")


def run_header(summary: Mapping[str, Any]) -> str:
    """One line naming what a run simulated: model, GPU, Q, graph mode and trace."""
    config, trace = summary["config"], summary["trace"]
    source = summary.get("provenance", {}).get("trace", {}).get("source")
    embedded = source == "embedded"
    name = Path(trace["path"]).name if embedded else trace["path"]
    requests = f"{'embedded, ' if embedded else ''}{trace['requests']:,} requests"
    ranks = config.get("parallel", {}).get("tensor", 1)
    gpus = f" x {ranks} (tensor parallel)" if ranks > 1 else ""
    return (
        f"model {config['model']['name']}, GPU {config['gpu']['name']}{gpus}, "
        f"Q = {config['scheduler']['num_spec_tokens'] + 1}, "
        f"graph mode {config['planner']['graph_mode']}, trace {name} ({requests})"
    )


def align(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A text table: the first column left-aligned, the others right-aligned."""
    lines = [list(header), *(list(row) for row in body)]
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    text = []
    for line in lines:
        cells = [line[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True)]
        text.append("  ".join(cells).rstrip())
    return "\n".join(text)


@attrs.frozen
class CompareRow:
    """One metric of both runs.

    Attributes:
        metric: the summary table's row label.
        texts: the A and B cells as the summary table prints them.
        values: A's and B's full-precision numbers (``None`` where not a number).
    """

    metric: str
    texts: tuple[str, str]
    values: tuple[float | None, float | None]

    @property
    def diff(self) -> float | None:
        """``B - A``, when both are numbers."""
        a, b = self.values
        return None if a is None or b is None else b - a

    @property
    def relative(self) -> float | None:
        """``(B - A) / A``, when both are numbers and A is not 0."""
        diff, a = self.diff, self.values[0]
        return None if diff is None or not a else diff / a

    def diff_text(self) -> str:
        """``B - A`` signed, to as many decimals as A's (or B's) cell shows."""
        if self.diff is None:
            return "-"
        shown = self.texts[0] if self.values[0] is not None else self.texts[1]
        digits = len(shown.partition(".")[2])
        return f"{self.diff:+,.{digits}f}"

    def relative_text(self) -> str:
        return "-" if self.relative is None else f"{self.relative:+.1%}"


@attrs.frozen
class CompareTable:
    """``compare``'s table: run A and run B by their labels, one row per metric."""

    labels: tuple[str, str]
    rows: tuple[CompareRow, ...]

    @property
    def header(self) -> tuple[str, ...]:
        a, b = self.labels
        # A title that says what differs ("B: host_cost=seed") is named by its side there.
        x, y = (label.split(":")[0] for label in self.labels)
        return ("", a, b, f"{y} - {x}", f"({y} - {x}) / {x}")

    def text_rows(self) -> list[tuple[str, ...]]:
        """The rows as printed: metric, A, B, difference, relative difference."""
        return [(row.metric, *row.texts, row.diff_text(), row.relative_text()) for row in self.rows]

    def format(self) -> str:
        return align(self.header, self.text_rows())


def _number(summary: Mapping[str, Any], path: tuple[str, ...] | None) -> float | None:
    value: Any = summary
    for key in path or ():
        value = value.get(key) if isinstance(value, Mapping) else None
    if path is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def compare_table(
    labels: tuple[str, str], a: Mapping[str, Any], b: Mapping[str, Any]
) -> CompareTable:
    """The table of summaries ``a`` and ``b`` (``summary.json`` documents)."""
    rows = []
    for (metric, a_text), (_, b_text) in zip(summary_rows(a), summary_rows(b), strict=True):
        path = METRIC_PATHS.get(metric)
        values = (_number(a, path), _number(b, path))
        rows.append(CompareRow(metric, (a_text, b_text), values))
    return CompareTable(labels, tuple(rows))


def _cell(row: CompareRow, side: int) -> float | str:
    value = row.values[side]
    return row.texts[side] if value is None else value


def compare_csv(table: CompareTable) -> str:
    """``compare.csv``: the header names the runs; numbers at full precision, empty
    where a difference is not defined."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["metric", *table.header[1:]])
    for row in table.rows:
        diff, relative = row.diff, row.relative
        writer.writerow(
            [
                row.metric,
                _cell(row, 0),
                _cell(row, 1),
                "" if diff is None else diff,
                "" if relative is None else relative,
            ]
        )
    return buffer.getvalue()


def compare_json(table: CompareTable) -> str:
    """``compare.json``: the runs' labels and folders, then one object per metric with
    ``a``, ``b``, ``diff`` (``B - A``) and ``relative_diff`` (``(B - A) / A``)."""
    rows = [
        {
            "metric": row.metric,
            "a": _cell(row, 0),
            "b": _cell(row, 1),
            "diff": row.diff,
            "relative_diff": row.relative,
        }
        for row in table.rows
    ]
    sides = {
        side: {"label": label, "folder": side}
        for side, label in zip(("a", "b"), table.labels, strict=True)
    }
    return json.dumps({**sides, "rows": rows}, indent=2) + "\n"


def command_wall(args: Any, summary: Mapping[str, Any]) -> str:
    """The command's wall time so far (reading, simulating and writing; from ``cli.main``'s
    start, ``args.started``) with the simulation loop's share beside it."""
    loop_s = float(summary[MEASURED]["run"]["wall_s"])
    started = getattr(args, "started", None)
    if started is None:  # a handler called without cli.main
        return f"simulation loop {loop_s:.1f} s"
    wall_s = time.perf_counter() - started
    return f"wall {wall_s:.1f} s, of which the simulation loop {loop_s:.1f} s"
