"""``stepplan capacity [TRACE] --slo ttft_p99_ms=...,tpot_p99_ms=...``: the largest
request-rate scale of a trace whose run meets every SLO (``sweep/search.py``).

Each round's scales run as points of a sweep (worker processes, or Ray), each leaving
its record in ``points/``, so a re-run of the same search finds them done. Written:
``capacity.csv`` (the curve: every scale run, met or not, with its metrics),
``capacity.json`` (the answer, the SLOs and the rounds) and ``capacity.png``.
``--find replicas`` (``capacity_replicas.py``) and ``--find cheapest``
(``capacity_cheapest.py``) search the deployment at the settings' rate instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..results.outdir import config_digest
from ..results.schema import CAPACITY, SWEEP_METRICS
from ..results.table import Table
from ..settings.config import SimConfig, with_settings
from ..sweep.cheapest import DEFAULT_GPUS, DEFAULT_LAYOUTS, DEFAULT_TENSOR
from ..sweep.records import RECORDS, metric, metric_columns, point_digest, write_table
from ..sweep.search import (
    Probe,
    SearchError,
    SearchResult,
    capacity_search,
    check_bounds,
    rounded,
)
from ..sweep.spec import TraceEntry
from ..sweep.tradeoff import Slo, default_slo, parse_slo
from .options import add_run_command, build_config, checked, run_name
from .signals import StopRequest
from .sweep import import_figures
from .sweep_run import (
    Point,
    PointRun,
    TraceReader,
    add_runner_options,
    check_points,
    claim_folder,
    runner_for,
)
from .tables import align

CAPACITY_FILES = ("capacity.csv", "capacity.parquet", "capacity.json", "capacity.png", RECORDS)
SCALE_KEY = "workload.rate_scale"
_METRICS = tuple(column.name for column in SWEEP_METRICS)


class _Stopped(Exception):
    """A signal stopped a round before all its scales ran."""


def meets(slo: Slo, summary: Mapping[str, Any]) -> bool:
    """Whether a run's summary meets every bound of ``slo``."""
    columns = {
        name: np.array([np.nan if (v := metric(summary, name)) is None else v], np.float64)
        for name, _ in slo.limits
    }
    return bool(slo.met(columns)[0])


class CapacityRun:
    """The search's points: one per scale, run through a :class:`PointRun`."""

    def __init__(
        self, args: argparse.Namespace, config: SimConfig, run: PointRun, entry: TraceEntry
    ) -> None:
        self.args, self.config, self.run, self.entry = args, config, run, entry
        self.identity = run.reader.identity(entry)
        self.points: dict[float, Point] = {}
        self.rounds: dict[float, int] = {}

    def point(self, scale: float) -> Point:
        """The point at ``scale``, checked."""
        if scale not in self.points:
            config = checked(with_settings(self.config, {SCALE_KEY: scale}))
            digest = point_digest(self.identity, self.entry.format, config)
            index = len(self.points)
            self.points[scale] = Point(
                index, self.entry, self.identity, {SCALE_KEY: scale}, config, digest
            )
        return self.points[scale]

    def evaluate(self, slo: Slo, stop: StopRequest) -> Any:
        """The search's ``evaluate``: run a round's scales, say which met ``slo``."""

        def evaluate(scales: Sequence[float], round_: int) -> list[bool]:
            points = [self.point(scale) for scale in scales]
            for scale in scales:
                self.rounds.setdefault(scale, round_)
            self.run.run(points, stop)
            if stop.signum is not None or any(p.digest not in self.run.records for p in points):
                raise _Stopped
            met = [meets(slo, self.run.records[p.digest].summary) for p in points]
            if not self.args.quiet:
                said = ", ".join(
                    f"{s:g} {'met' if m else 'failed'}" for s, m in zip(scales, met, strict=True)
                )
                print(f"stepplan: capacity: round {round_}: {said}", file=sys.stderr)
            return met

        return evaluate

    def curve(self, slo: Slo) -> Table:
        """``capacity.csv``: every scale run so far, by scale."""
        done = sorted(s for s in self.rounds if self.points[s].digest in self.run.records)
        summaries = [self.run.records[self.points[s].digest].summary for s in done]
        columns: dict[str, Any] = {
            "scale": np.array(done, np.float64),
            "round": np.array([self.rounds[s] for s in done], np.int64),
            "met": np.array([meets(slo, summary) for summary in summaries], np.int64),
            "digest": np.array([self.points[s].digest for s in done], dtype=str),
        }
        columns |= metric_columns(summaries, CAPACITY.columns[4:])
        return Table.from_columns(CAPACITY.file, columns, CAPACITY)


