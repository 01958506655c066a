"""Progress of a simulation: a bar on a terminal, a periodic line elsewhere (logs, CI),
and the rough length of a live run, said before it starts."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol, TextIO

import numpy as np
from tqdm import tqdm

from .settings.config import SimConfig
from .traces import RequestTable

#: Seconds between progress lines when the stream is not a terminal.
LINE_EVERY_S = 5.0
_BAR_EVERY = 512  # steps between progress-bar refreshes
#: Rough live-mode speed, steps per second, by (backend, device): the reference backend
#: on a 2-core CPU did about 250, Triton there (interpreted) about 0.03; a GPU is taken
#: as a few times the CPU. Only for the warning: an estimate, not a measurement.
LIVE_STEPS_PER_S = {("reference", "cpu"): 250.0, ("triton", "cpu"): 0.03}
_LIVE_GPU_STEPS_PER_S = 1000.0
_ROUGH_STEP_S = 0.02  # simulated time of a decode step, for the number running at once
#: A live run expected to take longer than this is announced with its estimate.
LIVE_WARN_S = 60.0


class _Bar(tqdm):
    """tqdm without its monitor thread (it only retunes bars that update rarely):
    a sweep forks its workers only from a process of one thread."""

    monitor_interval = 0


class Progress(Protocol):
    """What :func:`stepplan.sim.run.simulate` reports after every step."""

    def update(self, steps: int, finished: int, clock_s: float) -> None:
        """``steps`` simulated, ``finished`` requests, the simulated clock in s."""

    def close(self) -> None:
        """The run is over (finished or stopped)."""


class ProgressBar:
    """A tqdm bar of finished requests, for a terminal."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self._bar = _Bar(total=total, unit="req", leave=False, file=stream)

    def update(self, steps: int, finished: int, clock_s: float) -> None:
        """Refresh every few hundred steps."""
        if steps % _BAR_EVERY == 0:
            self._bar.update(finished - self._bar.n)

    def close(self) -> None:
        """Remove the bar."""
        self._bar.close()


