"""A small real engine: continuous batching, chunked prefill, n-gram speculative decoding.

Requests get one slot per layer group from :class:`SlotPool`s (group 0's slot also
indexes the KV cache); each step schedules running requests (prefill chunks, decodes,
or spec rows of the last token plus drafts) into a :class:`StepBatch`, runs it through a
:class:`~stepplan.executor.model.HybridModelRunner` (planner, short conv through the
:class:`Executor`, attention over the KV cache, CUDA graphs on GPU), which computes the
greedy token only where an engine samples (:func:`~stepplan.executor.model.sample_positions`),
and verifies drafts against those tokens. Greedy output never depends on the schedule
(SPEC §2), so it equals plain one-token decoding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from stepplan.planner import StepBatch

from ..model import HybridModelRunner, sample_positions


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
    stream: NgramIndex  # prompt, then every accepted token; drafts come from it
    slots: tuple[int, ...] = ()
    num_computed: int = 0  # tokens whose state is in the slots (conv state and KV cache)
    num_accepted: int = 1  # accepted tokens of the previous spec step

    @property
    def tokens(self) -> list[int]:
        return self.stream.tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.max_new_tokens - (len(self.tokens) - self.prompt_len)

    @property
    def done(self) -> bool:
        return self.remaining <= 0


@attrs.frozen
class _Row:
    """One scheduled row: its request, query tokens and drafts (``None``: not spec)."""

    seq: _Sequence
    query: tuple[int, ...]
    drafts: tuple[int, ...] | None

    @property
    def completes_prompt(self) -> bool:
        """Whether the row's last token is the prompt's last or later: its greedy token is
        a generated one."""
        return self.seq.num_computed + len(self.query) >= self.seq.prompt_len


#: ``(tokens so far, most drafts) -> drafts``; any proposer keeps greedy output unchanged.
Proposer = Callable[[Sequence[int], int], list[int]]


class Engine:
    """Serves greedy requests end to end on a :class:`HybridModelRunner`.

    The caller builds the runner (model shape, planner config, slots, KV positions,
    layer groups, device, backend); the engine plans with ``runner.planner`` and hands
    out its slots ``1..num_slots - 1``. ``proposer`` drafts tokens for spec steps
    (default: prompt lookup with ``config.ngram_max``, by each request's incremental
    :class:`NgramIndex`).
    """

    def __init__(
        self, runner: HybridModelRunner, config: EngineConfig, proposer: Proposer | None = None
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
        if config.ngram_max < 1:
            raise ValueError(f"ngram_max: must be at least 1, got {config.ngram_max}")
        self.runner, self.config, self._proposer = runner, config, proposer
        self._pools = self._fresh_pools()
        self.stats = EngineStats()

    def _fresh_pools(self) -> tuple[SlotPool, ...]:
        """Every slot free, one pool per layer group."""
        runner = self.runner
        return tuple(SlotPool(runner.num_slots, rotation=3 * g) for g in range(runner.num_groups))

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int]
    ) -> list[list[int]]:
        """Serve every prompt to completion; returns each one's generated tokens, in order.

        Every request is checked before any step runs (``ValueError`` naming the prompt).
        """
        if isinstance(max_new_tokens, int):
            limits = [max_new_tokens] * len(prompts)
        else:
            limits = list(max_new_tokens)
        waiting = deque(
            self._request(i, prompt, limit)
            for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True))
        )
        # Slots are handed out anew per call: a call that failed midway leaks none.
        self._pools, self.stats = self._fresh_pools(), EngineStats()
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

    def _request(self, index: int, prompt: Sequence[int], max_new_tokens: int) -> _Sequence:
        """A checked request: a token at least, ids in the vocabulary, room in the KV cache
        for every token it feeds (prompt and output but the last)."""
        tokens, limit = [int(t) for t in prompt], int(max_new_tokens)
        if not tokens or limit < 1:
            raise ValueError(f"prompts[{index}]: needs a token and max_new_tokens >= 1")
        vocab = self.runner.shape.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"prompts[{index}]: token {bad[0]} is outside the vocabulary 0..{vocab - 1}"
            )
        positions, max_len = len(tokens) + limit - 1, self.runner.max_len
        if positions > max_len:
            raise ValueError(
                f"prompts[{index}]: {len(tokens)} prompt tokens and {limit} new ones need "
                f"{positions} KV positions, the runner has max_len = {max_len}"
            )
        return _Sequence(index, len(tokens), limit, NgramIndex(tokens, self.config.ngram_max))

    def _admit(self, waiting: deque[_Sequence], running: list[_Sequence]) -> None:
        while waiting and len(running) < self.config.max_num_seqs:
            if min(pool.num_free for pool in self._pools) == 0:
                if not running:
                    raise RuntimeError("no slot is free and nothing is running")
                return
            seq = waiting.popleft()
            seq.slots = tuple(pool.take() for pool in self._pools)
            running.append(seq)

    def _drafts(self, seq: _Sequence, count: int) -> tuple[int, ...]:
        if self._proposer is None:
            return tuple(seq.stream.propose(count))
        return tuple(self._proposer(seq.tokens, count)[:count])

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
                # Drafts past the last token still wanted could never be emitted.
                count = min(config.num_spec_tokens, budget - 1, seq.remaining - 1)
                drafts = self._drafts(seq, count)
                rows.append(_Row(seq, (seq.tokens[start], *drafts), drafts))
            else:
                rows.append(_Row(seq, (seq.tokens[start],), None))
            budget -= len(rows[-1].query)
        return rows

    def _batch(self, rows: list[_Row]) -> StepBatch:
        groups = len(self._pools)
        return StepBatch(
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

    def _step(self, running: list[_Sequence]) -> None:
        rows = self._schedule(running)
        batch = self._batch(rows)
        ids = np.array([t for r in rows for t in r.query], dtype=np.int64)
        samples = sample_positions(batch, np.array([r.completes_prompt for r in rows]))
        greedy = self.runner.greedy_tokens(batch, ids, samples).tolist()
        self.stats.steps += 1
        self.stats.tokens += len(ids)
        # A row's samples are its last tokens, so its greedy tokens lie in its token range.
        ends = np.searchsorted(samples, batch.query_start[1:]).tolist()
        for row, start, end in zip(rows, [0, *ends[:-1]], ends, strict=True):
            self._advance(row, greedy[start:end])

    def _advance(self, row: _Row, greedy: list[int]) -> None:
        """Fold one row's greedy tokens into its request: verify drafts, commit tokens.

        ``greedy``: the row's sampled tokens' greedy next tokens (a spec row's every token,
        else at most the last one's).
        """
        seq = row.seq
        if row.drafts is None:
            seq.num_computed += len(row.query)
            if not seq.in_prefill:  # the last prompt chunk, or a decode
                seq.stream.extend([greedy[-1]])
            return
        accepted = accepted_prefix(row.drafts, greedy)
        seq.stream.extend([*row.drafts[:accepted], greedy[accepted]])  # plus the bonus token
        seq.num_computed += accepted + 1
        seq.num_accepted = accepted + 1
        stats = self.stats
        stats.draft_tokens += len(row.drafts)
        stats.accepted_draft_tokens += accepted
        by_accepted = stats.spec_rows_by_accepted
        by_accepted.extend([0] * (accepted + 1 - len(by_accepted)))
        by_accepted[accepted] += 1
