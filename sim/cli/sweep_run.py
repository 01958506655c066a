"""What ``stepplan sweep`` and ``stepplan capacity`` share: their traces, read once; their
points, keyed and checked before any runs; and running them into a results folder,
one record per finished point, with a progress bar over the points."""

from __future__ import annotations

import argparse
import functools
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ..memory_sizing import plan_memory
from ..progress import count_progress
from ..results.outdir import ResultsFolder, claim_new
from ..results.schema import RESULT_FILES
from ..results.sim_result import SimResult, write_results
from ..run import prepare_requests
from ..settings.config import ConfigError, SimConfig
from ..sweep.ray_runner import import_ray, run_ray
from ..sweep.records import (
    RECORDS,
    RUNS,
    PointRecord,
    point_digest,
    read_records,
    setting_value,
)
from ..sweep.runner import (
    Done,
    Meanwhile,
    PointOutcome,
    PointTask,
    default_workers,
    run_local,
    run_serial,
)
from ..sweep.spec import SweepError, TraceEntry, describe
from ..traces import RequestTable, TraceError
from ..workloads import WorkloadError
from .options import RESULTS_PARENT
from .provenance import provenance, with_provenance
from .signals import StopRequest
from .trace_reading import TraceCache, identify

#: Runs tasks, handing each finished point to ``done``, until all ran or the event is set;
#: the last argument is the caller's work meanwhile (``runner.py``).
Runner = Callable[[Iterable[PointTask], Done, threading.Event, Meanwhile], None]


@attrs.frozen(eq=False)
class Point:
    """One point: a trace under one set of settings.

    Attributes:
        index: its number in the sweep. trace: its trace. identity: the trace's identity
            (provenance). settings: the swept settings' values, as the point runs them.
        config: its settings, checked. digest: its key.
    """

    index: int
    trace: TraceEntry
    identity: Mapping[str, Any]
    settings: Mapping[str, Any]
    config: SimConfig
    digest: str


class TraceReader:
    """Reads each trace once (and once per rate and seed where they draw it: synthetic
    workloads, Poisson arrivals), and prepares it for a point; ``origin`` (a sweep file)
    prefixes errors."""

    def __init__(self, origin: str | None = None) -> None:
        self._origin = origin
        self._cache = TraceCache()

    def _fail(self, entry: TraceEntry, exc: Exception) -> Exception:
        if self._origin is None:
            return exc
        return SweepError(f"{self._origin}: {entry.where}: {exc}")

    def _read(self, entry: TraceEntry, config: SimConfig) -> RequestTable:
        # Whole traces: points differ in their limits and windows (prepare cuts them).
        return self._cache.read(entry.spec, entry.format, config, None)

    def requests(self, entry: TraceEntry, config: SimConfig) -> RequestTable:
        """The trace of ``entry`` prepared for ``config`` (window, limit, rate scale)."""
        try:
            return prepare_requests(self._read(entry, config), config)
        except (TraceError, WorkloadError) as exc:
            raise self._fail(entry, exc) from None

    def identity(self, entry: TraceEntry) -> dict[str, Any]:
        """The trace's identity (a file's sha256), from reading it."""
        try:
            return identify(entry.spec, self._read(entry, SimConfig()))
        except (TraceError, WorkloadError, OSError) as exc:
            raise self._fail(entry, exc) from None


def make_points(
    traces: Sequence[TraceEntry],
    identities: Sequence[Mapping[str, Any]],
    configs: Sequence[SimConfig],
    keys: Sequence[str],
) -> list[Point]:
    """Every trace under every one of ``configs``, trace by trace; each point's
    settings are its values of ``keys``, as it runs them."""
    points = []
    for trace, identity in zip(traces, identities, strict=True):
        for config in configs:
            digest = point_digest(identity, trace.format, config)
            own = {key: setting_value(config, key) for key in keys}
            points.append(Point(len(points), trace, identity, own, config, digest))
    return points


def check_points(points: Sequence[Point], reader: TraceReader, origin: str | None) -> None:
    """Read every point's trace and plan its memory, so that a point that cannot run
    is refused before any runs (``origin``, a sweep file, names where)."""
    for point in points:
        requests = reader.requests(point.trace, point.config)
        try:
            plan_memory(point.config, requests, live=point.config.live.enabled)
        except ConfigError as exc:
            if origin is None:
                raise
            where = f"point {point.index} ({point.trace.label}, {describe(point.settings)})"
            raise SweepError(f"{origin}: {where}: {exc}") from None


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """``--workers`` and ``--ray``."""
    parser.add_argument(
        "--workers",
        type=int,
        help=f"worker processes on this machine; 1 runs the points in this process "
        f"(default: all cores, {default_workers()} here)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the points on Ray: a local Ray without ADDRESS, else the cluster at "
        "ADDRESS (needs stepplan[ray]; default: off, worker processes)",
    )


