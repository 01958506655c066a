"""``stepplan capacity --find replicas``: the fewest replicas behind the router that meet
every SLO at the settings' request rate (``sweep/replica_search.py``).

Each round's counts run as points of a sweep (worker processes, or Ray), each leaving
its record in ``points/``, so a re-run finds them done. Written: ``capacity.csv`` (every
count run, met or not, with its metrics) and ``capacity.json`` (the answer and the
rounds).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..results.outdir import config_digest
from ..results.schema import CAPACITY
from ..results.table import Table
from ..settings.config import SimConfig, with_settings
from ..sweep.records import RECORDS, metric_columns, point_digest, write_table
from ..sweep.replica_search import ReplicaResult, check_most, replica_search
from ..sweep.spec import TraceEntry
from ..sweep.tradeoff import Slo
from .options import checked, run_name
from .signals import StopRequest
from .sweep_run import Point, PointRun, TraceReader, check_points, claim_folder, runner_for
from .tables import align

REPLICAS_KEY = "deployment.replicas"
PREFILL_KEY = "disaggregation.prefill_replicas"
FILES = ("capacity.csv", "capacity.parquet", "capacity.json", RECORDS)


class SearchStopped(Exception):
    """A signal stopped a round before all its counts ran."""


class ReplicaRun:
    """The search's points: one per replica count, run through a :class:`PointRun`."""

    def __init__(self, config: SimConfig, run: PointRun, entry: TraceEntry, quiet: bool) -> None:
        self.config, self.run, self.entry, self.quiet = config, run, entry, quiet
        self.identity = run.reader.identity(entry)
        self.points: dict[int, Point] = {}
        self.rounds: dict[int, int] = {}

    def point(self, count: int) -> Point:
        """The point of ``count`` replicas, checked."""
        if count not in self.points:
            settings = {REPLICAS_KEY: count}
            if self.config.disaggregation.enabled:  # the pools grow together, 1:1
                settings[PREFILL_KEY] = count
            own = checked(with_settings(self.config, settings))
            digest = point_digest(self.identity, self.entry.format, own)
            index = len(self.points)
            self.points[count] = Point(index, self.entry, self.identity, settings, own, digest)
        return self.points[count]

    def evaluate(self, slo: Slo, stop: StopRequest) -> Any:
        """The search's ``evaluate``: run a round's counts, say which met ``slo``."""
        from .capacity_cmd import meets  # the one rule of an SLO met

        def evaluate(counts: Sequence[int], round_: int) -> list[bool]:
            chosen = [self.point(count) for count in counts]
            for count in counts:
                self.rounds.setdefault(count, round_)
            self.run.run(chosen, stop)
            records = self.run.records
            if stop.signum is not None or any(p.digest not in records for p in chosen):
                raise SearchStopped
            met = [meets(slo, records[p.digest].summary) for p in chosen]
            if not self.quiet:
                pairs = zip(counts, met, strict=True)
                said = ", ".join(f"{c} {'met' if m else 'failed'}" for c, m in pairs)
                print(f"stepplan: capacity: round {round_}: {said}", file=sys.stderr)
            return met

        return evaluate

    def curve(self, slo: Slo) -> Table:
        """``capacity.csv``: every count run so far, by count."""
        from .capacity_cmd import meets

        done = sorted(c for c in self.rounds if self.points[c].digest in self.run.records)
        summaries = [self.run.records[self.points[c].digest].summary for c in done]
        columns: dict[str, Any] = {
            "replicas": np.array(done, np.int64),
            "round": np.array([self.rounds[c] for c in done], np.int64),
            "met": np.array([meets(slo, s) for s in summaries], np.int64),
            "digest": np.array([self.points[c].digest for c in done], dtype=str),
        }
        columns |= metric_columns(summaries, CAPACITY.columns[4:])
        return Table.from_columns(CAPACITY.file, columns, CAPACITY)


