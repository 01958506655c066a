"""Request traces: every supported file format into one :class:`RequestTable`.

Formats (``FORMATS``; detected from the header line or the first JSON keys):

=============== ======= ==========================================================
name            kind    columns / keys used
=============== ======= ==========================================================
azure           CSV     ``TIMESTAMP`` (wall clock), ``ContextTokens``, ``GeneratedTokens``
burstgpt        CSV     ``Timestamp`` (s), ``Request tokens``, ``Response tokens``
vidur           CSV     ``arrived_at`` (s), ``num_prefill_tokens``, ``num_decode_tokens``
lengths         CSV     a prompt-length and an output-length column, no arrival time
                        (``num_prefill_tokens``/``num_decode_tokens``,
                        ``input_tokens``/``output_tokens``, ...); arrivals come from
                        the workload's ``rate`` (Poisson) or are all at 0
mooncake        JSONL   ``timestamp`` (ms), ``input_length``, ``output_length``,
                        optional ``hash_ids`` (one id per 512-token prefix block)
llmservingsim   JSONL   ``arrival_time_ns``, ``input_toks``, ``output_toks``
=============== ======= ==========================================================

Arrival times are shifted so the first request arrives at 0 and sorted (stable).
Rows with zero prompt or output tokens (BurstGPT logs failed requests that way) are
dropped and counted in :attr:`RequestTable.skipped`; anything else malformed is a
:class:`TraceError` naming the file and line.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np

FORMATS = ("azure", "burstgpt", "vidur", "lengths", "mooncake", "llmservingsim")

_LENGTH_COLUMNS = (
    ("num_prefill_tokens", "num_decode_tokens"),
    ("input_tokens", "output_tokens"),
    ("prompt_tokens", "output_tokens"),
    ("input_length", "output_length"),
    ("prompt_len", "output_len"),
)


class TraceError(ValueError):
    """A trace can't be read; the message starts with ``file:line:``."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@attrs.frozen(eq=False)
