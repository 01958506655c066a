"""The requests of a trace, read-only and sorted by arrival, and the error for a bad trace."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np

#: How a table's arrival times came about (:attr:`RequestTable.arrivals`).
ARRIVALS = ("trace", "none", "poisson")


class TraceError(ValueError):
    """A trace can't be read; the message starts with ``file:line:`` (``file:`` when
    no single line is to blame)."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


def frozen(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only."""
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
        format: a trace format's name, or ``synthetic``.
        skipped: rows dropped for a zero prompt or output length.
        arrivals: ``trace`` (the file's own times), ``none`` (the file has none: all at
            0) or ``poisson`` (the file has none: drawn at a given rate).
        unsorted_line: the file's first line that arrives before the row above it (the
            table is sorted all the same), or ``None``.
        rejected: requests dropped because prompt plus output exceeds the model's
            context (:meth:`within_model_len`).
        lines: ``[N], int64`` the file line of each request, or ``None`` (a synthetic
            workload): where an error about one request points.
        read_to_line: the line reading stopped after (a read limit), or ``None`` when
            the whole trace was read: notes about the rows are then about those read.
        size_bytes, sha256: the size and sha256 of the trace's bytes (of the file as
            stored, compressed or not), or ``None`` (not read from a file).
        priority: ``[N], int64`` each request's priority (lower first, for the
            ``priority`` admission policy: ``sim/admission.py``), or ``None`` (the trace
            has no priority column).
    """

    arrival_s: np.ndarray = attrs.field(converter=lambda v: frozen(np.array(v, np.float64)))
    prompt_tokens: np.ndarray = attrs.field(converter=lambda v: frozen(np.array(v, np.int64)))
    output_tokens: np.ndarray = attrs.field(converter=lambda v: frozen(np.array(v, np.int64)))
    prefix_offsets: np.ndarray | None = None
    prefix_blocks: np.ndarray | None = None
    source: str = ""
    format: str = ""
    skipped: int = 0
    arrivals: str = attrs.field(default="trace", validator=attrs.validators.in_(ARRIVALS))
    unsorted_line: int | None = None
    rejected: int = 0
    lines: np.ndarray | None = attrs.field(default=None, eq=False)
    read_to_line: int | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    priority: np.ndarray | None = attrs.field(
        default=None, converter=lambda v: None if v is None else frozen(np.array(v, np.int64))
    )

    def __attrs_post_init__(self) -> None:
        n = self.arrival_s.shape[0]
        if self.prompt_tokens.shape != (n,) or self.output_tokens.shape != (n,):
            raise ValueError("arrival_s, prompt_tokens and output_tokens must be [N] each")
        if n and (np.diff(self.arrival_s) < 0).any():
            raise ValueError("arrival_s must be sorted")
        if n and min(self.prompt_tokens.min(), self.output_tokens.min()) < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        if self.priority is not None and self.priority.shape != (n,):
            raise ValueError("priority must be [N]")

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
            blocks = frozen(np.concatenate([np.zeros(0, np.int64), *pieces]))
            offsets = frozen(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        return attrs.evolve(
            self,
            arrival_s=self.arrival_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            prefix_offsets=offsets,
            prefix_blocks=blocks,
            lines=None if self.lines is None else frozen(self.lines[index]),
            priority=None if self.priority is None else self.priority[index],
        )

    def where(self, index: int) -> tuple[str, int | None, str]:
        """Where request ``index`` is, for a :class:`TraceError`: ``(source, line, what)``,
        the file and line of a trace's row (``what`` empty), else the source and the
        request's number."""
        if self.lines is not None:
            return self.source, int(self.lines[index]), ""
        return self.source, None, f"request {index} "

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

    def beyond_model_len(self, max_model_len: int) -> np.ndarray:
        """``[k], int64`` the requests whose prompt plus output exceeds ``max_model_len``
        tokens, in order: those vLLM rejects at arrival."""
        return np.flatnonzero(self.prompt_tokens + self.output_tokens > max_model_len)

    def within_model_len(self, max_model_len: int) -> RequestTable:
        """The requests that fit ``max_model_len`` tokens (:meth:`beyond_model_len`
        gives the others); the dropped ones add to :attr:`rejected`."""
        beyond = self.beyond_model_len(max_model_len)
        if beyond.size == 0:
            return self
        kept = self.take(np.delete(np.arange(self.num_requests), beyond))
        return attrs.evolve(kept, rejected=self.rejected + int(beyond.size))
