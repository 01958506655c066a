"""One self-contained HTML page per run: every figure embedded, the summary as tables; the
page carries stepplan's mark (:data:`GENERATOR`), so that a later run may replace it."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from matplotlib.figure import Figure

from stepplan.sim.results import SimResult
from stepplan.sim.table import ResultsError

from .bucketing import Bucketing, plot_bucketing
from .canvas import figure_bytes
from .host import plot_host_time
from .latency import plot_latency_cdfs
from .memory import has_memory_columns, plot_memory
from .opgraph import plot_op_graph
from .timeline import plot_timeline

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
) -> dict[str, Figure]:
    """Every figure of the report, by title: buckets, timeline, latency CDFs (this run
    and ``others``), host time, KV cache and queue (runs that have the columns), and
    the op graph of ``plan`` when one is given. A long run read in parts gives the
    timeline its ``head`` (first steps), the per-step figures a ``sample`` of its steps
    and the bucketing its distinct step ``shapes``; each defaults to ``results``."""
    head, sample, shapes = head or results, sample or results, shapes or results
    figures = {
        "Step sizes and CUDA-graph buckets": plot_bucketing(shapes, bucketings),
        "Step composition": plot_timeline(head),
        "Latency CDFs": plot_latency_cdfs([results, *others]),
        "Host time per step": plot_host_time(sample),
    }
    if has_memory_columns(sample):
        figures["KV cache and queue"] = plot_memory(sample)
    if plan is not None:
        figures["Op graph of one plan"] = plot_op_graph(plan)
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
) -> str:
    """The HTML page: ``notes`` (a line each), ``leading_tables``, the summary tables,
    ``tables``, every figure as an embedded PNG, then the provenance and the configuration.

    ``figures`` default to :func:`report_figures` of the run (with ``plan``); ``title``
    to the run's label.
    """
    if figures is None:
        figures = report_figures(results, plan=plan)
    summary = results.summary
    title = f"stepplan report: {title or results.label}"
    parts = [f"<h1>{html.escape(title)}</h1>"]
    parts.extend(f"<p>{html.escape(note)}</p>" for note in notes)
    parts.extend(_table(t.title, t.header, t.rows) for t in leading_tables)
    parts.append(_overview(summary))
    latency = summary.get("latency_ms")
    if isinstance(latency, Mapping) and latency:
        parts.append(_latency_table(latency))
    # a deployment's replicas have a table of their own (``tables``)
    skip = {"config", "latency_ms", "itl_ms_quantiles", "provenance", "deployment"}
    for key, value in summary.items():
        if isinstance(value, Mapping) and key not in skip:
            parts.append(_section(key, value))
    parts.extend(_table(t.title, t.header, t.rows) for t in tables)
    parts.extend(_figure(name, figure) for name, figure in figures.items())
    provenance = summary.get("provenance")
    if isinstance(provenance, Mapping):
        parts.append(_provenance(provenance))
    parts.append(_details("Configuration", _flatten(results.config)))
    quantiles = summary.get("itl_ms_quantiles") or []
    parts.append(_details("ITL quantiles (ms)", [(f"q{i}", v) for i, v in enumerate(quantiles)]))
    body = "\n".join(parts)
    head = f"<meta charset='utf-8'>{GENERATOR}<title>{html.escape(title)}</title>"
    head += f"<style>{STYLE}</style>"
    return f"<!DOCTYPE html>\n<html><head>{head}</head>\n<body>\n{body}\n</body></html>\n"


def is_report(sample: bytes) -> bool:
    """Whether a file's start (``sample``) is a page :func:`build_report` made."""
    return sample.startswith(b"<!DOCTYPE html>") and GENERATOR.encode() in sample[:4096]


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
    slug = "fig-" + "-".join(name.lower().split())
    return (
        f"<h2>{html.escape(name)}</h2>\n<figure id='{html.escape(slug)}'>"
        f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'></figure>"
    )
