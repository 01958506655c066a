"""Writing a :class:`RequestTable` as any format of the table (``load_trace`` reads it back)."""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

from ..results.outfile import FileKind, OutputFile
from .formats import BY_NAME, FORMATS, TraceFormat
from .request_table import RequestTable


def _requests(table: RequestTable) -> Iterator[tuple[float, int, int, list[int]]]:
    offsets, blocks = table.prefix_offsets, table.prefix_blocks
    for i, (t, p, o) in enumerate(
        zip(
            table.arrival_s.tolist(),
            table.prompt_tokens.tolist(),
            table.output_tokens.tolist(),
            strict=True,
        )
    ):
        ids = [] if offsets is None or blocks is None else blocks[offsets[i] : offsets[i + 1]]
        yield t, p, o, list(map(int, ids))


def trace_text(table: RequestTable, entry: TraceFormat) -> str:
    """The whole trace file's text in format ``entry``, with a last column ``priority``
    where the table has priorities."""
    header, rows = entry.header, (entry.row(*request) for request in _requests(table))
    if table.priority is not None:
        header = (*header, "priority")
        priorities = table.priority.tolist()
        rows = ([*row, priority] for row, priority in zip(rows, priorities, strict=True))
    if entry.layout == "jsonl":
        return "".join(json.dumps(dict(zip(header, r, strict=True))) + "\n" for r in rows)
    buffer = io.StringIO()
    writer = csv.writer(
        buffer, delimiter="\t" if entry.layout == "tsv" else ",", lineterminator="\n"
    )
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


#: A trace as one file stepplan writes: its formats are other programs', with no room for
#: a mark, so ``sim/results/outfile.py``'s rule never replaces an existing file with one.
TRACE_FILE = FileKind("a trace", lambda sample: False)


def write_trace(table: RequestTable, path: str | Path, fmt: str) -> None:
    """Write ``table`` as a ``fmt`` trace, gzip-compressed when ``path`` ends in ``.gz``,
    to a new file (:data:`TRACE_FILE`).

    Azure timestamps count from 2023-11-16 00:00; integer timestamps are rounded to
    the format's unit (ms for Mooncake, ns for LLMServingSim). The file appears whole
    or not at all.
    """
    if fmt not in BY_NAME:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    data = trace_text(table, BY_NAME[fmt]).encode()
    out = OutputFile.claim(path, TRACE_FILE)
    if Path(path).suffix == ".gz":
        data = gzip.compress(data, mtime=0)  # no timestamp: equal tables, equal bytes
    out.write(data)
