"""One self-contained HTML page per run: every figure embedded, the summary as tables; the
page carries stepplan's mark (:data:`GENERATOR`), so that a later run may replace it."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from matplotlib.figure import Figure

from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import ResultsError, Table

from .bucketing import Bucketing, plot_bucketing
from .canvas import figure_bytes
from .host import plot_host_time
from .latency import plot_latency_cdfs
from .memory import has_memory_columns, plot_memory
from .opgraph import plot_op_graph
from .timeline import plot_composition_over_run, plot_timeline

#: The mark of a report stepplan wrote: a ``<meta>`` of the page's head (:func:`is_report`).
GENERATOR = '<meta name="generator" content="stepplan report">'
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0; } img { max-width: 100%; }
figcaption { font-size: 0.85em; color: #555; }
#verdict { border: 2px solid #888; border-radius: 6px; padding: 0.6em 1.2em; margin: 1em 0; }
#verdict.met { border-color: #2CA02C; background: #F1FAF1; }
#verdict.missed { border-color: #C44E52; background: #FCF1F1; }
#verdict .headline { font-size: 1.35em; font-weight: 600; margin: 0.2em 0; }
#verdict table { font-size: 1em; }
#verdict td, #verdict th { border: none; padding: 2px 12px 2px 0; }
#verdict ul { margin: 0.3em 0; padding-left: 1.2em; }
details { margin: 0.6em 0; } summary { cursor: pointer; font-weight: 600; }
"""


@attrs.frozen
class ReportTable:
    """An extra table for the report (for example the bucket comparison).

    Attributes:
        title: heading above the table.
        header: column names.
        rows: one sequence of cells per row, each as long as ``header``.
    """

    title: str
    header: tuple[str, ...] = attrs.field(converter=tuple)
    rows: tuple[tuple[object, ...], ...] = attrs.field(
        converter=lambda rows: tuple(tuple(row) for row in rows)
    )

    def __attrs_post_init__(self) -> None:
        for index, row in enumerate(self.rows):
            if len(row) != len(self.header):
                raise ResultsError(
                    f"table {self.title!r} row {index}: {len(row)} cells, "
                    f"header has {len(self.header)}"
                )


@attrs.frozen
class Verdict:
    """The block a report opens with: what the run says, before any figure.

    Attributes:
        headline: one sentence (``Overloaded from 27 s: both SLOs missed``).
        subject: what ran (model, GPU, trace, requests).
        figures: ``(name, text)`` of the figures a person asks for first (goodput,
            TTFT p99, TPOT p99), already formatted with their units.
        checks: ``(objective, outcome, met)`` per SLO (``TTFT p99 <= 1,000 ms``,
            ``missed by 584 ms``, ``False``).
        notes: further lines (what a compare report's runs differ in).
    """

    headline: str
    subject: str
    figures: tuple[tuple[str, str], ...] = attrs.field(converter=tuple, default=())
    checks: tuple[tuple[str, str, bool], ...] = attrs.field(converter=tuple, default=())
    notes: tuple[str, ...] = attrs.field(converter=tuple, default=())

    @property
    def met(self) -> bool:
        """Whether every objective was met."""
        return all(ok for _, _, ok in self.checks)


