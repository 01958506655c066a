"""Acceptance models: how many of a spec step's drafts the target model accepts.

Every model answers :meth:`draw` for a batch of spec rows: given each row's request
id, how many spec steps that request already made, and its draft count ``k``, the
accepted drafts ``a`` in ``0..k``. The step then emits ``a + 1`` tokens (the bonus
or corrected token) and the next spec step reports ``num_accepted_tokens = a + 1``.

Randomness is counter-based: the uniform for (request, spec step, draft position)
is a hash of those three numbers and the seed (splitmix64's finalizer). So draws
do not depend on which other requests share a batch: two configurations simulated
on the same trace and seed see the same acceptance for the same request and step
(common random numbers), and runs are reproducible bit for bit.

Defaults, from published figures:

- DeepSeek-V3 technical report (arXiv 2412.19437, §5.4.3): the MTP module's second
  token is accepted 85-90% of the time across topics; ``PerPosition((0.87,))``
  uses the middle of that range for every draft position.
- EAGLE-3 chains of ``k = 7`` drafts reach a mean acceptance length of about 3.4-3.6
  in serving (the figure quoted in issue #5); a constant per-position probability of
  0.74 gives ``1 + 0.74 + ... + 0.74**7 = 3.50`` (``EAGLE3_PROBS``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import attrs
import numpy as np

from .settings.config import AcceptanceConfig
from .settings.config_values import read_text

DEEPSEEK_MTP_PROBS = (0.87,)
EAGLE3_PROBS = (0.74,)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STEP_KEY = np.uint64(0xD6E8FEB86659FD93)
_POS_KEY = np.uint64(0xA0761D6478BD642F)


class AcceptanceError(ValueError):
    """An acceptance trace can't be read; the message names file and line."""


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on ``uint64`` (wraps by design)."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def uniform_key(seed: int) -> int:
    """The seed's part of every uniform's hash, ``0 <= key < 2**64``."""
    return (seed + 1) * int(_GOLDEN) % 2**64


