"""The toy engine: greedy output never depends on the schedule, speculation, or backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor.engine import (
    Engine,
    EngineConfig,
    SlotPool,
    ToyModelConfig,
    ToyModelRunner,
    accepted_prefix,
    dense_greedy_tokens,
    propose_drafts,
)
from stepplan.planner import PlannerConfig, StepBatch

MODEL = ToyModelConfig(vocab_size=48, hidden_size=24, mlp_size=48, num_layers=4, num_groups=2)
NEW_TOKENS = 14
# Distinct first tokens, so a prompt is never a prefix of another request's tokens.
PROMPTS = [[5], [6, 7, 8, 9, 6, 7, 8, 9, 6, 7], [11, 40, 3, 22, 17], [20, *range(21, 40)]]


def planner(spec: int = 3, mode: str = "mixed", tile: int = 64) -> PlannerConfig:
    return PlannerConfig(
        num_spec_tokens=spec, graph_mode=mode, max_num_seqs=8, prefill_tile_tokens=tile
    )


@pytest.fixture(scope="module")
def oracle() -> list[list[int]]:
    """Autoregressive greedy decoding with the dense model, one token at a time."""
    weights = ToyModelRunner(MODEL, planner(), num_slots=2).weights
    outputs = []
    for prompt in PROMPTS:
        tokens = list(prompt)
        for _ in range(NEW_TOKENS):
            tokens.append(int(dense_greedy_tokens(weights, MODEL, torch.tensor(tokens))[-1]))
        outputs.append(tokens[len(prompt) :])
    return outputs


@settings(max_examples=10, deadline=None)
@given(
    spec=st.sampled_from([0, 1, 3]),
    chunk=st.integers(1, 24),
    budget=st.integers(4, 40),
    max_num_seqs=st.integers(1, 4),
    mode=st.sampled_from(["none", "full", "mixed"]),
)
def test_any_schedule_generates_the_oracle_tokens(oracle, spec, chunk, budget, max_num_seqs, mode):
    runner = ToyModelRunner(MODEL, planner(mode=mode), num_slots=max_num_seqs + 1)
    config = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        prefill_chunk_tokens=chunk,
        num_spec_tokens=spec,
    )
    assert Engine(runner, config).generate(PROMPTS, NEW_TOKENS) == oracle


def test_every_acceptance_length_keeps_the_oracle_tokens(oracle):
    """Drafts from the answer, corrupted at a random position: every prefix length gets accepted."""
    rng = np.random.default_rng(0)

    def propose(tokens, count):
        for prompt, output in zip(PROMPTS, oracle, strict=True):
            if list(tokens[: len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                drafts = list(output[done : done + count])
                wrong = int(rng.integers(0, len(drafts) + 1))
                if wrong < len(drafts):
                    drafts[wrong] = (drafts[wrong] + 1) % MODEL.vocab_size
                return drafts
        raise AssertionError("unknown request")

    runner = ToyModelRunner(MODEL, planner(), num_slots=5)
    config = EngineConfig(max_num_seqs=4, prefill_chunk_tokens=6, num_spec_tokens=3)
    engine = Engine(runner, config, proposer=propose)
    assert engine.generate(PROMPTS, NEW_TOKENS) == oracle
    by_accepted = engine.stats.spec_rows_by_accepted
    assert len(by_accepted) == 4 and min(by_accepted) > 0, by_accepted


def test_triton_backend_generates_the_oracle_tokens(oracle):
    """The executor's kernel path (interpreted on CPU) inside the engine, mixed graphs padded."""
    runner = ToyModelRunner(MODEL, planner(tile=8), num_slots=4, backend="triton")
    config = EngineConfig(
        max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk_tokens=12, num_spec_tokens=3
    )
    assert Engine(runner, config).generate(PROMPTS, NEW_TOKENS) == oracle


def test_propose_drafts_continues_the_latest_match_of_the_longest_suffix():
    assert propose_drafts([1, 2, 3, 9, 5, 2, 3, 4, 1, 2, 3], 2, 3) == [9, 5]  # longest first
    assert propose_drafts([1, 2, 3, 9, 5, 2, 3, 4, 1, 2, 3], 2, 2) == [4, 1]  # then latest
    assert propose_drafts([1, 2, 3, 1, 2], 5, 3) == [3, 1, 2]
    assert propose_drafts([7, 8, 9], 3, 3) == []
    assert propose_drafts([4, 4], 0, 3) == []
    assert propose_drafts([4], 3, 3) == []


def test_accepted_prefix_stops_at_the_first_mismatch():
    assert accepted_prefix([3, 4, 5], [3, 4, 6, 1]) == 2
    assert accepted_prefix([3, 4, 5], [9, 4, 5, 1]) == 0
    assert accepted_prefix([], [9]) == 0
    assert accepted_prefix([3, 4], [3, 4, 8]) == 2


def test_slot_pools_never_hand_out_the_null_slot():
    pools = [SlotPool(5, rotation=r) for r in (0, 3)]
    taken = [[pool.take() for _ in range(4)] for pool in pools]
    assert sorted(taken[0]) == sorted(taken[1]) == [1, 2, 3, 4] and taken[0] != taken[1]
    with pytest.raises(IndexError):
        pools[0].take()
    pools[0].give(3)
    assert pools[0].num_free == 1 and pools[0].take() == 3


def test_runner_refuses_bad_token_ids():
    runner = ToyModelRunner(MODEL, planner(), num_slots=3)
    batch = StepBatch(
        query_lens=[2],
        num_computed_tokens=[0],
        slots=[[1], [2]],
        num_draft_tokens=[-1],
        num_accepted_tokens=[1],
    )
    with pytest.raises(ValueError, match=r"token_ids: must be \[2\]"):
        runner.greedy_tokens(batch, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"token_ids: must lie in 0\.\.47"):
        runner.greedy_tokens(batch, np.array([1, 48]))


def test_engine_refuses_what_its_planner_cannot_plan():
    runner = ToyModelRunner(MODEL, planner(spec=1), num_slots=3)
    with pytest.raises(ValueError, match="num_spec_tokens: 3 drafts exceed the planner's 1"):
        Engine(runner, EngineConfig(num_spec_tokens=3))
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        Engine(runner, EngineConfig(num_spec_tokens=1)).generate([[]], 3)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), max_size=60),
    splits=st.lists(st.integers(1, 7), min_size=1, max_size=12),
    ngram_max=st.integers(1, 4),
    count=st.integers(0, 5),
)
def test_ngram_index_proposes_what_propose_drafts_does(tokens, splits, ngram_max, count):
    from stepplan.executor.engine import NgramIndex

    index = NgramIndex(tokens[: splits[0]], ngram_max)
    assert index.propose(count) == propose_drafts(tokens[: splits[0]], count, ngram_max)
    end = splits[0]
    for size in splits[1:]:
        index.extend(tokens[end : end + size])
        end += size
        assert index.propose(count) == propose_drafts(tokens[:end], count, ngram_max)