def format_value(value: object) -> str:
    """A summary value as the report prints it: floats to 6 significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def report_figures(
    results: SimResult,
    *,
    bucketings: Sequence[Bucketing] = (),
    others: Sequence[SimResult] = (),
    plan: Any = None,
    head: SimResult | None = None,
    sample: SimResult | None = None,
    shapes: SimResult | None = None,
    every: int = 1,
    slo_ms: Mapping[str, float] | None = None,
    plan_title: str = "Op graph of one plan",
    composition: Table | None = None,
) -> dict[str, Figure]:
    """Every figure of the report, by title: buckets, timeline, latency CDFs (this run
    and ``others``), host time, KV cache and queue (runs that have the columns), and
    the op graph of ``plan`` when one is given. A long run read in parts gives the
    timeline its ``head`` (first steps), the per-step figures a ``sample`` of its steps
    (every ``every``-th) and the bucketing its distinct step ``shapes``; each defaults to
    ``results``. ``slo_ms`` draws the objectives on the CDFs; ``plan_title`` says which
    step the op graph is of; ``composition`` (counted from every step,
    ``plots.timeline.plot_composition_over_run``) gives that figure its numbers. The
    figures of the whole run come first."""
    head, sample, shapes = head or results, sample or results, shapes or results
    figures = {
        "Latency CDFs": plot_latency_cdfs([results, *others], slo_ms=slo_ms),
        "Step composition over the run": plot_composition_over_run(sample, every, composition),
    }
    if has_memory_columns(sample):
        figures["KV cache and queue"] = plot_memory(sample)
    figures["Host time per step"] = plot_host_time(sample)
    figures["Step sizes and CUDA-graph buckets"] = plot_bucketing(shapes, bucketings)
    figures["Step composition, first steps (detail)"] = plot_timeline(head)
    if plan is not None:
        figures[plan_title] = plot_op_graph(plan)
    return figures


def build_report(
    results: SimResult,
    *,
    figures: Mapping[str, Figure] | None = None,
    tables: Sequence[ReportTable] = (),
    plan: Any = None,
    title: str | None = None,
    leading_tables: Sequence[ReportTable] = (),
    notes: Sequence[str] = (),
    verdict: Verdict | None = None,
    summary_table: ReportTable | None = None,
    sections: Sequence[str] = (),
) -> str:
    """The HTML page, what a person reads first at the top: the ``verdict``, then
    ``leading_tables``, the ``summary_table`` (the console's rows, in words and units),
    every figure as an embedded PNG, ``tables`` (the bucket comparison), ``sections``
    (HTML blocks of their own, such as per-replica tables), ``notes``; then the details,
    folded: every figure of ``summary.json`` by its key, the provenance, the
    configuration and the ITL quantiles.

    ``figures`` default to :func:`report_figures` of the run (with ``plan``); ``title``
    to the run's label.
    """
    if figures is None:
        figures = report_figures(results, plan=plan)
    summary = results.summary
    title = f"stepplan report: {title or results.label}"
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if verdict is not None:
        parts.append(_verdict(verdict))
    parts.extend(_table(t.title, t.header, t.rows) for t in leading_tables)
    if summary_table is not None:
        parts.append(_table(summary_table.title, summary_table.header, summary_table.rows))
    parts.extend(_figure(name, figure) for name, figure in figures.items())
    parts.extend(_table(t.title, t.header, t.rows) for t in tables)
    parts.extend(sections)
    parts.extend(f"<p>{html.escape(note)}</p>" for note in notes)
    parts.append(_summary_details(summary))
    provenance = summary.get("provenance")
    if isinstance(provenance, Mapping):
        parts.append(_provenance(provenance))
    parts.append(_details("Configuration", _flatten(results.config)))
    quantiles = summary.get("itl_ms_quantiles") or []
    parts.append(_details("ITL quantiles (ms)", [(f"q{i}", v) for i, v in enumerate(quantiles)]))
    return _page(title, parts)


def build_sweep_report(
    title: str,
    *,
    verdict: Verdict,
    figures: Mapping[str, Figure],
    tables: Sequence[ReportTable] = (),
    notes: Sequence[str] = (),
) -> str:
    """The HTML page of a sweep: its ``verdict`` (what differs across the points, which
    meet each SLO) first, then the ``figures``, the ``tables`` (its points) and ``notes``."""
    title = f"stepplan sweep report: {title}"
    parts = [f"<h1>{html.escape(title)}</h1>", _verdict(verdict)]
    parts.extend(_figure(name, figure) for name, figure in figures.items())
    parts.extend(_table(t.title, t.header, t.rows) for t in tables)
    parts.extend(f"<p>{html.escape(note)}</p>" for note in notes)
    return _page(title, parts)


def _page(title: str, parts: Sequence[str]) -> str:
    """A whole page of ``parts`` (HTML blocks), with stepplan's mark in its head."""
    body = "\n".join(parts)
    head = f"<meta charset='utf-8'>{GENERATOR}<title>{html.escape(title)}</title>"
    head += f"<style>{STYLE}</style>"
    return f"<!DOCTYPE html>\n<html><head>{head}</head>\n<body>\n{body}\n</body></html>\n"


def is_report(sample: bytes) -> bool:
    """Whether a file's start (``sample``) is a page :func:`build_report` made."""
    return sample.startswith(b"<!DOCTYPE html>") and GENERATOR.encode() in sample[:4096]


def _verdict(verdict: Verdict) -> str:
    state = "met" if verdict.met else "missed"
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{html.escape(text)}</td></tr>"
        for name, text in verdict.figures
    )
    checks = "".join(
        f"<li><b>{'met' if ok else 'missed'}</b>: {html.escape(objective)}, "
        f"{html.escape(outcome)}</li>"
        for objective, outcome, ok in verdict.checks
    )
    notes = "".join(f"<p>{html.escape(note)}</p>" for note in verdict.notes)
    return (
        f"<section id='verdict' class='{state}'>"
        f"<p class='headline'>{html.escape(verdict.headline)}</p>"
        f"<p>{html.escape(verdict.subject)}</p><table>{rows}</table><ul>{checks}</ul>{notes}"
        "</section>"
    )