class ProgressLines:
    """One line every ``every_s`` seconds of wall time (``clock`` reads it), for a
    stream that is not a terminal; a first line when the loop starts (saying that
    Ctrl-C keeps the steps so far when the run is ``stoppable``)."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        label: str = "",
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        stoppable: bool = True,
    ) -> None:
        self._total, self._stream, self._label = total, stream, label
        self._stoppable = stoppable
        self._every_s, self._clock = every_s, clock
        self._start: float | None = None
        self._next = 0.0

    def update(self, steps: int, finished: int, clock_s: float) -> None:
        """Print a line when ``every_s`` has passed since the last one."""
        now = self._clock()
        if self._start is None:
            self._start, self._next = now, now + self._every_s
            hint = " (Ctrl-C stops early and keeps the steps so far)" if self._stoppable else ""
            self._print(f"simulating {self._total:,} requests{hint}")
            return
        if now < self._next:
            return
        self._next = now + self._every_s
        self._print(
            f"{steps:,} steps, {finished:,}/{self._total:,} requests finished, "
            f"simulated {clock_s:,.1f} s, elapsed {now - self._start:,.0f} s"
        )

    def close(self) -> None:
        """Nothing to tidy: every line is complete."""

    def _print(self, text: str) -> None:
        prefix = f"stepplan: {self._label}: " if self._label else "stepplan: "
        print(prefix + text, file=self._stream, flush=True)


def estimate_steps(table: RequestTable, config: SimConfig) -> int:
    """A rough step count: prefill chunks at the token budget, then decode steps of as
    many requests as run at once (Little's law with :data:`_ROUGH_STEP_S` a step, within
    ``max_num_seqs``), drafts accepted half the time. The whole embedded trace: about
    100,000 against its 39,777 steps; within a few times, which is all a warning needs."""
    scheduler = config.scheduler
    prompt, output = table.prompt_tokens.astype(np.float64), table.output_tokens.astype(np.float64)
    per_step = 1.0 + 0.5 * scheduler.num_spec_tokens
    most = max(1, min(scheduler.max_num_seqs, table.num_requests))
    if table.span_s > 0:
        service_s = output.mean() / per_step * _ROUGH_STEP_S
        running = min(max(1.0, table.num_requests / table.span_s * service_s), most)
    else:
        running = most  # everything arrives at once
    prefill = prompt.sum() / scheduler.max_num_batched_tokens
    decode = max(output.sum() / (running * per_step), output.max() / per_step)
    return math.ceil(prefill + decode)


def live_warning(table: RequestTable, config: SimConfig) -> str | None:
    """A line saying how long a live run of ``table`` may take, when that is long."""
    live = config.live
    if not live.enabled:
        return None
    if live.device == "cpu":
        speed = LIVE_STEPS_PER_S.get((live.engine_backend, "cpu"), min(LIVE_STEPS_PER_S.values()))
    else:
        speed = _LIVE_GPU_STEPS_PER_S
    steps = estimate_steps(table, config)
    seconds = steps / speed
    if seconds < LIVE_WARN_S:
        return None
    return (
        f"stepplan: live mode runs the model every step: about {steps:,} steps, roughly "
        f"{_duration(seconds)} at ~{speed:g} steps/s on {live.engine_backend}/{live.device} "
        "(an estimate); --limit N for a shorter run, Ctrl-C keeps the steps run so far"
    )


def _duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class CountProgress(Protocol):
    """Progress over a count of items (a sweep's points), as each finishes."""

    def advance(self, count: int = 1) -> None:
        """``count`` more items finished."""

    def close(self) -> None:
        """No more items."""


class CountBar:
    """A tqdm bar over items, for a terminal; ``done`` of ``total`` finished before."""

    def __init__(self, total: int, stream: TextIO, *, unit: str, done: int = 0) -> None:
        self._bar = _Bar(total=total, initial=done, unit=unit, leave=False, file=stream)

    def advance(self, count: int = 1) -> None:
        """Move the bar on."""
        self._bar.update(count)

    def close(self) -> None:
        """Remove the bar."""
        self._bar.close()


class CountLines:
    """A line when the first item finishes and then at most every ``every_s`` seconds
    (``clock`` reads the time), for a stream that is not a terminal; a last line when
    all are done. Each line says the time so far and, at the rate so far, the time
    left."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        unit: str,
        done: int = 0,
        label: str = "",
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._total, self._done, self._unit = total, done, unit
        self._stream, self._label, self._every_s, self._clock = stream, label, every_s, clock
        self._start, self._done_before = clock(), done
        self._next = self._start

    def advance(self, count: int = 1) -> None:
        """Print a line when it is time, or when the last item finished."""
        self._done += count
        now = self._clock()
        if now < self._next and self._done < self._total:
            return
        self._next = now + self._every_s
        prefix = f"stepplan: {self._label}: " if self._label else "stepplan: "
        elapsed = now - self._start
        line = f"{self._done:,}/{self._total:,} {self._unit}s done, {elapsed:,.0f} s"
        ran = self._done - self._done_before
        if ran > 0 and self._done < self._total:
            line += f", about {elapsed / ran * (self._total - self._done):,.0f} s left"
        print(prefix + line, file=self._stream, flush=True)

    def close(self) -> None:
        """Nothing to tidy: every line is complete."""


def count_progress(
    total: int,
    stream: TextIO,
    *,
    unit: str,
    quiet: bool = False,
    done: int = 0,
    label: str = "",
) -> CountProgress | None:
    """Progress over ``total`` items on ``stream``: a bar on a terminal, plain lines
    elsewhere (logs, CI, a pipe); none when ``quiet`` or nothing is left to do."""
    if quiet or total == done:
        return None
    if stream.isatty():
        return CountBar(total, stream, unit=unit, done=done)
    return CountLines(total, stream, unit=unit, done=done, label=label)
