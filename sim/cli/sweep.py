"""``stepplan sweep SWEEP.toml``: a trace, or several, under a grid or a list of settings.

The sweep file (``sweep/spec.py``) is read and every point checked before any runs.
Points run in worker processes (all cores), in this process (``--workers 1``) or on Ray
(``--ray``); each finished point leaves ``points/<digest>.json``, and a re-run into the
same folder runs only the points without one. Written at the end (and when stopped):
``sweep.csv`` (one row per point: settings and metrics; ``.parquet`` too with pyarrow),
``sweep_measured.csv``, ``sweep.json`` (Pareto front, best point per SLO) and the
trade-off figure ``sweep.png``; with ``--keep-runs`` each point's results folder
under ``runs/``; with ``--report`` the HTML report (``report_sweep.py``: what differs
between the points, which meet each SLO), ``report.html`` in the folder by default.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..results.outdir import ResultsFolder, config_digest
from ..results.outfile import OutputFile
from ..results.table import Table
from ..sweep.records import RECORDS, RUNS, TableRow, measured_table, sweep_table, write_table
from ..sweep.spec import SweepError, SweepSpec, describe, read_sweep
from ..sweep.tradeoff import Slo, best_points, default_slo, grouped_front
from .helptext import Parser
from .options import checked
from .report import add_report_option, claim_report
from .report_sweep import build_sweep_report
from .signals import StopRequest
from .sweep_run import (
    Point,
    PointRun,
    TraceReader,
    add_runner_options,
    check_points,
    claim_folder,
    make_points,
    runner_for,
)
from .tables import align

#: Everything a sweep folder may hold (besides its manifest).
SWEEP_FILES = (
    "sweep.csv",
    "sweep.parquet",
    "sweep_measured.csv",
    "sweep_measured.parquet",
    "sweep.json",
    "sweep.png",
    RECORDS,
    RUNS,
)
#: Rows of the table printed at the end (all of them are in sweep.csv).
PRINTED_ROWS = 40
#: Metrics of the printed table, by column, and their headers.
PRINTED = {
    "output_tok_s": "output tok/s",
    "goodput_share": "goodput share",
    "ttft_p99_ms": "TTFT p99 ms",
    "tpot_p99_ms": "TPOT p99 ms",
}


@attrs.frozen(eq=False)
class SweepView:
    """A sweep's table and what the trade-off picks in it.

    Attributes:
        table: ``sweep.csv``'s columns. front: ``[points], bool`` the Pareto front.
        slos: the SLOs. best: ``(trace, slo, row)`` per trace and SLO (``None``: none met).
    """

    table: Table
    front: np.ndarray
    slos: tuple[Slo, ...]
    best: tuple[tuple[str, Slo, int | None], ...]


def run_sweep(args: argparse.Namespace) -> int:
    """``stepplan sweep``: every point run (or found done), the table and figure written."""
    spec = read_sweep(args.sweep, check=checked)
    runner, where = runner_for(args)
    reader = TraceReader(origin=str(spec.path))
    identities = [reader.identity(trace) for trace in spec.traces]
    points = make_points(spec.traces, identities, spec.configs, spec.keys)
    stop: StopRequest = getattr(args, "stop", None) or StopRequest()
    stem = f"{spec.path.stem}-{config_digest([p.digest for p in points])}"
    report: Path | None = None
    with claim_folder(args, stem, "sweep", SWEEP_FILES) as folder:
        report_file = _claim_report(args, folder)
        check_points(points, reader, str(spec.path))
        run = PointRun(folder, reader, runner, keep_runs=args.keep_runs, quiet=args.quiet)
        run.meanwhile = import_figures
        run.load(args.overwrite)
        todo = sum(not run.done(p) for p in {p.digest: p for p in points}.values())
        if not args.quiet:
            before = f" ({len(points) - todo} done before)" if todo < len(points) else ""
            print(
                f"stepplan: sweep: {len(points)} points, {todo} to run on {where}{before}",
                file=sys.stderr,
            )
        run.run(points, stop)
        view = _write(folder, spec, points, run)
        if view is None:  # inside the claim: a folder it made is removed again
            stop.raise_if_stopped("no point had finished, nothing written")
        if view is not None and report_file is not None:
            report = build_sweep_report(folder.path, report_file)
    if not args.quiet and view is not None:
        print(_report(spec, view))
    if not args.quiet or not args.out:
        page = (
            f"report: {report}" if report else f"`stepplan report {folder.shown}` writes its page"
        )
        print(f"results: {folder.shown}/sweep.csv, sweep.png ({run.ran} points run now); {page}")
    finished = sum(p.digest in run.records for p in points)
    stop.raise_if_stopped(
        f"{finished} of {len(points)} points done: their table is in {folder.shown}/; "
        "the same command again runs the rest"
    )
    return 0


def _write(
    folder: ResultsFolder, spec: SweepSpec, points: Sequence[Point], run: PointRun
) -> SweepView | None:
    """The table, ``sweep.json`` and the figure of the points done (none: nothing)."""
    rows = [
        TableRow(p.index, p.trace.label, p.settings, run.records[p.digest])
        for p in points
        if p.digest in run.records
    ]
    if not rows:
        return None
    view = sweep_view(sweep_table(rows, spec.keys), spec)
    complete = len(rows) == len(points)
    document = sweep_document(spec, view, complete=complete, ran=run.ran)
    png = _figure(view, spec)

    def write(stage: Path) -> list[str]:
        names = write_table(stage, view.table) + write_table(stage, measured_table(rows))
        (stage / "sweep.json").write_text(json.dumps(document, indent=2) + "\n")
        (stage / "sweep.png").write_bytes(png)
        return [*names, "sweep.json", "sweep.png"]

    kept = [entry for entry in (RECORDS, RUNS) if entry in folder.entries]
    folder.put(write, complete=complete, keep=kept)
    return view


def _claim_report(args: argparse.Namespace, folder: ResultsFolder) -> OutputFile | None:
    """The file ``--report`` names (checked before any point runs), or None."""
    if args.report is None:
        return None
    if args.report:
        return claim_report(args.report, args.overwrite)
    # The folder's own report.html from an earlier run of this sweep is replaced as the
    # sweep goes on; OutputFile still refuses any file there that stepplan did not write.
    return claim_report(folder.path / "report.html", overwrite=True)


def sweep_view(table: Table, spec: SweepSpec) -> SweepView:
    """The Pareto front and the best points of ``table`` under the sweep's trade-off."""
    x, y = spec.tradeoff
    traces = np.asarray(table.column("trace"))
    front = grouped_front(traces, table.column(x), table.column(y))
    slos = spec.slos if spec.slos is not None else (default_slo(spec.configs[0]),)
    return SweepView(table, front, slos, tuple(best_points(table, slos, y)))


