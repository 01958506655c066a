"""Where a trace's bytes come from: a file, a named pipe, ``/dev/stdin``, a process
substitution, or standard input itself (``-``). Each is read once, front to back, and its
bytes are hashed as they pass, so that a run's provenance names what it read without a
second read (which a pipe could not give).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .request_table import TraceError

#: The trace argument that means standard input, as Unix tools take it.
STDIN = "-"
#: How messages and the summary name standard input.
STDIN_NAME = "<stdin>"
_BLOCK = 1 << 20


def shown_name(path: str | Path) -> str:
    """How messages name the trace ``path`` (``<stdin>`` for ``-``)."""
    return STDIN_NAME if str(path) == STDIN else str(path)


class HashedInput(io.RawIOBase):
    """A byte stream that hashes what is read through it.

    Attributes:
        size: bytes read so far.
    """

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self._stream = stream
        self._sha256 = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        count = self._stream.readinto(buffer)  # type: ignore[attr-defined]
        if count:
            self._sha256.update(memoryview(buffer)[:count])
            self.size += count
        return count or 0

    def drain(self) -> None:
        """Read what is left, for the hash only (a reader that stopped early)."""
        while block := self._stream.read(_BLOCK):
            self._sha256.update(block)
            self.size += len(block)

    @property
    def sha256(self) -> str:
        """The hex sha256 of the bytes read so far."""
        return self._sha256.hexdigest()


@contextlib.contextmanager
def open_trace(path: str | Path) -> Iterator[tuple[io.BufferedReader, HashedInput]]:
    """``path`` opened once for reading (``-``: standard input, left open after): a
    buffered stream (``peek`` works on pipes too) over the :class:`HashedInput` that
    counts and hashes the bytes."""
    with contextlib.ExitStack() as stack:
        stream: BinaryIO = sys.stdin.buffer
        if str(path) != STDIN:
            try:
                stream = stack.enter_context(Path(path).open("rb"))
            except OSError as exc:
                raise TraceError(path, None, f"cannot open ({exc.strerror})") from None
        hashed = HashedInput(stream)
        yield io.BufferedReader(hashed, _BLOCK), hashed