def _slo(args: argparse.Namespace, config: SimConfig) -> Slo:
    if args.slo is None:
        return default_slo(config)
    return parse_slo(args.slo, _METRICS, SearchError)


def run_capacity(args: argparse.Namespace) -> int:
    """``stepplan capacity``: search, write the curve, print it and the answer."""
    config = build_config(args)
    slo = _slo(args, config)
    if args.find == "replicas":
        from .capacity_replicas import run_replica_capacity

        return run_replica_capacity(args, config, slo)
    grid = {"gpus": args.gpus, "tensor": args.tensor, "disaggregation": args.disaggregation}
    given = next((flag for flag, value in grid.items() if value), None)
    if args.find != "cheapest" and given:
        raise SearchError(f"--{given}: only with --find cheapest")
    if args.find == "cheapest":
        from .capacity_cheapest import run_cheapest_capacity

        return run_cheapest_capacity(args, config, slo)
    runner, where = runner_for(args)
    per_round = args.per_round or (args.workers or _default_per_round(args))
    check_bounds(args.lo, args.hi, args.tol, per_round)
    lo, hi = rounded(args.lo), rounded(args.hi)
    if config.workload.rate_scale != 1.0 and not args.quiet:
        print(f"stepplan: note: the search sets {SCALE_KEY} itself", file=sys.stderr)
    entry = TraceEntry(args.trace, args.format, run_name(args, config), "TRACE")
    stop: StopRequest = getattr(args, "stop", None) or StopRequest()
    reader = TraceReader()
    key = [reader.identity(entry), entry.format, config.to_dict(), slo.to_dict()]
    stem = f"capacity-{entry.label}-{config_digest([*key, args.lo, args.hi, args.tol])}"
    with claim_folder(args, stem, "capacity", CAPACITY_FILES) as folder:
        run = PointRun(folder, reader, runner, quiet=True, label="capacity")
        run.meanwhile = import_figures
        search = CapacityRun(args, config, run, entry)
        check_points([search.point(lo), search.point(hi)], reader, None)
        run.load(args.overwrite)
        if not args.quiet:
            print(f"stepplan: capacity: {per_round} scales a round on {where}", file=sys.stderr)
        try:
            result = capacity_search(search.evaluate(slo, stop), lo, hi, args.tol, per_round)
        except _Stopped:
            result = None
        base = reader.requests(entry, with_settings(config, {SCALE_KEY: 1.0}))
        offered = base.num_requests / base.span_s if base.span_s > 0 else None
        table = search.curve(slo)
        document = capacity_document(args, slo, result, table, offered, search.identity)
        if not table.num_rows:  # inside the claim: a folder it made is removed again
            stop.raise_if_stopped("no scale had finished, nothing written")
        _write(folder, table, document, slo, result)
    if not args.quiet:
        print(_report(table, slo, result, offered))
    if not args.quiet or not args.out:
        print(f"results: {folder.shown}/capacity.csv, capacity.json, capacity.png")
    stop.raise_if_stopped(
        f"{table.num_rows} scales run: the curve so far is in {folder.shown}/; "
        "the same command again goes on"
    )
    return 0


def _default_per_round(args: argparse.Namespace) -> int:
    from ..sweep.runner import default_workers

    return 2 if args.ray is not None else default_workers()


def _write(
    folder: Any, table: Table, document: dict, slo: Slo, result: SearchResult | None
) -> None:
    from stepplan.plots.canvas import figure_bytes
    from stepplan.plots.sweep import plot_capacity

    answer = None if result is None else result.answer
    title = (
        f"Capacity: rate scale {answer:g} meets {slo.text()}"
        if answer
        else f"Capacity: {slo.text()}"
    )
    png = figure_bytes(plot_capacity(table, limits=slo.limits, answer=answer, title=title), "png")

    def write(stage: Path) -> list[str]:
        names = write_table(stage, table)
        (stage / "capacity.json").write_text(json.dumps(document, indent=2) + "\n")
        (stage / "capacity.png").write_bytes(png)
        return [*names, "capacity.json", "capacity.png"]

    folder.put(write, complete=result is not None, keep=[RECORDS])


