"""A small real engine: continuous batching, chunked prefill, n-gram speculative decoding.

Requests get one conv-state slot per layer group from :class:`SlotPool`s; each
step schedules running requests (prefill chunks, decodes, or spec rows of the
last token plus drafts) into a :class:`StepBatch`, runs it through a
:class:`ToyModelRunner` (planner + :class:`Executor`, CUDA graphs on GPU) and
verifies drafts against the model's greedy tokens. Greedy output never
depends on the schedule (SPEC §2), so it equals plain one-token decoding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from stepplan.planner import StepBatch

from .toy_model import ToyModelRunner


@attrs.frozen
class EngineConfig:
    """Scheduling limits.

    Attributes:
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: most tokens in one step (drafts included).
        prefill_chunk_tokens: most prompt tokens one request prefills per step.
        num_spec_tokens: drafts proposed per spec step (``0``: no speculation).
        ngram_max: longest suffix the draft proposer looks up.
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64
    prefill_chunk_tokens: int = 32
    num_spec_tokens: int = 0
    ngram_max: int = 3


@attrs.define
class EngineStats:
    """Counters of one :meth:`Engine.generate` call."""

    steps: int = 0
    tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    #: ``[k]``: spec rows that accepted ``k`` drafts.
    spec_rows_by_accepted: list[int] = attrs.Factory(list)


def propose_drafts(tokens: Sequence[int], count: int, ngram_max: int) -> list[int]:
    """Prompt-lookup drafts: what followed the latest earlier match of the longest suffix.

    Tries suffixes of ``ngram_max`` down to 1 tokens; returns at most ``count`` tokens.
    """
    if count <= 0:
        return []
    for n in range(min(ngram_max, len(tokens) - 1), 0, -1):
        suffix = list(tokens[-n:])
        for start in range(len(tokens) - n - 1, -1, -1):
            if list(tokens[start : start + n]) == suffix:
                return list(tokens[start + n : start + n + count])
    return []


class NgramIndex:
    """:func:`propose_drafts` for a stream that only grows, in time independent of its length.

    For each ``n <= ngram_max`` it keeps every ``n``-gram that some token follows, mapped
    to its latest start; :meth:`propose` then looks the stream's suffixes up instead of
    scanning back through the stream, and gives exactly what :func:`propose_drafts` gives.
    """

    def __init__(self, tokens: Sequence[int], ngram_max: int) -> None:
        self.tokens: list[int] = []
        self.ngram_max = ngram_max
        self._starts: list[dict[tuple[int, ...], int]] = [{} for _ in range(ngram_max + 1)]
        self.extend(tokens)

    def extend(self, new: Sequence[int]) -> None:
        """Append ``new`` to the stream."""
        tokens, starts = self.tokens, self._starts
        for token in new:
            end = len(tokens)  # the n-grams ending here are now followed by ``token``
            for n in range(1, min(self.ngram_max, end) + 1):
                starts[n][tuple(tokens[end - n : end])] = end - n
            tokens.append(int(token))

    def propose(self, count: int) -> list[int]:
        """``propose_drafts(self.tokens, count, self.ngram_max)``."""
        tokens = self.tokens
        if count <= 0:
            return []
        for n in range(min(self.ngram_max, len(tokens) - 1), 0, -1):
            start = self._starts[n].get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start + n : start + n + count]
        return []


def accepted_prefix(drafts: Sequence[int], greedy: Sequence[int]) -> int:
    """How many drafts match the model's greedy tokens in a row (``greedy[i]`` follows draft i)."""
    count = 0
    while count < len(drafts) and drafts[count] == greedy[count]:
        count += 1
    return count


class SlotPool:
    """Conv-state slots ``1..num_slots - 1`` of one layer group (slot 0 is NULL)."""

    def __init__(self, num_slots: int, rotation: int = 0) -> None:
        free = list(range(1, num_slots))
        shift = rotation % len(free) if free else 0
        self._free = deque(free[shift:] + free[:shift])  # pools hand out different slot ids

    @property
    def num_free(self) -> int:
        """Slots available now."""
        return len(self._free)

    def take(self) -> int:
        """A free slot; ``IndexError`` when none is left."""
        return self._free.popleft()

    def give(self, slot: int) -> None:
        """Return ``slot`` to the pool."""
        self._free.append(slot)


@attrs.define
class _Sequence:
    """One request being served (mutable engine bookkeeping)."""

    index: int
    prompt_len: int
    max_new_tokens: int
    tokens: list[int]  # prompt, then every accepted token
    slots: tuple[int, ...] = ()
    num_computed: int = 0  # tokens whose state is in the slots
    num_accepted: int = 1  # accepted tokens of the previous spec step

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.max_new_tokens


@attrs.frozen
class _Row:
    """One scheduled row: its request, query tokens and drafts (``None``: not spec)."""

    seq: _Sequence
    query: tuple[int, ...]
    drafts: tuple[int, ...] | None


#: ``(tokens so far, most drafts) -> drafts``; any proposer keeps greedy output unchanged.
Proposer = Callable[[Sequence[int], int], list[int]]


