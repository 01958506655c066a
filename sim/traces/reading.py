"""Reading a trace: bytes -> text lines -> records -> a :class:`RequestTable`.

Bytes: gzip, bzip2 and xz files are decompressed by their magic bytes (whatever the
suffix); zip, zstd and Parquet files, Git LFS pointers and binary data are refused by
name. Text: UTF-8 (a byte-order mark is dropped) or UTF-16 with its byte-order mark;
CRLF line endings are fine. Records: the first non-blank line decides, ``{`` starts
JSON Lines, anything else is a header row of delimited text whose delimiter (comma,
tab or semicolon) is the one the header uses most. Blank rows are skipped anywhere.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import itertools
import json
import lzma
import zlib
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import numpy as np

from .formats import BY_NAME, FORMATS, TraceFormat, detect
from .request_table import RequestTable, TraceError, frozen
from .source import open_trace, shown_name

_DECOMPRESS: dict[bytes, tuple[str, Callable[[BinaryIO], BinaryIO]]] = {
    b"\x1f\x8b": ("gzip", lambda raw: gzip.GzipFile(fileobj=raw)),
    b"BZh": ("bzip2", bz2.BZ2File),
    b"\xfd7zXZ\x00": ("xz", lzma.LZMAFile),
}
_REFUSED = {
    b"PK\x03\x04": "is a zip archive, not a trace: unzip it first",
    b"\x28\xb5\x2f\xfd": "is zstd-compressed: decompress it first (zstd -d)",
    b"PAR1": "is a Parquet file: traces are read as CSV, TSV or JSON Lines",
}
_LFS = "version https://git-lfs.github.com/spec/v1"
#: The largest token count a trace may give (2**53: above it a count is no real request,
#: and sums of counts could leave int64).
MAX_TOKENS = 2**53
#: The largest block id (int64's largest value).
MAX_BLOCK_ID = 2**63 - 1
#: Arrival days (of a wall clock, or whole days of a count) further than this from day 0
#: are no time a trace can mean; spans are bounded later, by ``run.MAX_SPAN_S``.
MAX_DAYS = 2**31
_DECOMPRESS_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)


def _lines(path: str, raw: io.BufferedReader) -> Iterator[str]:
    """The text lines of the bytes ``raw`` gives, each with its line ending (see the
    module docstring); ``path`` names them in errors."""
    head = raw.peek(8)[:8]
    refused = next((why for magic, why in _REFUSED.items() if head.startswith(magic)), None)
    if refused is not None:
        raise TraceError(path, None, refused)
    kind, opener = next(
        (entry for magic, entry in _DECOMPRESS.items() if head.startswith(magic)),
        ("", lambda stream: stream),
    )
    try:
        stream = opener(raw)
        yield from _decoded(path, stream)
    except _DECOMPRESS_ERRORS as exc:
        raise TraceError(path, None, f"cannot read it as {kind or 'a file'} ({exc})") from None


def _decoded(path: str, stream: BinaryIO) -> Iterator[str]:
    if stream.peek(2)[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16, as spreadsheets save it
        try:
            yield from io.TextIOWrapper(stream, encoding="utf-16", newline="")
        except UnicodeDecodeError:
            raise TraceError(path, None, "not valid UTF-16 text") from None
        return
    for number, data in enumerate(stream, start=1):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            byte, column = data[exc.start], exc.start + 1
            raise TraceError(
                path,
                number,
                f"not UTF-8 text (byte 0x{byte:02x} at column {column}): "
                "a binary file, or a text encoding other than UTF-8",
            ) from None
        if number == 1:
            text = text.removeprefix("\ufeff")
            if text.startswith(_LFS):
                raise TraceError(
                    path, None, "is a Git LFS pointer, not the trace: run git lfs pull"
                )
        if "\x00" in text:
            raise TraceError(path, number, "a NUL byte: a binary file, not a text trace")
        yield text


@attrs.frozen
class _Source:
    """A trace's records: ``rows`` yields ``(line, record)``; ``record[key(name)]`` is
    the value of column ``name`` as spelt in ``names``."""

    names: tuple[str, ...]
    json_lines: bool
    header_line: int
    rows: Iterator[tuple[int, Any]]
    key: Callable[[str], Any]


def _source(path: str, lines: Iterator[str]) -> _Source:
    before = 0
    for first in lines:
        if first.strip():
            break
        before += 1
    else:
        raise TraceError(path, None, "the trace is empty")
    start = first.lstrip()
    if start.startswith("["):
        raise TraceError(
            path,
            before + 1,
            "a JSON array: traces are JSON Lines, one object per line (jq -c '.[]' converts it)",
        )
    if start.startswith("<"):
        raise TraceError(path, before + 1, "an HTML or XML page, not a trace")
    if start.startswith("{"):
        return _json_source(path, first, lines, before)
    return _delimited_source(path, first, lines, before)


def _json_source(path: str, first: str, lines: Iterator[str], before: int) -> _Source:
    record = _json_record(path, before + 1, first)

    def rows() -> Iterator[tuple[int, Any]]:
        yield before + 1, record
        for number, text in enumerate(lines, start=before + 2):
            if text.strip():
                yield number, _json_record(path, number, text)

    return _Source(tuple(record), True, before + 1, rows(), lambda name: name)


def _json_record(path: str, line: int, text: str) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, line, f"not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceError(path, line, "each line must be a JSON object")
    return record


def _delimited_source(path: str, first: str, lines: Iterator[str], before: int) -> _Source:
    delimiter = max(",\t;", key=first.count)  # ties: the comma
    reader = csv.reader(itertools.chain([first], lines), delimiter=delimiter)
    header = tuple(name.strip() for name in next(reader))

    def rows() -> Iterator[tuple[int, Any]]:
        width = len(header)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise TraceError(path, before + reader.line_num, f"bad CSV ({exc})") from None
            line = before + reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) < width or any(cell.strip() for cell in row[width:]):
                message = f"expected {width} columns, as the header has, got {len(row)}"
                raise TraceError(path, line, message)
            yield line, row

    return _Source(header, False, before + 1, rows(), header.index)


def _detected(path: str, source: _Source) -> TraceFormat:
    entry = detect(source.names, source.json_lines)
    if entry is None:
        what = "JSON trace keys" if source.json_lines else "trace header"
        raise TraceError(
            path,
            source.header_line,
            f"unknown {what} {list(source.names)}: no arrival "
            f"time and length columns of a known format ({', '.join(FORMATS)})",
        )
    return entry


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its header line or its first JSON object (see
    ``formats.py`` for the rule)."""
    shown = shown_name(path)
    with open_trace(path) as (raw, _), closing(_lines(shown, raw)) as lines:
        return _detected(shown, _source(shown, lines)).name