def runner_for(args: argparse.Namespace) -> tuple[Runner, str]:
    """The runner ``--workers``/``--ray`` ask for, and its name; Ray is imported now,
    so that a missing Ray is said before anything runs."""
    if args.ray is not None:
        import_ray()
        say = None if args.quiet else _say
        return functools.partial(run_ray, address=args.ray or None, say=say), "Ray"
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        raise SweepError(f"--workers: must be at least 1, got {workers}")
    if workers == 1:
        return run_serial, "this process"
    return functools.partial(run_local, workers=workers), f"{workers} worker processes"


def _say(line: str) -> None:
    print(f"stepplan: {line}", file=sys.stderr)


def claim_folder(
    args: argparse.Namespace, stem: str, kind: str, names: Sequence[str]
) -> ResultsFolder:
    """``--out`` or ``results/<stem>``: a new folder, or an earlier one of this ``kind``
    taken up (its finished points are skipped; ``--overwrite`` runs them again)."""
    if args.out:
        return ResultsFolder.claim(
            args.out, kind=kind, overwrite=args.overwrite, names=names, resume=True
        )
    return claim_new(
        RESULTS_PARENT, stem, kind=kind, overwrite=args.overwrite, names=names, resume=True
    )


@attrs.define(eq=False)
class PointRun:
    """Runs points into a claimed folder (one record each as it finishes) and keeps what
    the folder holds: ``records`` by digest, ``ran`` this time."""

    folder: ResultsFolder
    reader: TraceReader
    runner: Runner
    keep_runs: bool = False
    quiet: bool = False
    label: str = "sweep"
    meanwhile: Meanwhile = None
    records: dict[str, PointRecord] = attrs.Factory(dict)
    ran: int = 0

    def load(self, overwrite: bool) -> None:
        """The folder's records of earlier runs (none with ``overwrite``)."""
        self.records = {} if overwrite else read_records(self.folder.path)

    def done(self, point: Point) -> bool:
        """Whether ``point`` has its record (and its results folder, with keep-runs)."""
        if point.digest not in self.records:
            return False
        return not self.keep_runs or (self._run_path(point) / "summary.json").is_file()

    def run(self, points: Sequence[Point], stop: StopRequest) -> None:
        """Run the points not done; a first signal stops after the points finished."""
        todo = list({p.digest: p for p in points if not self.done(p)}.values())
        unique = len({p.digest for p in points})
        done = unique - len(todo)
        progress = count_progress(
            unique, sys.stderr, unit="point", quiet=self.quiet, done=done, label=self.label
        )
        by_digest = {p.digest: p for p in todo}

        def finished(outcome: PointOutcome) -> None:
            self._record(by_digest[outcome.digest], outcome)
            if progress is not None:
                progress.advance()

        try:
            with stop.deferred() as event:
                self.runner(self._tasks(todo), finished, event, self.meanwhile)
        finally:
            if progress is not None:
                progress.close()

    def _tasks(self, todo: Sequence[Point]) -> Iterator[PointTask]:
        for point in todo:  # prepared as they are handed out: few in memory at once
            requests = self.reader.requests(point.trace, point.config)
            yield PointTask(point.digest, requests, point.config, self.keep_runs)

    def _record(self, point: Point, outcome: PointOutcome) -> None:
        if self.keep_runs:
            self._keep(point, outcome)
        record = PointRecord(point.digest, point.trace.label, point.settings, outcome.summary)
        self.folder.put_into(RECORDS, f"{point.digest}.json", record.to_json())
        self.records[point.digest] = record
        self.ran += 1

    def _run_path(self, point: Point) -> Any:
        return self.folder.path / RUNS / point.digest

    def _keep(self, point: Point, outcome: PointOutcome) -> None:
        """The point's results folder, ``runs/<digest>/``, as ``stepplan simulate``
        writes one."""
        if RUNS not in self.folder.entries:
            self.folder.record([*self.folder.entries, RUNS], complete=False)
        (self.folder.path / RUNS).mkdir(exist_ok=True)
        result = SimResult(outcome.steps, outcome.requests, np.zeros(0), outcome.summary)
        result = with_provenance(result, provenance(None, dict(point.identity), point.config))
        path = self._run_path(point)
        with ResultsFolder.claim(path, overwrite=True, names=RESULT_FILES) as run:
            write_results(result, run)