def _summary_details(summary: Mapping[str, Any]) -> str:
    """Every figure of ``summary.json`` by its key, folded under one heading."""
    parts = [_overview(summary)]
    latency = summary.get("latency_ms")
    if isinstance(latency, Mapping) and latency:
        parts.append(_latency_table(latency))
    skip = {"config", "latency_ms", "itl_ms_quantiles", "provenance"}
    for key, value in summary.items():
        if isinstance(value, Mapping) and key not in skip:
            parts.append(_section(key, value))
    return (
        "<details><summary>Every figure of summary.json, by its key</summary>"
        + "\n".join(parts)
        + "</details>"
    )


def _overview(summary: Mapping[str, Any]) -> str:
    rows = [
        (key, value)
        for key, value in summary.items()
        if not isinstance(value, Mapping | list | tuple)
    ]
    return _table("Overview", ("", "value"), rows)


def _latency_table(latency: Mapping[str, Any]) -> str:
    stats = ("mean", "p50", "p90", "p99")
    rows = []
    for metric, values in latency.items():
        values = values if isinstance(values, Mapping) else {}
        rows.append((metric.upper(), *(values.get(s) for s in stats)))
    return _table("Latency (ms)", ("", *stats), rows)


def _section(name: str, values: Mapping[str, Any]) -> str:
    return _table(name.replace("_", " ").capitalize(), ("", "value"), _flatten(values))


def _flatten(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(_flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            rows.append((name, ", ".join(format_value(v) for v in value)))
        else:
            rows.append((name, value))
    return rows


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(format_value(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<h2>{html.escape(title)}</h2>\n<table><tr>{head}</tr>{body}</table>"


def _provenance(values: Mapping[str, Any]) -> str:
    """What the run records to run it again (``command`` stands for ``argv``); its settings
    TOML as a preformatted block."""
    rows = [(key, value) for key, value in _flatten(values) if key not in ("argv", "config_toml")]
    text = values.get("config_toml")
    block = f"<pre>{html.escape(text)}</pre>" if isinstance(text, str) else ""
    return _table("Provenance", ("", "value"), rows) + block


def _details(title: str, rows: Sequence[tuple[str, Any]]) -> str:
    table = _table(title, ("", "value"), rows)
    return f"<details><summary>{html.escape(title)}</summary>{table}</details>"


def _figure(name: str, figure: Figure) -> str:
    data = base64.b64encode(figure_bytes(figure, "png")).decode("ascii")
    # The id names the figure, not the run: the words before a colon.
    slug = "fig-" + re.sub(r"[^a-z0-9]+", "-", name.split(":")[0].lower()).strip("-")
    return (
        f"<h2>{html.escape(name)}</h2>\n<figure id='{html.escape(slug)}'>"
        f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'></figure>"
    )