def capacity_document(
    args: argparse.Namespace,
    slo: Slo,
    result: SearchResult | None,
    table: Table,
    offered: float | None,
    identity: Mapping[str, Any],
) -> dict[str, Any]:
    """``capacity.json``: the answer, how it was searched, and the curve."""
    answer = None if result is None else result.answer
    metrics = [name for name, _ in slo.limits] + ["output_tok_s", "goodput_share"]
    curve = [
        {
            "scale": float(table.column("scale")[row]),
            "round": int(table.column("round")[row]),
            "met": bool(table.column("met")[row]),
            **{name: _number(table.column(name)[row]) for name in dict.fromkeys(metrics)},
        }
        for row in range(table.num_rows)
    ]
    return {
        "trace": dict(identity),
        "slo": slo.to_dict(),
        "search": {"lo": args.lo, "hi": args.hi, "tol": args.tol},
        "complete": result is not None,
        "status": None if result is None else result.status,
        "answer": answer,
        "bracket": None if result is None or result.bracket is None else list(result.bracket),
        "rounds": None if result is None else result.rounds,
        "offered_req_s_at_scale_1": offered,
        "answer_req_s": None if answer is None or offered is None else answer * offered,
        "notes": [] if result is None else list(result.notes),
        "curve": curve,
    }


def _number(value: Any) -> float | None:
    number = float(value)
    return None if number != number else number


def _report(table: Table, slo: Slo, result: SearchResult | None, offered: float | None) -> str:
    names = [*dict.fromkeys([name for name, _ in slo.limits] + ["output_tok_s"])]
    header = ["scale", "round", "met", *names]
    body = [
        [
            f"{table.column('scale')[row]:g}",
            str(table.column("round")[row]),
            "yes" if table.column("met")[row] else "no",
            *(f"{table.column(name)[row]:,.2f}" for name in names),
        ]
        for row in range(table.num_rows)
    ]
    lines = [align(header, body) if body else "(no scale ran)"]
    lines += [f"note: {note}" for note in ([] if result is None else result.notes)]
    lines.append(_answer_line(slo, result, offered))
    return "\n".join(lines)


def _answer_line(slo: Slo, result: SearchResult | None, offered: float | None) -> str:
    if result is None:
        return "capacity: stopped before the search ended"
    answer = result.answer
    rate = "" if offered is None or answer is None else f" ({answer * offered:,.3g} req/s)"
    if result.status == "below-lo":
        lowest = result.probes[0].scale
        return f"capacity: even the lowest scale ({lowest:g}) fails {slo.text()}: lower --lo"
    if result.status == "above-hi":
        return (
            f"capacity: at least rate scale {answer:g}{rate} (the highest, --hi, meets "
            f"{slo.text()}): raise --hi"
        )
    low, high = result.bracket
    return (
        f"capacity: rate scale {low:g}{rate} meets {slo.text()} "
        f"({high:g} does not; {result.rounds} rounds)"
    )


def add_capacity(subparsers: Any) -> None:
    """``capacity [TRACE] --slo ... [--lo --hi --tol] [options]``."""
    parser = add_run_command(
        subparsers,
        "capacity",
        run_capacity,
        parquet=False,
        help="find the largest request-rate scale of a trace that meets the SLOs",
        description="Search the request-rate scale (workload.rate_scale) of a trace for the "
        "largest that meets every SLO, several scales a round in parallel; prints the "
        "curve that led to it.",
    )
    add = parser.add_argument
    add(
        "--slo",
        help="upper bounds on metrics of the sweep table, e.g. ttft_p99_ms=500,tpot_p99_ms=50 "
        "(default: the settings' slo.ttft_ms and slo.tpot_ms on p99)",
    )
    add(
        "--find",
        choices=("rate", "replicas", "cheapest"),
        default="rate",
        help="rate: the largest request-rate scale that meets the SLOs; replicas: the "
        "fewest replicas (deployment.replicas, behind --router) that meet them at the "
        "settings' rate (--rate-scale); cheapest: the cheapest GPU (--gpus) x tensor "
        "parallelism (--tensor) x replicas that meets them, by $/hour (default: rate)",
    )
    add(
        "--gpus",
        help=f"GPU presets --find cheapest tries, comma-separated (default: {DEFAULT_GPUS})",
    )
    add(
        "--tensor",
        help="tensor-parallel sizes --find cheapest tries, comma-separated "
        f"(default: {DEFAULT_TENSOR})",
    )
    add(
        "--disaggregation",
        help="layouts --find cheapest tries, comma-separated: off (prefill and decode on "
        "the same replicas), on (a prefill pool and a decode pool of the same size, "
        f"over disaggregation.link) (default: {DEFAULT_LAYOUTS})",
    )
    add(
        "--max-replicas",
        type=int,
        default=64,
        help="most replicas --find replicas tries (default: 64)",
    )
    add("--lo", type=float, default=0.25, help="lowest scale tried")
    add("--hi", type=float, default=4.0, help="highest scale tried")
    add("--tol", type=float, default=0.02, help="stop when the bracket's high / low <= 1 + tol")
    add(
        "--per-round",
        type=int,
        help="scales run each round (default: --workers, all cores; 2 on Ray)",
    )
    add_runner_options(parser)


__all__ = ["Probe", "add_capacity", "meets", "run_capacity"]
