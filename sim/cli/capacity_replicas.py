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

from ..config import SimConfig, with_settings
from ..outdir import config_digest
from ..schema import CAPACITY
from ..sweep.records import RECORDS, metric_columns, point_digest, write_table
from ..sweep.replica_search import ReplicaResult, check_most, replica_search
from ..sweep.spec import TraceEntry
from ..sweep.tradeoff import Slo
from ..table import Table
from .options import checked, run_name
from .signals import StopRequest
from .sweep_run import Point, PointRun, TraceReader, check_points, claim_folder, runner_for
from .tables import align

REPLICAS_KEY = "deployment.replicas"
FILES = ("capacity.csv", "capacity.parquet", "capacity.json", RECORDS)


class _Stopped(Exception):
    """A signal stopped a round before all its counts ran."""


def run_replica_capacity(args: argparse.Namespace, config: SimConfig, slo: Slo) -> int:
    """Search the replica count, write the curve, print it and the answer."""
    from .capacity_cmd import meets  # the one rule of an SLO met

    runner, where = runner_for(args)
    per_round = args.per_round or args.workers or 2
    check_most(args.max_replicas, per_round)
    entry = TraceEntry(args.trace, args.format, run_name(args, config), "TRACE")
    stop: StopRequest = getattr(args, "stop", None) or StopRequest()
    reader = TraceReader()
    identity = reader.identity(entry)
    key = [identity, entry.format, config.to_dict(), slo.to_dict(), args.max_replicas]
    stem = f"capacity-replicas-{entry.label}-{config_digest(key)}"
    points: dict[int, Point] = {}
    rounds: dict[int, int] = {}

    def point(count: int) -> Point:
        if count not in points:
            settings = {REPLICAS_KEY: count}
            own = checked(with_settings(config, settings))
            digest = point_digest(identity, entry.format, own)
            points[count] = Point(len(points), entry, identity, settings, own, digest)
        return points[count]

    with claim_folder(args, stem, "capacity", FILES) as folder:
        run = PointRun(folder, reader, runner, quiet=True, label="capacity")
        check_points([point(1)], reader, None)
        run.load(args.overwrite)
        if not args.quiet:
            print(f"stepplan: capacity: {per_round} counts a round on {where}", file=sys.stderr)

        def evaluate(counts: Sequence[int], round_: int) -> list[bool]:
            chosen = [point(count) for count in counts]
            for count in counts:
                rounds.setdefault(count, round_)
            run.run(chosen, stop)
            if stop.signum is not None or any(p.digest not in run.records for p in chosen):
                raise _Stopped
            met = [meets(slo, run.records[p.digest].summary) for p in chosen]
            if not args.quiet:
                said = ", ".join(
                    f"{c} {'met' if m else 'failed'}" for c, m in zip(counts, met, strict=True)
                )
                print(f"stepplan: capacity: round {round_}: {said}", file=sys.stderr)
            return met

        try:
            result: ReplicaResult | None = replica_search(evaluate, args.max_replicas, per_round)
        except _Stopped:
            result = None
        done = sorted(c for c in rounds if points[c].digest in run.records)
        summaries = [run.records[points[c].digest].summary for c in done]
        columns: dict[str, Any] = {
            "replicas": np.array(done, np.int64),
            "round": np.array([rounds[c] for c in done], np.int64),
            "met": np.array([meets(slo, s) for s in summaries], np.int64),
            "digest": np.array([points[c].digest for c in done], dtype=str),
        }
        columns |= metric_columns(summaries, CAPACITY.columns[4:])
        table = Table.from_columns(CAPACITY.file, columns, CAPACITY)
        document = _document(args, config, slo, result, table, identity)
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
