"""The trace-format table: one :class:`TraceFormat` entry per format.

An entry says how the format is laid out (CSV, TSV or JSON Lines), which columns
(CSV header names or JSON keys) hold the arrival time and the prompt and output
lengths, how its clock counts, and what the writer puts in the other columns. The
reader and the writer (``reading.py``, ``writing.py``) are generic over entries, so a
new format is one entry here plus its round-trip and bad-line tests.

Detection (:func:`detect`) picks the first entry whose columns a header holds,
entries with an arrival time first and the file's own layout first among them; names
match without regard to case or surrounding spaces, in any order, among any other
columns.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Collection
from typing import Any

import attrs

#: ``layout`` values; ``csv`` and ``tsv`` are both read as delimited text (the
#: delimiter is sniffed from the header), the layout only decides what is written.
LAYOUTS = ("csv", "tsv", "jsonl")
_DAY_S = 86400
_EPOCH = dt.datetime(2023, 11, 16)  # where written wall clocks start


def _number(value: object) -> float:
    """A finite number from a JSON number or CSV text; ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError("is not a number")
    try:
        number = float(value.strip() if isinstance(value, str) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError("is not a number") from None
    if not math.isfinite(number):
        raise ValueError("is not a finite number")
    return number


@attrs.frozen
class Clock:
    """How a format stores arrival times.

    Attributes:
        unit: what the docs and errors call it (``seconds``, ..., ``wall clock``).
        parse: stored value -> ``(day, seconds)``; the day is kept apart so that
            epoch or wall-clock stamps keep sub-microsecond differences. Raises
            ``ValueError`` with the reason.
        write: seconds since the first arrival -> the stored value.
    """

    unit: str
    parse: Callable[[object], tuple[int, float]]
    write: Callable[[float], object]


def _counting(unit: str, per_second: int) -> Clock:
    """A clock that counts ``1 / per_second`` seconds; integer counts split off whole
    days exactly. A date and time in its place is read as a wall clock."""

    def parse(value: object) -> tuple[int, float]:
        if isinstance(value, int) and not isinstance(value, bool):
            day, rest = divmod(value, _DAY_S * per_second)
            return day, rest / per_second if per_second > 1 else float(rest)
        text = value.strip() if isinstance(value, str) else value
        if isinstance(text, str) and text.lstrip("-").isdecimal():
            return parse(int(text))
        try:
            number = _number(text)
        except ValueError:
            if isinstance(text, str) and ":" in text:
                return _parse_wall_clock(text)
            raise ValueError(f"is not a number of {unit} nor a date and time") from None
        return 0, number / per_second if per_second > 1 else number

    def write(seconds: float) -> object:
        return repr(seconds) if per_second == 1 else round(seconds * per_second)

    return Clock(unit, parse, write)


def _parse_wall_clock(value: object) -> tuple[int, float]:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` (any fraction digits, ``T`` or a space, an
    optional ``Z`` or ``+HH:MM`` offset) as (day ordinal, second of the UTC day);
    a plain number is seconds."""
    text = str(value).strip().removesuffix("Z").replace("T", " ")
    day, _, clock = text.partition(" ")
    offset = re.search(r"([+-])(\d\d):?(\d\d)$", clock)
    try:
        if not clock and not isinstance(value, bool):
            return 0, _number(value)
        ordinal = dt.date.fromisoformat(day).toordinal()
        hours, minutes, seconds = clock[: offset.start() if offset else None].split(":")
        second = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        raise ValueError("is not a date and time (YYYY-MM-DD HH:MM:SS.fff)") from None
    if offset:
        sign = 1 if offset[1] == "+" else -1
        second -= sign * (int(offset[2]) * 3600 + int(offset[3]) * 60)
    return ordinal, second


def _write_wall_clock(seconds: float) -> str:
    stamp = _EPOCH + dt.timedelta(seconds=seconds)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"


SECONDS = _counting("seconds", 1)
MILLISECONDS = _counting("milliseconds", 1000)
NANOSECONDS = _counting("nanoseconds", 10**9)
WALL_CLOCK = Clock("wall clock", _parse_wall_clock, _write_wall_clock)


@attrs.frozen
class TraceFormat:
    """One trace format: its detector, columns, clock (the parser) and writer.

    Attributes:
        name: what ``--format`` and ``RequestTable.format`` call it.
        layout: one of :data:`LAYOUTS`, how the writer lays it out.
        time: the arrival-time column, or ``None`` for a format without arrival times.
        clock: how :attr:`time` counts (``None`` with it).
        lengths: ``(prompt, output)`` column pairs the reader accepts; the writer
            writes the first.
        header: the columns the writer writes, in order; ``time``, the first
            ``lengths`` pair and ``prefix`` are filled from the table, the rest by
            ``fill``.
        fill: ``(prompt, output) -> {column: value}`` for the writer's other columns.
        prefix: the column of the prefix-block ids (a JSON list), or ``None``.
    """

    name: str
    layout: str = attrs.field(validator=attrs.validators.in_(LAYOUTS))
    time: str | None
    clock: Clock | None
    lengths: tuple[tuple[str, str], ...]
    header: tuple[str, ...] = ()
    fill: Callable[[int, int], dict[str, Any]] | None = None
    prefix: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.header:
            prompt, output = self.lengths[0]
            columns = (self.time, prompt, output, self.prefix)
            object.__setattr__(self, "header", tuple(c for c in columns if c is not None))

    def columns(self, names: Collection[str]) -> tuple[str | None, str, str] | None:
        """``(time, prompt, output)`` as spelt in ``names`` (a header or a record's
        keys), or ``None`` when ``names`` lacks this format's columns."""
        spelt = {_key(name): name for name in names}
        time = spelt.get(_key(self.time)) if self.time is not None else None
        if self.time is not None and time is None:
            return None
        for prompt, output in self.lengths:
            if _key(prompt) in spelt and _key(output) in spelt:
                return time, spelt[_key(prompt)], spelt[_key(output)]
        return None

    def row(self, arrival_s: float, prompt: int, output: int, blocks: list[int]) -> list[Any]:
        """The values of one request, in :attr:`header` order."""
        values = self.fill(prompt, output) if self.fill is not None else {}
        if self.time is not None and self.clock is not None:
            values[self.time] = self.clock.write(arrival_s)
        values[self.lengths[0][0]], values[self.lengths[0][1]] = prompt, output
        if self.prefix is not None:
            values[self.prefix] = blocks
        return [values[column] for column in self.header]


def _key(name: str) -> str:
    return name.strip().lower()


def _burstgpt_fill(prompt: int, output: int) -> dict[str, Any]:
    return {
        "Session ID": "",
        "Elapsed time": 0,
        "Model": "ChatGPT",
        "Total tokens": prompt + output,
        "Log Type": "Conversation log",
    }


_BURSTGPT_HEADER = (
    "Timestamp",
    "Session ID",
    "Elapsed time",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)
_LLMSERVINGSIM = ("input_toks", "output_toks", "arrival_time_ns")
_LENGTH_PAIRS = (
    ("num_prefill_tokens", "num_decode_tokens"),
    ("input_tokens", "output_tokens"),
    ("prompt_tokens", "output_tokens"),
    ("prompt_tokens", "completion_tokens"),
    ("input_length", "output_length"),
    ("prompt_len", "output_len"),
    ("input_toks", "output_toks"),
    ("ContextTokens", "GeneratedTokens"),
    ("Request tokens", "Response tokens"),
)

#: Every format, in detection order within each kind (see the module docstring).
TABLE: tuple[TraceFormat, ...] = (
    TraceFormat("azure", "csv", "TIMESTAMP", WALL_CLOCK, (("ContextTokens", "GeneratedTokens"),)),
    TraceFormat(
        "burstgpt",
        "csv",
        "Timestamp",
        SECONDS,
        (("Request tokens", "Response tokens"),),
        header=_BURSTGPT_HEADER,
        fill=_burstgpt_fill,
    ),
    TraceFormat(
        "vidur", "csv", "arrived_at", SECONDS, (("num_prefill_tokens", "num_decode_tokens"),)
    ),
    TraceFormat("lengths", "csv", None, None, _LENGTH_PAIRS),
    TraceFormat(
        "mooncake",
        "jsonl",
        "timestamp",
        MILLISECONDS,
        (("input_length", "output_length"),),
        prefix="hash_ids",
    ),
    TraceFormat(
        "llmservingsim",
        "jsonl",
        "arrival_time_ns",
        NANOSECONDS,
        (("input_toks", "output_toks"),),
        header=_LLMSERVINGSIM,
    ),
    TraceFormat(
        "llmservingsim-tsv",
        "tsv",
        "arrival_time_ns",
        NANOSECONDS,
        (("input_toks", "output_toks"),),
        header=_LLMSERVINGSIM,
    ),
)

FORMATS: tuple[str, ...] = tuple(entry.name for entry in TABLE)
BY_NAME: dict[str, TraceFormat] = {entry.name: entry for entry in TABLE}


def detect(names: Collection[str], json_lines: bool) -> TraceFormat | None:
    """The format whose columns ``names`` holds (see the module docstring), or ``None``."""

    def rank(entry: TraceFormat) -> tuple[bool, bool]:
        return entry.time is None, (entry.layout == "jsonl") != json_lines

    return next((e for e in sorted(TABLE, key=rank) if e.columns(names) is not None), None)
