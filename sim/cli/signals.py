"""Ctrl-C and SIGTERM: a clean stop with one line, exit code 128 + the signal.

While a simulation runs (:meth:`StopRequest.deferred`) the first signal only asks the
loop to stop: it ends before its next step, the steps so far are written as a partial
result, and then the command exits. Anywhere else, and at a second signal, the command
stops at once (:class:`Interrupted` unwinds through the results folder's clean-up).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal ended the command. Not an ``Exception``: nothing may swallow it."""

    def __init__(self, signum: int, detail: str = "") -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"stepplan: interrupted by {name}" + (f"; {detail}" if detail else ""))

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM), as shells report."""
        return 128 + self.signum


class StopRequest:
    """The signals the command received; ``event`` is what the loop checks."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._deferring = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: ask the loop to stop, or stop now."""
        if self._deferring and not self.event.is_set():
            self.signum = signum
            self.event.set()
            return
        raise Interrupted(signum, "stopped at once, nothing more written")

    @contextlib.contextmanager
    def deferred(self) -> Iterator[threading.Event]:
        """Within this block a first signal sets the event instead of raising."""
        self._deferring = True
        try:
            yield self.event
        finally:
            self._deferring = False

    def raise_if_stopped(self, detail: str) -> None:
        """Raise :class:`Interrupted` with ``detail`` when a signal came."""
        if self.signum is not None:
            raise Interrupted(self.signum, detail)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Route SIGINT and SIGTERM to a :class:`StopRequest` for the block (main thread
    only; elsewhere Python's own handling stays), restoring the old handlers after."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {signum: signal.signal(signum, request.handle) for signum in SIGNALS}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