def _count(value: object, largest: int = MAX_TOKENS) -> int:
    """A non-negative integer up to ``largest`` from a JSON number or CSV text (``12``,
    ``12.0``)."""
    number: object = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if not isinstance(number, int) or isinstance(number, bool) or number < 0:
        raise ValueError("is not a non-negative integer")
    if number > largest:
        raise ValueError(f"is too large (at most {largest:,})")
    return number


def _arrival(parse: Callable[[object], tuple[int, float]]) -> Callable[[object], tuple]:
    """``parse`` of a clock, refusing a time too far from day 0 to be one."""

    def bounded(value: object) -> tuple[int, float]:
        day, second = parse(value)
        if abs(day) > MAX_DAYS:
            raise ValueError(f"is too far from any date a trace can mean (day {day:.3g})")
        return day, second

    return bounded


def _field(path: str, line: int, record: Any, key: Any, name: str, parse: Callable) -> Any:
    """``parse(record[key])``, or a :class:`TraceError` naming the line and column."""
    try:
        value = record[key]
    except (KeyError, IndexError):
        raise TraceError(path, line, f"missing key {name!r}") from None
    try:
        return parse(value)
    except ValueError as exc:
        raise TraceError(path, line, f"{name}: {value!r} {exc}") from None


def _priority(value: object) -> int:
    """A priority: an integer of at most ``2**53`` either side of 0 (``-3``, ``2.0``)."""
    text = value.strip() if isinstance(value, str) else value
    sign = 1
    if isinstance(text, str) and text.startswith("-"):
        sign, text = -1, text[1:]
    elif isinstance(text, (int, float)) and not isinstance(text, bool) and text < 0:
        sign, text = -1, -text
    try:
        return sign * _count(text)
    except ValueError:
        raise ValueError("is not an integer priority") from None


def _block_ids(value: object) -> list[int]:
    if not isinstance(value, list):
        raise ValueError("must be a list of integers")
    return [_count(v, MAX_BLOCK_ID) for v in value]


@attrs.define
class _Rows:
    """Parsed rows in file order (parallel lists)."""

    day: list[int] = attrs.Factory(list)
    second: list[float] = attrs.Factory(list)
    prompt: list[int] = attrs.Factory(list)
    output: list[int] = attrs.Factory(list)
    line: list[int] = attrs.Factory(list)
    prefix: list[list[int]] | None = None
    priority: list[int] | None = None  # the trace's priority column, where it has one
    kept: int = 0  # rows with tokens, counted only while a limit is to stop the parse
    stopped_at: int | None = None  # the line the parse stopped after (a limit reached)


