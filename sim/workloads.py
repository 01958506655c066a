"""Synthetic workloads: arrival processes and length distributions as a :class:`RequestTable`.

A workload is written as one spec string (the ``TRACE`` argument of the CLI)::

    synthetic:n=1000,rate=4,cv2=1,prompt=uniform:128:2048,output=zipf:1.2:1024

``n`` requests arrive at ``rate`` per second with gamma-distributed gaps of squared
coefficient of variation ``cv2`` (burstiness: 1 is Poisson, above 1 burstier, below 1
smoother). Lengths are ``fixed:N``, ``uniform:LOW:HIGH`` (inclusive), ``zipf:A:MAX``
(``P(x) ~ x**-A`` on ``1..MAX``) or ``empirical:PATH`` (resampled from that trace's
prompt or output column). ``priority=LEVELS`` gives each request a priority drawn
uniformly from ``0..LEVELS-1`` (for the ``priority`` admission policy; none without it).
"""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import numpy as np

from .traces import RequestTable, load_trace
from .traces.reading import MAX_TOKENS

LENGTH_KINDS = ("fixed", "uniform", "zipf", "empirical")
SYNTHETIC_PREFIX = "synthetic:"
#: The most requests a synthetic workload may have (about 30 GB of simulation state).
MAX_REQUESTS = 10**8
#: The longest length a distribution may give (the trace reader's bound).
MAX_LENGTH = MAX_TOKENS
#: The largest ``MAX`` of ``zipf:A:MAX`` (its probability table is that long).
MAX_ZIPF = 10**7


class WorkloadError(ValueError):
    """A synthetic workload spec is malformed; the message names the field."""


def arrival_times(count: int, rate: float, cv2: float, rng: np.random.Generator) -> np.ndarray:
    """``[count], float64`` arrival times starting at 0: gamma gaps of mean ``1 / rate``
    and squared coefficient of variation ``cv2`` (``cv2 == 1`` is a Poisson process)."""
    if not (0 < rate < math.inf and 0 < cv2 < math.inf):
        raise WorkloadError(
            f"rate and cv2 must be positive finite numbers, got rate={rate}, cv2={cv2}"
        )
    shape = 1.0 / cv2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), count)
    gaps[:1] = 0.0
    return np.cumsum(gaps)