def import_figures() -> None:
    """Load the figures' modules (matplotlib: half a second) while the points run."""
    importlib.import_module("stepplan.plots.sweep")


def _figure(view: SweepView, spec: SweepSpec) -> bytes:
    from stepplan.plots.canvas import figure_bytes
    from stepplan.plots.sweep import plot_tradeoff

    x, y = spec.tradeoff
    best = [(trace, slo.name, row) for trace, slo, row in view.best if row is not None]
    figure = plot_tradeoff(view.table, x=x, y=y, front=view.front, best=best)
    return figure_bytes(figure, "png")


def _settings_of(view: SweepView, row: int, keys: Sequence[str]) -> dict[str, Any]:
    return {key: view.table.column(key)[row].item() for key in keys}


def sweep_document(spec: SweepSpec, view: SweepView, *, complete: bool, ran: int) -> dict[str, Any]:
    """``sweep.json``: the trade-off's axes, front and best point per SLO and trace."""
    table, (x, y) = view.table, spec.tradeoff
    points = table.column("point")
    traces = np.asarray(table.column("trace"))
    best = [
        {
            "trace": trace,
            "slo": slo.name,
            "limits": slo.to_dict(),
            "point": None if row is None else int(points[row]),
            "settings": None if row is None else _settings_of(view, row, spec.keys),
            x: None if row is None else float(table.column(x)[row]),
            y: None if row is None else float(table.column(y)[row]),
        }
        for trace, slo, row in view.best
    ]
    fronts = {
        name: [int(p) for p in points[(traces == name) & view.front]]
        for name in dict.fromkeys(traces.tolist())
    }
    return {
        "sweep": {
            "file": spec.path.name,
            "sha256": hashlib.sha256(spec.path.read_bytes()).hexdigest(),
        },
        "complete": complete,
        "points": int(table.num_rows),
        "ran_now": ran,
        "settings": list(spec.keys),
        "tradeoff": {"x": x, "x_better": "lower", "y": y, "y_better": "higher"},
        "pareto_front": fronts,
        "best": best,
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def _report(spec: SweepSpec, view: SweepView) -> str:
    """The table (its first rows) and the best point of each SLO, as printed."""
    table = view.table
    traces = len(set(np.asarray(table.column("trace")).tolist()))
    names = ["point", *(["trace"] if traces > 1 else []), *spec.keys, *PRINTED]
    header = [PRINTED.get(name, name) for name in names] + ["front", "meets"]
    met = {slo.name: slo.met(table) for slo in view.slos}
    body = []
    for row in range(min(table.num_rows, PRINTED_ROWS)):
        cells = [_cell(table.column(name)[row].item()) for name in names]
        meets = ",".join(name for name, mask in met.items() if mask[row]) or "-"
        body.append([*cells, "*" if view.front[row] else "", meets])
    lines = [align(header, body)]
    if table.num_rows > PRINTED_ROWS:
        lines.append(f"... {table.num_rows - PRINTED_ROWS} more points in sweep.csv")
    y = spec.tradeoff[1]
    lines.append(f"\nbest point per SLO (the highest {y} that meets it):")
    for trace, slo, row in view.best:
        where = f"{slo.name} ({slo.text()})" + (f" on {trace}" if traces > 1 else "")
        if row is None:
            lines.append(f"  {where}: no point meets it")
            continue
        point = table.column("point")[row]
        settings = describe(_settings_of(view, row, spec.keys))
        lines.append(
            f"  {where}: point {point} ({settings}), {y} {_cell(float(table.column(y)[row]))}"
        )
    return "\n".join(lines)


def add_sweep(subparsers: Any) -> None:
    """``sweep SWEEP.toml [--out DIR] [--workers N] [--ray [ADDRESS]] ...``."""
    parser: Parser = subparsers.add_parser(
        "sweep",
        help="run a trace under a grid or list of settings; one table, a trade-off figure",
        description="Run one or more traces under every point of a sweep file (a grid "
        "and/or a list of settings; docs/sweep_example.toml), in parallel. A re-run into "
        "the same folder runs only the points not done.",
    )
    parser.add_argument("sweep", help="the sweep file (TOML)")
    parser.add_argument(
        "--out",
        help="sweep folder: new, empty, or an earlier one of this sweep to go on with "
        "(default: results/<sweep file>-<digest of its points>)",
    )
    add_runner_options(parser)
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="keep each point's results folder, runs/<digest>/ (default: the table only)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="run every point again, replacing the records and files the folder's "
        "manifest lists (default: skip the points done)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress, no table (default: both)"
    )
    add_report_option(parser)
    parser.set_defaults(handler=run_sweep)


__all__ = ["SweepError", "add_sweep", "run_sweep", "sweep_document", "sweep_view"]