def _parse(path: str, source: _Source, entry: TraceFormat, limit: int | None = None) -> _Rows:
    columns = entry.columns(source.names)
    if columns is None:
        needed = [c for c in (entry.time, *entry.lengths[0]) if c is not None]
        raise TraceError(
            path,
            source.header_line,
            f"{entry.name} trace needs columns {needed}, header is {list(source.names)}",
        )
    time, prompt, output = columns
    prefix = None
    if entry.prefix is not None and source.json_lines:
        spelt = {name.strip().lower(): name for name in source.names}
        prefix = spelt.get(entry.prefix.lower(), entry.prefix)
    rows = _Rows(prefix=[] if prefix is not None else None)
    key = source.key
    priority = next((name for name in source.names if name.strip().lower() == "priority"), None)
    priority_key = key(priority) if priority is not None else None
    if priority is not None:
        rows.priority = []
    time_key, prompt_key, output_key = (key(time) if time else None), key(prompt), key(output)
    for line, record in source.rows:
        if time_key is not None and entry.clock is not None:
            day, second = _field(path, line, record, time_key, time, _arrival(entry.clock.parse))
            rows.day.append(day)
            rows.second.append(second)
        rows.prompt.append(_field(path, line, record, prompt_key, prompt, _count))
        rows.output.append(_field(path, line, record, output_key, output, _count))
        rows.line.append(line)
        if rows.prefix is not None:  # a record without the key has no prefix blocks
            ids = _field(path, line, record, prefix, prefix, _block_ids) if prefix in record else []
            rows.prefix.append(ids)
        if rows.priority is not None:
            rows.priority.append(_field(path, line, record, priority_key, priority, _priority))
        if limit is not None and rows.prompt[-1] and rows.output[-1]:
            rows.kept += 1
            if rows.kept >= limit:
                rows.stopped_at = line
                break
    return rows


def load_trace(
    path: str | Path,
    fmt: str | None = None,
    *,
    rate: float | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> RequestTable:
    """Read a trace into a :class:`RequestTable` (see the package docstring), in one
    pass: a file, a pipe, or standard input (``-``); the bytes are hashed on the way
    (:attr:`RequestTable.sha256`), the whole input even when ``limit`` stops the parse.

    Args:
        path: the file (``-``: standard input).
        fmt: one of :data:`FORMATS`, or ``None`` to detect it.
        rate: requests per second for a trace without arrival times (Poisson
            arrivals drawn with ``seed``); ``None`` puts them all at time 0.
        seed: seed of those arrivals.
        limit: stop after this many requests (rows with tokens; ``None``: all). The rows
            read are then all the table knows of (:attr:`RequestTable.read_to_line`).
    """
    shown = shown_name(path)
    if fmt is not None and fmt not in BY_NAME:
        raise TraceError(shown, None, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    with open_trace(path) as (raw, hashed):
        with closing(_lines(shown, raw)) as lines:
            source = _source(shown, lines)
            entry = BY_NAME[fmt] if fmt is not None else _detected(shown, source)
            rows = _parse(shown, source, entry, limit)
        hashed.drain()
    table = _table(shown, rows, entry, rate, seed)
    return attrs.evolve(table, size_bytes=hashed.size, sha256=hashed.sha256)


def _arrivals(rows: _Rows, entry: TraceFormat, rate: float | None, seed: int) -> np.ndarray:
    """``[n], float64`` arrival times in file order."""
    if entry.time is not None:
        day = np.asarray(rows.day, dtype=np.int64)
        return (day - day[0]) * 86400.0 + np.asarray(rows.second, dtype=np.float64)
    if rate is not None:
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(rows.prompt))
        return np.cumsum(gaps) - gaps[0]
    return np.zeros(len(rows.prompt))


def _table(
    path: str, rows: _Rows, entry: TraceFormat, rate: float | None, seed: int
) -> RequestTable:
    count = len(rows.prompt)
    if count == 0:
        raise TraceError(path, None, "the trace has no requests (a header and no rows)")
    arrival = _arrivals(rows, entry, rate, seed)
    prompt = np.asarray(rows.prompt, dtype=np.int64)
    output = np.asarray(rows.output, dtype=np.int64)
    kept = np.flatnonzero((prompt > 0) & (output > 0))
    if kept.size == 0:
        every = "its one row has" if count == 1 else f"all {count} rows have"
        raise TraceError(path, None, f"{every} zero prompt or output tokens")
    late = np.flatnonzero(np.diff(arrival[kept]) < 0)
    order = kept[np.argsort(arrival[kept], kind="stable")]
    offsets = blocks = None
    if rows.prefix is not None:
        chosen = [rows.prefix[i] for i in order]
        offsets = frozen(np.cumsum([0] + [len(c) for c in chosen]).astype(np.int64))
        blocks = frozen(np.fromiter((b for c in chosen for b in c), np.int64, int(offsets[-1])))
    no_times = "poisson" if rate is not None else "none"
    return RequestTable(
        arrival_s=arrival[order] - arrival[order[0]],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        prefix_offsets=offsets,
        prefix_blocks=blocks,
        source=str(path),
        format=entry.name,
        skipped=count - kept.size,
        arrivals="trace" if entry.time is not None else no_times,
        unsorted_line=rows.line[kept[late[0] + 1]] if late.size else None,
        lines=frozen(np.asarray(rows.line, dtype=np.int64)[order]),
        read_to_line=rows.stopped_at,
        priority=None if rows.priority is None else np.asarray(rows.priority, np.int64)[order],
    )