@attrs.frozen
class LengthDist:
    """A token-length distribution.

    Attributes:
        kind: one of :data:`LENGTH_KINDS`.
        params: ``fixed``: (n,); ``uniform``: (low, high); ``zipf``: (a, max).
        values: ``[M], int64`` samples of ``empirical`` (empty otherwise).
    """

    kind: str
    params: tuple[float, ...] = ()
    values: np.ndarray = attrs.field(factory=lambda: np.zeros(0, np.int64), eq=False)

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``[count], int64`` lengths, each ``>= 1``."""
        if self.kind == "fixed":
            return np.full(count, int(self.params[0]), dtype=np.int64)
        if self.kind == "uniform":
            low, high = (int(p) for p in self.params)
            return rng.integers(low, high + 1, count, dtype=np.int64)
        if self.kind == "zipf":
            exponent, largest = self.params
            weights = np.arange(1, int(largest) + 1, dtype=np.float64) ** -exponent
            cdf = np.cumsum(weights) / weights.sum()
            return np.searchsorted(cdf, rng.random(count), side="right").astype(np.int64) + 1
        return rng.choice(self.values, count).astype(np.int64)


def parse_length(text: str, column: str) -> LengthDist:
    """A :class:`LengthDist` from ``kind:arg[:arg]``; ``column`` (``prompt`` or
    ``output``) picks the trace column an ``empirical`` distribution resamples."""
    kind, _, rest = text.partition(":")
    if kind == "empirical":
        table = load_trace(Path(rest))
        values = table.prompt_tokens if column == "prompt" else table.output_tokens
        return LengthDist("empirical", (), np.asarray(values))
    arity = {"fixed": 1, "uniform": 2, "zipf": 2}
    if kind not in arity:
        raise WorkloadError(f"{column}: unknown length kind {kind!r} (known: {LENGTH_KINDS})")
    try:
        params = tuple(float(v) for v in rest.split(":")) if rest else ()
    except ValueError:
        raise WorkloadError(f"{column}: {text!r} has a non-numeric parameter") from None
    if not all(math.isfinite(p) for p in params):
        raise WorkloadError(f"{column}: {text!r} has a parameter that is not a finite number")
    if len(params) != arity[kind]:
        raise WorkloadError(f"{column}: {kind} takes {arity[kind]} parameter(s), got {text!r}")
    low = params[0] if kind != "zipf" else 1
    high = params[-1]
    if low < 1 or high < low or (kind == "zipf" and params[0] <= 0):
        raise WorkloadError(f"{column}: {text!r} must give lengths >= 1 with low <= high")
    largest = MAX_ZIPF if kind == "zipf" else MAX_LENGTH
    if high > largest:
        raise WorkloadError(f"{column}: {text!r} gives lengths above {largest:,}")
    return LengthDist(kind, params)


def synthetic_table(
    count: int,
    rate: float,
    prompt: LengthDist,
    output: LengthDist,
    *,
    cv2: float = 1.0,
    seed: int = 0,
    source: str = "synthetic",
    priority_levels: int | None = None,
) -> RequestTable:
    """``count`` synthetic requests (see the module docstring); same seed, same table."""
    # a fourth stream for the priorities leaves the first three as they were
    arrival_rng, prompt_rng, output_rng, priority_rng = np.random.default_rng(seed).spawn(4)
    priority = None
    if priority_levels is not None:
        priority = priority_rng.integers(0, priority_levels, count, dtype=np.int64)
    return RequestTable(
        arrival_s=arrival_times(count, rate, cv2, arrival_rng),
        prompt_tokens=prompt.sample(count, prompt_rng),
        output_tokens=output.sample(count, output_rng),
        source=source,
        format="synthetic",
        priority=priority,
    )


def parse_synthetic(spec: str, seed: int = 0, limit: int | None = None) -> RequestTable:
    """The table of a ``synthetic:key=value,...`` spec (keys ``n``, ``rate``, ``cv2``,
    ``prompt``, ``output``, ``priority``; defaults ``n=1000, rate=4, cv2=1,
    prompt=uniform:128:2048, output=uniform:16:512``, no priorities); with ``limit``,
    only its first ``limit`` requests (each draw is a stream of its own, so they are the
    whole workload's first requests)."""
    fields = {
        "n": "1000",
        "rate": "4",
        "cv2": "1",
        "prompt": "uniform:128:2048",
        "output": "uniform:16:512",
        "priority": "",
    }
    body = spec.removeprefix(SYNTHETIC_PREFIX)
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise WorkloadError(f"{item!r}: expected key=value with key in {sorted(fields)}")
        fields[key] = value
    try:
        count, rate, cv2 = int(fields["n"]), float(fields["rate"]), float(fields["cv2"])
    except ValueError:
        raise WorkloadError(f"{spec!r}: n, rate and cv2 must be numbers") from None
    if not 1 <= count <= MAX_REQUESTS:
        raise WorkloadError(f"n: must be 1 to {MAX_REQUESTS:,} requests, got {count:,}")
    levels = None
    if fields["priority"]:
        try:
            levels = int(fields["priority"])
        except ValueError:
            levels = 0
        if not 1 <= levels <= MAX_LENGTH:
            raise WorkloadError(f"priority: {fields['priority']!r} is not a number of levels >= 1")
    prompt = parse_length(fields["prompt"], "prompt")
    output = parse_length(fields["output"], "output")
    count = count if limit is None else min(count, limit)
    return synthetic_table(
        count, rate, prompt, output, cv2=cv2, seed=seed, source=spec, priority_levels=levels
    )