def run_replica_capacity(args: argparse.Namespace, config: SimConfig, slo: Slo) -> int:
    """Search the replica count, write the curve, print it and the answer."""
    runner, where = runner_for(args)
    per_round = args.per_round or args.workers or 2
    check_most(args.max_replicas, per_round)
    entry = TraceEntry(args.trace, args.format, run_name(args, config), "TRACE")
    stop: StopRequest = getattr(args, "stop", None) or StopRequest()
    reader = TraceReader()
    key = [reader.identity(entry), entry.format, config.to_dict(), slo.to_dict()]
    stem = f"capacity-replicas-{entry.label}-{config_digest([*key, args.max_replicas])}"
    with claim_folder(args, stem, "capacity", FILES) as folder:
        run = PointRun(folder, reader, runner, quiet=True, label="capacity")
        search = ReplicaRun(config, run, entry, args.quiet)
        check_points([search.point(1)], reader, None)
        run.load(args.overwrite)
        if not args.quiet:
            print(f"stepplan: capacity: {per_round} counts a round on {where}", file=sys.stderr)
        try:
            evaluate = search.evaluate(slo, stop)
            result: ReplicaResult | None = replica_search(evaluate, args.max_replicas, per_round)
        except SearchStopped:
            result = None
        table = search.curve(slo)
        document = _document(args, config, slo, result, table, search.identity)
        if not table.num_rows:
            stop.raise_if_stopped("no count had finished, nothing written")

        def write(stage: Path) -> list[str]:
            names = write_table(stage, table)
            (stage / "capacity.json").write_text(json.dumps(document, indent=2) + "\n")
            return [*names, "capacity.json"]

        folder.put(write, complete=result is not None, keep=[RECORDS])
    if not args.quiet:
        print(_report(table, slo, result, config))
    if not args.quiet or not args.out:
        print(f"results: {folder.shown}/capacity.csv, capacity.json")
    stop.raise_if_stopped(f"{table.num_rows} counts run: the curve so far is in {folder.shown}/")
    return 0


def _document(
    args: argparse.Namespace,
    config: SimConfig,
    slo: Slo,
    result: ReplicaResult | None,
    table: Table,
    identity: Any,
) -> dict[str, Any]:
    """``capacity.json``: the answer, how it was searched, and the curve."""
    names = [*dict.fromkeys([name for name, _ in slo.limits] + ["output_tok_s"])]
    curve = [
        {
            "replicas": int(table.column("replicas")[row]),
            "round": int(table.column("round")[row]),
            "met": bool(table.column("met")[row]),
            **{name: _number(table.column(name)[row]) for name in names},
        }
        for row in range(table.num_rows)
    ]
    return {
        "find": "replicas",
        "trace": dict(identity),
        "slo": slo.to_dict(),
        "router": config.deployment.router,
        "rate_scale": config.workload.rate_scale,
        "search": {"max_replicas": args.max_replicas},
        "complete": result is not None,
        "status": None if result is None else result.status,
        "answer": None if result is None else result.answer,
        "rounds": None if result is None else result.rounds,
        "notes": [] if result is None else list(result.notes),
        "curve": curve,
    }


def _number(value: Any) -> float | None:
    number = float(value)
    return None if number != number else number


def _report(table: Table, slo: Slo, result: ReplicaResult | None, config: SimConfig) -> str:
    names = [*dict.fromkeys([name for name, _ in slo.limits] + ["output_tok_s"])]
    body = [
        [
            str(table.column("replicas")[row]),
            str(table.column("round")[row]),
            "yes" if table.column("met")[row] else "no",
            *(f"{table.column(name)[row]:,.2f}" for name in names),
        ]
        for row in range(table.num_rows)
    ]
    lines = [align(["replicas", "round", "met", *names], body) if body else "(no count ran)"]
    lines += [f"note: {note}" for note in ([] if result is None else result.notes)]
    where = f"behind {config.deployment.router} at rate scale {config.workload.rate_scale:g}"
    if result is None:
        lines.append("capacity: stopped before the search ended")
    elif result.answer is None:
        lines.append(
            f"capacity: even the most replicas tried fail {slo.text()}: raise --max-replicas"
        )
    else:
        lines.append(f"capacity: {result.answer} replicas {where} meet {slo.text()}")
    return "\n".join(lines)