def uniforms(seed: int, request_ids: np.ndarray, spec_steps: np.ndarray, width: int) -> np.ndarray:
    """``[n, width], float64`` uniforms in ``[0, 1)``, one per (row, draft position),
    a pure function of ``(seed, request id, spec step, position)``.

    Args:
        request_ids: ``[n], int64``.
        spec_steps: ``[n], int64`` spec steps the request made before this one.
    """
    key = np.uint64(uniform_key(seed))
    row = request_ids.astype(np.uint64) * _GOLDEN ^ spec_steps.astype(np.uint64) * _STEP_KEY
    positions = np.arange(1, width + 1, dtype=np.uint64) * _POS_KEY + key
    bits = _mix(row[:, None] ^ positions[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


_WORD = (1 << 64) - 1


def uniform(seed: int, request_id: int, spec_step: int) -> float:
    """:func:`uniforms`' first column for one row, in Python numbers (a step of a few
    rows costs less so than in array operations; ``tests/test_acceptance.py`` holds
    the two equal)."""
    row = (request_id * int(_GOLDEN) & _WORD) ^ (spec_step * int(_STEP_KEY) & _WORD)
    x = row ^ ((int(_POS_KEY) + uniform_key(seed)) & _WORD)
    x = ((x ^ (x >> 30)) * int(_MIX1)) & _WORD
    x = ((x ^ (x >> 27)) * int(_MIX2)) & _WORD
    return ((x ^ (x >> 31)) >> 11) * (1.0 / 2**53)


class AcceptanceModel(Protocol):
    """Draws accepted drafts for spec rows."""

    def draw(
        self, request_ids: np.ndarray, spec_steps: np.ndarray, drafts: np.ndarray
    ) -> np.ndarray:
        """``[n], int64`` accepted drafts, each in ``0..drafts[i]``.

        Args:
            request_ids: ``[n], int64`` the rows' requests.
            spec_steps: ``[n], int64`` spec steps each request made before this one.
            drafts: ``[n], int64`` drafts of each row (``k``).
        """
        ...

    def mean_length(self, drafts: int) -> float:
        """Expected tokens emitted per spec step with ``drafts`` drafts."""
        ...


@attrs.frozen
class PerPosition:
    """Draft ``j`` (1-based) is accepted with probability ``probs[j - 1]`` given that
    drafts ``1..j-1`` were; positions past the list reuse its last value."""

    probs: tuple[float, ...]
    seed: int = 0

    def survival(self, width: int) -> np.ndarray:
        """``[width], float64``: probability that at least ``j`` drafts are accepted."""
        padded = list(self.probs[:width]) + [self.probs[-1]] * max(0, width - len(self.probs))
        return np.cumprod(np.asarray(padded, dtype=np.float64))

    def draw(
        self, request_ids: np.ndarray, spec_steps: np.ndarray, drafts: np.ndarray
    ) -> np.ndarray:
        width = int(drafts.max()) if drafts.size else 0
        if width == 0:
            return np.zeros(drafts.shape, dtype=np.int64)
        # one uniform per row, inverted through the survival function (decreasing)
        u = uniforms(self.seed, request_ids, spec_steps, 1)
        accepted = (u < self.survival(width)).sum(axis=1)
        return np.minimum(accepted, drafts).astype(np.int64)

    def draw_rows(
        self, request_ids: list[int], spec_steps: list[int], drafts: list[int]
    ) -> list[int]:
        """:meth:`draw` in Python numbers, for a few rows."""
        survival, chance = [], 1.0
        for j in range(max(drafts, default=0)):
            chance *= self.probs[min(j, len(self.probs) - 1)]
            survival.append(chance)
        accepted = []
        for request, step, k in zip(request_ids, spec_steps, drafts, strict=True):
            u = uniform(self.seed, request, step)
            accepted.append(min(sum(u < chance for chance in survival), k))
        return accepted

    def mean_length(self, drafts: int) -> float:
        return 1.0 + float(self.survival(drafts).sum())


@attrs.frozen
class FixedLength:
    """Every spec step emits ``length`` tokens on average: ``length - 1`` accepted
    drafts, a fractional part resolved by one uniform (so ``3.5`` alternates 2 and 3
    accepted drafts at random), capped by the step's drafts."""

    length: float
    seed: int = 0

    def draw(
        self, request_ids: np.ndarray, spec_steps: np.ndarray, drafts: np.ndarray
    ) -> np.ndarray:
        whole, fraction = divmod(max(self.length - 1.0, 0.0), 1.0)
        extra = uniforms(self.seed, request_ids, spec_steps, 1)[:, 0] < fraction
        return np.minimum(int(whole) + extra, drafts).astype(np.int64)

    def draw_rows(
        self, request_ids: list[int], spec_steps: list[int], drafts: list[int]
    ) -> list[int]:
        """:meth:`draw` in Python numbers, for a few rows."""
        whole, fraction = divmod(max(self.length - 1.0, 0.0), 1.0)
        return [
            min(int(whole) + (uniform(self.seed, request, step) < fraction), k)
            for request, step, k in zip(request_ids, spec_steps, drafts, strict=True)
        ]

    def mean_length(self, drafts: int) -> float:
        return min(self.length, drafts + 1.0)


@attrs.frozen(eq=False)
class Replay:
    """Accepted drafts replayed from a trace: request ``r`` uses sequence
    ``r % num_sequences``; its ``s``-th spec step takes entry ``s`` (cycling), capped by
    the step's drafts.

    Attributes:
        offsets: ``[S + 1], int64`` where each sequence starts in :attr:`values`.
        values: ``[total], int64`` accepted drafts, every sequence non-empty.
    """

    offsets: np.ndarray
    values: np.ndarray

    def draw(
        self, request_ids: np.ndarray, spec_steps: np.ndarray, drafts: np.ndarray
    ) -> np.ndarray:
        sequence = request_ids % (self.offsets.shape[0] - 1)
        start = self.offsets[sequence]
        length = self.offsets[sequence + 1] - start  # the rows' sequences only, not all S
        return np.minimum(self.values[start + spec_steps % length], drafts).astype(np.int64)

    def mean_length(self, drafts: int) -> float:
        return 1.0 + float(np.minimum(self.values, drafts).mean())


def draw_rows(
    model: AcceptanceModel, request_ids: list[int], spec_steps: list[int], drafts: list[int]
) -> list[int]:
    """``model``'s draw for a few rows given as lists: its ``draw_rows`` where it has
    one (Python numbers), else its :meth:`~AcceptanceModel.draw` on arrays."""
    listed = getattr(model, "draw_rows", None)
    if listed is not None:
        return listed(request_ids, spec_steps, drafts)
    ids, steps = np.array(request_ids, np.int64), np.array(spec_steps, np.int64)
    return model.draw(ids, steps, np.array(drafts, np.int64)).tolist()


def load_replay(path: str | Path) -> Replay:
    """Read a JSONL acceptance trace: one object per line with ``accepted``, a
    non-empty list of accepted-draft counts (``>= 0``) of one request's spec steps."""
    path = Path(path)
    sequences: list[list[int]] = []
    lines = read_text(path, AcceptanceError).splitlines()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            counts = json.loads(text)["accepted"]
            ok = isinstance(counts, list) and counts and all(type(c) is int for c in counts)
        except (json.JSONDecodeError, KeyError, TypeError):
            ok = False
        if not ok or min(counts) < 0:
            raise AcceptanceError(
                f"{path}:{number}: expected {{'accepted': [non-negative integers]}}"
            )
        sequences.append(counts)
    if not sequences:
        raise AcceptanceError(f"{path}: no acceptance sequences")
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    return Replay(offsets, np.concatenate([np.asarray(s, np.int64) for s in sequences]))


def make_acceptance(config: AcceptanceConfig, seed: int) -> AcceptanceModel:
    """The model ``config`` names."""
    if config.model == "fixed":
        return FixedLength(config.length, seed)
    if config.model == "replay":
        assert config.trace is not None  # AcceptanceConfig checks it
        return load_replay(config.trace)
    return PerPosition(config.probs, seed)
