"""What the simulating subcommands read: the trace a command names (a file, standard
input, a pipe, a synthetic spec, or the embedded trace's first requests), read once --
once per limit, rate and seed that change what is read -- its notes, and its identity
as the provenance records it."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from ..run import prepare_requests
from ..settings.config import SimConfig
from ..traces import RequestTable, TraceError, load_trace
from ..traces.source import STDIN, shown_name
from ..workloads import SYNTHETIC_PREFIX, parse_synthetic
from .provenance import trace_identity

EMBEDDED_TRACE = "data/azure_llm_2023_code.csv"
#: Requests the default run keeps of the embedded trace (its first 8.7 minutes)
#: unless ``--limit`` says otherwise; the whole trace is 8,819 requests, 57 minutes.
EMBEDDED_LIMIT = 1000


def read_trace(
    trace: str | None, fmt: str | None, config: SimConfig, limit: int | None = None
) -> RequestTable:
    """The trace ``trace`` names as read, before :func:`prepare_requests`: a file (of
    format ``fmt``, ``None``: detected; ``-``: standard input), a synthetic spec, or
    (``None``) the embedded trace's first requests; ``limit`` stops reading after that
    many requests."""
    if trace is None:
        with resources.as_file(resources.files("stepplan.sim").joinpath(EMBEDDED_TRACE)) as path:
            first = EMBEDDED_LIMIT if config.workload.limit is None else limit
            return load_trace(path, "azure", limit=first)
    if trace.startswith(SYNTHETIC_PREFIX):
        return parse_synthetic(trace, seed=config.seed, limit=limit)
    return load_trace(trace, fmt, rate=config.workload.rate, seed=config.seed, limit=limit)


def read_limit(config: SimConfig) -> int | None:
    """Requests a run reads of its trace: ``workload.limit``, unless a window
    (``workload.start_s``/``end_s``) needs every row's time."""
    workload = config.workload
    return workload.limit if workload.start_s is None and workload.end_s is None else None


class TraceCache:
    """The traces one command has read, by what the read depended on: each is read once
    per limit (and per rate and seed where they drew its arrivals). A trace that can be
    read only once (standard input, a pipe) is refused a second, different read."""

    def __init__(self) -> None:
        self._tables: dict[tuple[Any, ...], RequestTable] = {}

    def read(
        self, trace: str | None, fmt: str | None, config: SimConfig, limit: int | None
    ) -> RequestTable:
        """:func:`read_trace`'s table, read now or earlier."""
        read = (trace, fmt, limit)
        drawn = (*read, config.workload.rate, config.seed)
        for key in (read, drawn):
            if key in self._tables:
                return self._tables[key]
        if any(key[0] == trace for key in self._tables) and not rereadable(trace):
            raise TraceError(
                shown_name(str(trace)),
                None,
                "is read once (a pipe or standard input), and this command would read it "
                "again with other settings (--limit, --rate, --seed): save it to a file",
            )
        table = read_trace(trace, fmt, config, limit)
        own_times = table.format != "synthetic" and table.arrivals == "trace"
        self._tables[read if own_times else drawn] = table  # else the rate and seed drew them
        return table


def rereadable(trace: str | None) -> bool:
    """Whether the trace ``trace`` names can be read again: the embedded trace, a
    synthetic spec or a regular file (not standard input, a pipe or a device)."""
    if trace is None or trace.startswith(SYNTHETIC_PREFIX):
        return True
    return trace != STDIN and Path(trace).is_file()


def load_requests(args: argparse.Namespace, config: SimConfig) -> RequestTable:
    """The trace ``args.trace`` names (the embedded trace's first requests when absent),
    prepared; read through ``args.traces`` (a :class:`TraceCache`) when the command
    reads it more than once."""
    cache = getattr(args, "traces", None) or TraceCache()
    table = cache.read(args.trace, args.format, config, read_limit(config))
    prepared = prepare_requests(table, config)
    for note in trace_notes(prepared, config):  # once nothing can fail: an error is one line
        print(f"stepplan: note: {note}", file=sys.stderr)
    return prepared


def trace_notes(table: RequestTable, config: SimConfig) -> list[str]:
    """What the user should know about how ``table`` was read: dropped and rejected
    requests, missing arrival times, out-of-order rows."""
    source, notes = table.source, []
    if table.skipped:
        rows = "row" if table.skipped == 1 else "rows"
        notes.append(f"{source}: dropped {table.skipped} {rows} with zero prompt or output tokens")
    if table.rejected:
        notes.append(
            f"{source}: rejected {table.rejected} request(s) longer than model.max_model_len = "
            f"{config.model.resolved().max_model_len} tokens (prompt + output)"
        )
    if table.arrivals == "none":
        notes.append(
            f"{source}: no arrival times: all requests arrive at t = 0 (--rate R "
            "gives Poisson arrivals at R req/s)"
        )
    elif table.arrivals == "poisson":
        notes.append(
            f"{source}: no arrival times: Poisson arrivals at {config.workload.rate:g} req/s "
            f"(seed {config.seed})"
        )
    elif config.workload.rate is not None and table.format != "synthetic":
        notes.append(
            f"{source}: has arrival times, so --rate is ignored (--rate-scale speeds them up)"
        )
    if table.unsorted_line is not None:
        notes.append(
            f"{source}:{table.unsorted_line}: arrives before the row above it; requests "
            "sorted by arrival time"
        )
    if table.read_to_line is not None and (notes or table.unsorted_line is not None):
        notes = [
            f"{note} (of the rows read: --limit stopped reading at line {table.read_to_line})"
            for note in notes
        ]
    return notes


def identify(trace: str | None, table: RequestTable) -> dict[str, Any]:
    """The trace ``trace`` names as the provenance records it, from ``table``, the read
    of it (which hashed its bytes)."""
    with resources.as_file(resources.files("stepplan.sim").joinpath(EMBEDDED_TRACE)) as path:
        return trace_identity(trace, table, path)