class RequestTable:
    """Requests sorted by arrival.

    Attributes:
        arrival_s: ``[N], float64`` arrival times, non-decreasing, the first at 0
            (unless a window or slice moved it).
        prompt_tokens: ``[N], int64`` prompt lengths, ``>= 1``.
        output_tokens: ``[N], int64`` output lengths, ``>= 1``.
        prefix_offsets: ``[N + 1], int64`` offsets into :attr:`prefix_blocks`, or ``None``.
        prefix_blocks: ``[sum], int64`` prefix-block ids of every request, or ``None``.
        source: where the requests came from (a path or a synthetic spec).
        format: one of :data:`FORMATS`, or ``synthetic``.
        skipped: rows dropped for a zero prompt or output length.
    """

    arrival_s: np.ndarray = attrs.field(converter=lambda v: _frozen(np.array(v, np.float64)))
    prompt_tokens: np.ndarray = attrs.field(converter=lambda v: _frozen(np.array(v, np.int64)))
    output_tokens: np.ndarray = attrs.field(converter=lambda v: _frozen(np.array(v, np.int64)))
    prefix_offsets: np.ndarray | None = None
    prefix_blocks: np.ndarray | None = None
    source: str = ""
    format: str = ""
    skipped: int = 0

    def __attrs_post_init__(self) -> None:
        n = self.arrival_s.shape[0]
        if self.prompt_tokens.shape != (n,) or self.output_tokens.shape != (n,):
            raise ValueError("arrival_s, prompt_tokens and output_tokens must be [N] each")
        if n and (np.diff(self.arrival_s) < 0).any():
            raise ValueError("arrival_s must be sorted")
        if n and min(self.prompt_tokens.min(), self.output_tokens.min()) < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")

    @property
    def num_requests(self) -> int:
        """``N``."""
        return int(self.arrival_s.shape[0])

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if self.num_requests else 0.0

    def take(self, index: np.ndarray) -> RequestTable:
        """The requests at sorted positions ``index`` (``[M], int64``, increasing)."""
        offsets, blocks = self.prefix_offsets, self.prefix_blocks
        if offsets is not None and blocks is not None:
            lengths = np.diff(offsets)[index]
            starts = offsets[:-1][index]
            pieces = [blocks[s : s + n] for s, n in zip(starts, lengths, strict=True)]
            blocks = _frozen(np.concatenate([np.zeros(0, np.int64), *pieces]))
            offsets = _frozen(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        return attrs.evolve(
            self,
            arrival_s=self.arrival_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            prefix_offsets=offsets,
            prefix_blocks=blocks,
        )

    def limit(self, count: int) -> RequestTable:
        """The first ``count`` requests."""
        return self.take(np.arange(min(count, self.num_requests)))

    def window(self, start_s: float | None, end_s: float | None) -> RequestTable:
        """Requests arriving in ``[start_s, end_s)``, shifted so ``start_s`` becomes 0."""
        low = -np.inf if start_s is None else start_s
        high = np.inf if end_s is None else end_s
        kept = self.take(np.flatnonzero((self.arrival_s >= low) & (self.arrival_s < high)))
        shift = 0.0 if start_s is None else start_s
        return attrs.evolve(kept, arrival_s=kept.arrival_s - shift)

    def scale_rate(self, factor: float) -> RequestTable:
        """Arrivals ``factor`` times as dense (inter-arrival gaps divided by ``factor``)."""
        if factor <= 0:
            raise ValueError(f"rate scale must be positive, got {factor}")
        return attrs.evolve(self, arrival_s=self.arrival_s / factor)


# ----------------------------------------------------------------------------- reading


@attrs.frozen
class _Rows:
    """Parsed rows before sorting: parallel lists plus optional prefix ids."""

    arrival: list[float]
    prompt: list[int]
    output: list[int]
    prefix: list[list[int]] | None


def _integer(path: Path, line: int, name: str, text: object) -> int:
    try:
        value = int(text) if not isinstance(text, float) or text.is_integer() else None
    except (TypeError, ValueError):
        value = None
    if value is None or isinstance(text, bool) or value < 0:
        raise TraceError(path, line, f"{name}: {text!r} is not a non-negative integer")
    return value


def _number(path: Path, line: int, name: str, text: object) -> float:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = float("nan")
    if not np.isfinite(value) or isinstance(text, bool):
        raise TraceError(path, line, f"{name}: {text!r} is not a number")
    return value


def _wall_clock(path: Path, line: int, text: str) -> tuple[int, float]:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` (any fraction digits) as (day ordinal, second of
    day); kept apart so differences keep sub-microsecond precision."""
    try:
        day, _, clock = text.strip().replace("T", " ").partition(" ")
        hours, minutes, seconds = clock.split(":")
        ordinal = dt.date.fromisoformat(day).toordinal()
        return ordinal, int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        raise TraceError(path, line, f"TIMESTAMP: {text!r} is not a date and time") from None


def _csv_rows(path: Path, handle: Iterator[str]) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(handle)
    for row in reader:
        line = reader.line_num
        if None in row or None in row.values():
            raise TraceError(path, line, f"expected {len(reader.fieldnames or [])} columns")
        yield line, row


def _read_csv(
    path: Path, handle: Iterator[str], fmt: str, columns: tuple[str, str, str | None]
) -> _Rows:
    rows = _Rows([], [], [], None)
    prompt_col, output_col, time_col = columns
    first_day = None
    for line, row in _csv_rows(path, handle):
        if fmt == "azure":
            day, second = _wall_clock(path, line, row[time_col])
            first_day = day if first_day is None else first_day
            arrival = (day - first_day) * 86400.0 + second
        elif time_col is not None:
            arrival = _number(path, line, time_col, row[time_col])
        else:
            arrival = 0.0
        rows.arrival.append(arrival)
        rows.prompt.append(_integer(path, line, prompt_col, row[prompt_col]))
        rows.output.append(_integer(path, line, output_col, row[output_col]))
    return rows


def _csv_columns(fmt: str, header: list[str]) -> tuple[str, str, str | None]:
    if fmt == "azure":
        return "ContextTokens", "GeneratedTokens", "TIMESTAMP"
    if fmt == "burstgpt":
        return "Request tokens", "Response tokens", "Timestamp"
    if fmt == "vidur":
        return "num_prefill_tokens", "num_decode_tokens", "arrived_at"
    for prompt, output in _LENGTH_COLUMNS:
        if prompt in header and output in header:
            return prompt, output, None
    raise ValueError("no prompt/output length columns")


_JSON_KEYS = {
    "mooncake": ("timestamp", "input_length", "output_length", 1e-3),
    "llmservingsim": ("arrival_time_ns", "input_toks", "output_toks", 1e-9),
}


def _read_jsonl(path: Path, handle: Iterator[str], fmt: str, first_line: int) -> _Rows:
    time_key, prompt_key, output_key, seconds_per_unit = _JSON_KEYS[fmt]
    rows = _Rows([], [], [], [] if fmt == "mooncake" else None)
    for line, text in enumerate(handle, start=first_line):
        if not text.strip():
            continue
        record = _json_record(path, line, text)
        for key in (time_key, prompt_key, output_key):
            if key not in record:
                raise TraceError(path, line, f"missing key {key!r}")
        rows.arrival.append(_number(path, line, time_key, record[time_key]) * seconds_per_unit)
        rows.prompt.append(_integer(path, line, prompt_key, record[prompt_key]))
        rows.output.append(_integer(path, line, output_key, record[output_key]))
        if rows.prefix is not None:
            ids = record.get("hash_ids", [])
            if not isinstance(ids, list):
                raise TraceError(path, line, "hash_ids: must be a list of integers")
            rows.prefix.append([_integer(path, line, "hash_ids", v) for v in ids])
    return rows


def _json_record(path: Path, line: int, text: str) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, line, f"not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceError(path, line, "each line must be a JSON object")
    return record


def detect_format(path: str | Path) -> str:
    """The format of ``path`` from its first non-empty line (see the module table)."""
    path = Path(path)
    with _open(path) as handle:
        first = next((text for text in handle if text.strip()), "")
    return _format_of_first_line(path, first)


def _format_of_first_line(path: Path, first: str) -> str:
    if not first:
        raise TraceError(path, None, "the trace is empty")
    if first.lstrip().startswith("{"):
        record = _json_record(path, 1, first)
        for fmt, (time_key, prompt_key, _, _) in _JSON_KEYS.items():
            if prompt_key in record and time_key in record:
                return fmt
        raise TraceError(path, 1, f"unknown JSON trace keys {sorted(record)}")
    header = next(csv.reader([first]))
    if "TIMESTAMP" in header and "ContextTokens" in header:
        return "azure"
    if "Request tokens" in header and "Response tokens" in header:
        return "burstgpt"
    if "arrived_at" in header and "num_prefill_tokens" in header:
        return "vidur"
    if any(p in header and o in header for p, o in _LENGTH_COLUMNS):
        return "lengths"
    raise TraceError(path, 1, f"unknown trace header {header}")


def _open(path: Path) -> Iterator[str]:
    try:
        return path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(path, None, f"cannot open ({exc.strerror})") from None


def _header_columns(path: Path, fmt: str, header: list[str]) -> tuple[str, str, str | None]:
    """The (prompt, output, time) columns of a ``fmt`` CSV, checked against its header."""
    try:
        columns = _csv_columns(fmt, header)
    except ValueError:
        raise TraceError(path, 1, f"no prompt/output length columns in {header}") from None
    missing = [c for c in columns if c is not None and c not in header]
    if missing:
        raise TraceError(path, 1, f"{fmt} trace needs columns {missing}, header is {header}")
    return columns


def load_trace(
    path: str | Path,
    fmt: str | None = None,
    *,
    rate: float | None = None,
    seed: int = 0,
) -> RequestTable:
    """Read a trace file into a :class:`RequestTable`.

    Args:
        path: the file.
        fmt: one of :data:`FORMATS`, or ``None`` to detect it.
        rate: requests per second for ``lengths`` traces (Poisson arrivals drawn
            with ``seed``); ``None`` puts them all at time 0.
        seed: seed of those arrivals.
    """
    path = Path(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise TraceError(path, None, f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    with _open(path) as handle:
        if fmt in _JSON_KEYS:
            rows = _read_jsonl(path, handle, fmt, 1)
        else:
            first = handle.readline()
            columns = _header_columns(path, fmt, next(csv.reader([first]), []))
            rows = _read_csv(path, _prepend(first, handle), fmt, columns)
    if fmt == "lengths" and rate is not None:
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(rows.prompt))
        rows = attrs.evolve(rows, arrival=list(np.cumsum(gaps) - gaps[0]))
    return _table(rows, str(path), fmt)


def _prepend(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _table(rows: _Rows, source: str, fmt: str) -> RequestTable:
    if not rows.prompt:
        raise TraceError(source, None, "the trace has no requests")
    arrival = np.asarray(rows.arrival, dtype=np.float64)
    prompt = np.asarray(rows.prompt, dtype=np.int64)
    output = np.asarray(rows.output, dtype=np.int64)
    keep = (prompt > 0) & (output > 0)
    order = np.flatnonzero(keep)[np.argsort(arrival[keep], kind="stable")]
    offsets = blocks = None
    if rows.prefix is not None:
        kept = [rows.prefix[i] for i in order]
        offsets = _frozen(np.cumsum([0] + [len(k) for k in kept]).astype(np.int64))
        blocks = _frozen(np.fromiter((b for k in kept for b in k), np.int64, int(offsets[-1])))
    start = arrival[order[0]] if order.size else 0.0
    return RequestTable(
        arrival_s=arrival[order] - start,
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        prefix_offsets=offsets,
        prefix_blocks=blocks,
        source=source,
        format=fmt,
        skipped=int((~keep).sum()),
    )


# ----------------------------------------------------------------------------- writing

_EPOCH = dt.datetime(2023, 11, 16)
_BURSTGPT_HEADER = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"
)


def _azure_time(seconds: float) -> str:
    stamp = _EPOCH + dt.timedelta(seconds=seconds)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"


def _columns(table: RequestTable) -> Iterator[tuple[float, int, int]]:
    return zip(
        table.arrival_s.tolist(),
        table.prompt_tokens.tolist(),
        table.output_tokens.tolist(),
        strict=True,
    )


def _csv_lines(table: RequestTable, fmt: str) -> Iterator[str]:
    rows = _columns(table)
    if fmt == "azure":
        yield "TIMESTAMP,ContextTokens,GeneratedTokens"
        yield from (f"{_azure_time(t)},{p},{o}" for t, p, o in rows)
    elif fmt == "burstgpt":
        yield _BURSTGPT_HEADER
        yield from (f"{t!r},,0,ChatGPT,{p},{o},{p + o},Conversation log" for t, p, o in rows)
    elif fmt == "vidur":
        yield "arrived_at,num_prefill_tokens,num_decode_tokens"
        yield from (f"{t!r},{p},{o}" for t, p, o in rows)
    else:
        yield "num_prefill_tokens,num_decode_tokens"
        yield from (f"{p},{o}" for _, p, o in rows)


def _jsonl_lines(table: RequestTable, fmt: str) -> Iterator[str]:
    time_key, prompt_key, output_key, seconds_per_unit = _JSON_KEYS[fmt]
    offsets, blocks = table.prefix_offsets, table.prefix_blocks
    for i, (t, p, o) in enumerate(_columns(table)):
        stamp = round(t / seconds_per_unit)
        record: dict[str, object] = {time_key: stamp, prompt_key: p, output_key: o}
        if fmt == "mooncake" and offsets is not None and blocks is not None:
            record["hash_ids"] = blocks[offsets[i] : offsets[i + 1]].tolist()
        yield json.dumps(record)


def write_trace(table: RequestTable, path: str | Path, fmt: str) -> None:
    """Write ``table`` as a ``fmt`` trace (``load_trace`` reads it back).

    Azure timestamps count from 2023-11-16 00:00; JSON timestamps are rounded to the
    format's unit (ms for Mooncake, ns for LLMServingSim).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    lines = _jsonl_lines(table, fmt) if fmt in _JSON_KEYS else _csv_lines(table, fmt)
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, path)  # readers never see a half-written trace