class Engine:
    """Serves greedy requests end to end on a :class:`ToyModelRunner`.

    ``proposer`` drafts tokens for spec steps (default: :func:`propose_drafts`
    with ``config.ngram_max``).
    """

    def __init__(
        self, runner: ToyModelRunner, config: EngineConfig, proposer: Proposer | None = None
    ) -> None:
        planner = runner.planner.config
        if config.num_spec_tokens > planner.num_spec_tokens:
            raise ValueError(
                f"num_spec_tokens: {config.num_spec_tokens} drafts exceed the planner's "
                f"{planner.num_spec_tokens}"
            )
        if config.max_num_seqs > planner.max_num_seqs:
            raise ValueError(
                f"max_num_seqs: {config.max_num_seqs} exceeds the planner's {planner.max_num_seqs}"
            )
        if config.max_num_batched_tokens < 1 or config.prefill_chunk_tokens < 1:
            raise ValueError("max_num_batched_tokens and prefill_chunk_tokens must be positive")
        self.runner, self.config = runner, config
        self._propose = proposer or (lambda t, n: propose_drafts(t, n, config.ngram_max))
        groups = runner.model.num_groups
        self._pools = tuple(SlotPool(runner.num_slots, rotation=3 * g) for g in range(groups))
        self.stats = EngineStats()

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int]
    ) -> list[list[int]]:
        """Serve every prompt to completion; returns each one's generated tokens, in order."""
        if isinstance(max_new_tokens, int):
            limits = [max_new_tokens] * len(prompts)
        else:
            limits = list(max_new_tokens)
        waiting = deque(
            _Sequence(i, len(p), int(n), [int(t) for t in p])
            for i, (p, n) in enumerate(zip(prompts, limits, strict=True))
        )
        for seq in waiting:
            if seq.prompt_len < 1 or seq.max_new_tokens < 1:
                raise ValueError(f"prompts[{seq.index}]: needs a token and max_new_tokens >= 1")
        self.stats = EngineStats()
        outputs: list[list[int]] = [[] for _ in prompts]
        running: list[_Sequence] = []
        while waiting or running:
            self._admit(waiting, running)
            self._step(running)
            for seq in [s for s in running if s.done]:
                outputs[seq.index] = seq.tokens[seq.prompt_len :][: seq.max_new_tokens]
                for pool, slot in zip(self._pools, seq.slots, strict=True):
                    pool.give(slot)
                running.remove(seq)
        return outputs

    def _admit(self, waiting: deque[_Sequence], running: list[_Sequence]) -> None:
        while waiting and len(running) < self.config.max_num_seqs:
            if min(pool.num_free for pool in self._pools) == 0:
                if not running:
                    raise RuntimeError("no conv-state slot is free and nothing is running")
                return
            seq = waiting.popleft()
            seq.slots = tuple(pool.take() for pool in self._pools)
            running.append(seq)

    def _schedule(self, running: list[_Sequence]) -> list[_Row]:
        """This step's rows; the starting request rotates so no schedule is privileged."""
        config, budget, rows = self.config, self.config.max_num_batched_tokens, []
        shift = self.stats.steps % len(running)
        for seq in running[shift:] + running[:shift]:
            if budget == 0:
                break
            start = seq.num_computed
            if seq.in_prefill:
                q = min(seq.prompt_len - start, config.prefill_chunk_tokens, budget)
                rows.append(_Row(seq, tuple(seq.tokens[start : start + q]), None))
            elif config.num_spec_tokens:
                count = min(config.num_spec_tokens, budget - 1)
                drafts = tuple(self._propose(seq.tokens, count)[:count])
                rows.append(_Row(seq, (seq.tokens[start], *drafts), drafts))
            else:
                rows.append(_Row(seq, (seq.tokens[start],), None))
            budget -= len(rows[-1].query)
        return rows

    def _step(self, running: list[_Sequence]) -> None:
        rows = self._schedule(running)
        groups = len(self._pools)
        batch = StepBatch(
            query_lens=np.array([len(r.query) for r in rows], dtype=np.int32),
            num_computed_tokens=np.array([r.seq.num_computed for r in rows], dtype=np.int32),
            slots=np.array([[r.seq.slots[g] for r in rows] for g in range(groups)], np.int32),
            num_draft_tokens=np.array(
                [-1 if r.drafts is None else len(r.drafts) for r in rows], dtype=np.int32
            ),
            num_accepted_tokens=np.array(
                [1 if r.drafts is None else r.seq.num_accepted for r in rows], dtype=np.int32
            ),
        )
        ids = np.array([t for r in rows for t in r.query], dtype=np.int64)
        greedy = self.runner.greedy_tokens(batch, ids).tolist()
        self.stats.steps += 1
        self.stats.tokens += len(ids)
        start = 0
        for row in rows:
            self._advance(row, greedy[start : start + len(row.query)])
            start += len(row.query)

    def _advance(self, row: _Row, greedy: list[int]) -> None:
        """Fold one row's greedy tokens into its request: verify drafts, commit tokens."""
        seq = row.seq
        if row.drafts is None:
            seq.num_computed += len(row.query)
            if not seq.in_prefill:  # the last prompt chunk, or a decode
                seq.tokens.append(greedy[-1])
            return
        accepted = accepted_prefix(row.drafts, greedy)
        seq.tokens.extend([*row.drafts[:accepted], greedy[accepted]])  # plus the bonus token
        seq.num_computed += accepted + 1
        seq.num_accepted = accepted + 1
        stats = self.stats
        stats.draft_tokens += len(row.drafts)
        stats.accepted_draft_tokens += accepted
        by_accepted = stats.spec_rows_by_accepted
        by_accepted.extend([0] * (accepted + 1 - len(by_accepted)))
        by_accepted[accepted] += 1
