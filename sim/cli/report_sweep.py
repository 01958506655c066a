"""``stepplan report`` of a sweep folder: a page that opens with what differs across the
sweep's points (the swept settings and their values) and which points meet each SLO,
then the trade-off figure and every point's row."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..results.outfile import OutputFile
from ..results.schema import SWEEP
from ..results.table import ResultsError, Table, read_csv
from ..sweep.spec import describe
from ..sweep.tradeoff import Slo
from .report_verdict import milliseconds

if TYPE_CHECKING:
    from stepplan.plots.report import ReportTable, Verdict

#: The files a sweep folder holds that its report reads.
SWEEP_TABLE, SWEEP_DOCUMENT = "sweep.csv", "sweep.json"
#: The metrics each point's row shows, with their headers.
POINT_METRICS = {
    "goodput_share": "goodput",
    "ttft_p99_ms": "TTFT p99",
    "tpot_p99_ms": "TPOT p99",
    "output_tok_s": "output tok/s",
}
#: Values of one swept setting listed in the headline before "...".
SHOWN_VALUES = 6


def is_sweep_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a sweep's table and document (``stepplan sweep``'s)."""
    return (folder / SWEEP_TABLE).is_file() and (folder / SWEEP_DOCUMENT).is_file()


def read_sweep_folder(folder: Path) -> tuple[Table, dict[str, Any]]:
    """``sweep.csv`` (one row per point) and ``sweep.json`` of ``folder``; a document
    without the keys the report reads is an error naming it."""
    path = folder / SWEEP_DOCUMENT
    try:
        document = json.loads(path.read_text())
        keys = [str(key) for key in document["settings"]]
        named = [document["tradeoff"][axis] for axis in ("x", "y")]
        named += [(e["slo"], dict(e["limits"]), e["trace"], e["point"]) for e in document["best"]]
    except (ValueError, KeyError, TypeError):
        raise ResultsError(
            f"{path}: expected what `stepplan sweep` writes (settings, tradeoff, best)"
        ) from None
    table = read_csv(folder / SWEEP_TABLE, SWEEP)
    for key in ("point", "trace", *keys, *POINT_METRICS):
        table.column(key)
    return table, document


def sweep_slos(document: Mapping[str, Any]) -> tuple[Slo, ...]:
    """The sweep's SLOs, as its document's best points name them (in order, once each)."""
    slos = {}
    for entry in document["best"]:
        limits = tuple((str(k), float(v)) for k, v in entry["limits"].items())
        slos.setdefault(entry["slo"], Slo(str(entry["slo"]), limits))
    return tuple(slos.values())


def swept_values(table: Table, keys: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``(setting, its distinct values in order)`` of each swept setting."""
    return [(key, list(dict.fromkeys(table.column(key).tolist()))) for key in keys]


def _values_text(values: list[Any]) -> str:
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values[:SHOWN_VALUES])
    return shown + (f", ... ({len(values)} values)" if len(values) > SHOWN_VALUES else "")


def sweep_verdict(table: Table, document: Mapping[str, Any]) -> Verdict:
    """The sweep report's opening block: the headline names the swept settings and how
    many points meet each SLO; the subject lists each setting's values; a check per SLO
    (met when some point meets it) names its best point."""
    from stepplan.plots.report import Verdict

    keys, slos = list(document["settings"]), sweep_slos(document)
    points, traces = table.num_rows, list(dict.fromkeys(table.column("trace").tolist()))
    dimensions = ", ".join(keys) or "nothing (one point)"
    on = f" on {len(traces)} traces" if len(traces) > 1 else ""
    meets = [f"{int(slo.met(table).sum())} of {points} meet {slo.name}" for slo in slos]
    headline = f"Sweep over {dimensions} ({points} points{on}): " + "; ".join(meets)
    varied = "; ".join(f"{key}: {_values_text(v)}" for key, v in swept_values(table, keys))
    subject = f"What differs across the points: {varied or 'nothing'}. Trace: " + ", ".join(
        map(str, traces)
    )
    x, y = document["tradeoff"]["x"], document["tradeoff"]["y"]
    checks, figures = [], []
    for slo in slos:
        met = np.flatnonzero(slo.met(table))
        named = ", ".join(str(table.column("point")[row]) for row in met[:12])
        outcome = f"met by points {named}" + (", ..." if met.size > 12 else "")
        checks.append(
            (f"{slo.name}: {slo.text()}", outcome if met.size else "no point", bool(met.size))
        )
    for entry in document["best"]:
        where = f" on {entry['trace']}" if len(traces) > 1 else ""
        text = "no point meets it"
        if entry["point"] is not None:
            settings = describe(entry.get("settings") or {})
            text = f"point {entry['point']} ({settings}): {y} {entry.get(y, float('nan')):,.1f}"
        figures.append((f"best for {entry['slo']}{where}", text))
    notes = [f"The best point of an SLO: the highest {y} among the points that meet it; "
             f"the figure draws {y} against {x}."]  # fmt: skip
    if document.get("complete") is False:
        notes.append(f"The sweep was stopped early: {points} points finished (partial results).")
    return Verdict(headline, subject, figures, checks, notes)


def points_table(table: Table, document: Mapping[str, Any]) -> ReportTable:
    """Every point: its settings, the metrics a person reads first, the front, its SLOs."""
    from stepplan.plots.report import ReportTable

    keys, slos = list(document["settings"]), sweep_slos(document)
    traces = len(set(table.column("trace").tolist()))
    front = {int(p) for points in document.get("pareto_front", {}).values() for p in points}
    met = {slo.name: slo.met(table) for slo in slos}
    names = ["point", *(["trace"] if traces > 1 else []), *keys]
    rows = []
    for row in range(table.num_rows):
        cells = [table.column(name)[row].item() for name in names]
        goodput, ttft, tpot, tok_s = (float(table.column(m)[row]) for m in POINT_METRICS)
        meets = ", ".join(name for name, mask in met.items() if mask[row]) or "none"
        point = int(table.column("point")[row])
        rows.append(
            [*cells, f"{100 * goodput:.1f}%", milliseconds(ttft), milliseconds(tpot),
             f"{tok_s:,.0f}", "yes" if point in front else "", meets]
        )  # fmt: skip
    header = [*names, *POINT_METRICS.values(), "Pareto front", "meets"]
    return ReportTable(f"The {table.num_rows} points", header, rows)


def build_sweep_report(folder: Path, out: OutputFile) -> Path:
    """Write the report of the sweep folder ``folder`` into ``out``."""
    from stepplan.plots.report import build_sweep_report as page
    from stepplan.plots.sweep import plot_tradeoff

    table, document = read_sweep_folder(folder)
    x, y = document["tradeoff"]["x"], document["tradeoff"]["y"]
    points = table.column("point")
    front = np.isin(points, [p for ps in document.get("pareto_front", {}).values() for p in ps])
    rows = {int(p): row for row, p in enumerate(points.tolist())}
    best = [
        (str(e["trace"]), str(e["slo"]), rows[int(e["point"])])
        for e in document["best"]
        if e["point"] is not None and int(e["point"]) in rows
    ]
    figure = plot_tradeoff(table, x=x, y=y, front=front, best=best)
    text = page(
        folder.name,
        verdict=sweep_verdict(table, document),
        figures={f"Trade-off: {y} against {x}": figure},
        tables=(points_table(table, document),),
    )
    return out.write(text.encode())
