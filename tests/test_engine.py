"""The serving engine on the hybrid model (tiny preset, float32, CPU): greedy output never
depends on the schedule, speculation, chunk size, slots, layer groups or backend, and is
plain one-token-at-a-time greedy decoding of the dense oracle, attention included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_cases import MARGIN, MAX_LEN, MODEL, NEW_TOKENS, PROMPTS, dense_greedy
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor.engine import (
    Engine,
    EngineConfig,
    NgramIndex,
    SlotPool,
    accepted_prefix,
    propose_drafts,
)
from stepplan.executor.model import HybridModelRunner, make_weights
from stepplan.planner import PlannerConfig


def planner(spec: int = 3, mode: str = "mixed", tile: int = 64) -> PlannerConfig:
    return PlannerConfig(
        num_spec_tokens=spec, graph_mode=mode, max_num_seqs=8, prefill_tile_tokens=tile
    )


def runner(config: PlannerConfig, *, slots: int = 5, groups: int = 2, **kwargs):
    return HybridModelRunner(
        MODEL, config, num_slots=slots, max_len=MAX_LEN, num_groups=groups, **kwargs
    )


@pytest.fixture(scope="module")
def oracle() -> list[list[int]]:
    """Autoregressive greedy decoding with the dense model, one token at a time."""
    outputs, lead = dense_greedy(make_weights(MODEL, "cpu"), MODEL, PROMPTS, NEW_TOKENS)
    assert lead > MARGIN  # no near-tie that fp32 rounding could flip
    return outputs


@settings(max_examples=12, deadline=None)
@given(
    spec=st.sampled_from([0, 1, 3]),
    chunk=st.integers(1, 24),
    budget=st.integers(4, 40),
    max_num_seqs=st.integers(1, 4),
    slots=st.integers(2, 5),
    groups=st.sampled_from([1, 2]),
    mode=st.sampled_from(["none", "full", "mixed"]),
)
def test_any_schedule_generates_the_oracle_tokens(
    oracle, spec, chunk, budget, max_num_seqs, slots, groups, mode
):
    """Fewer slots than requests make later requests reuse a slot's stale KV and state."""
    model = runner(planner(mode=mode), slots=slots, groups=groups)
    config = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        prefill_chunk_tokens=chunk,
        num_spec_tokens=spec,
    )
    assert Engine(model, config).generate(PROMPTS, NEW_TOKENS) == oracle


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

    config = EngineConfig(max_num_seqs=4, prefill_chunk_tokens=6, num_spec_tokens=3)
    engine = Engine(runner(planner()), config, proposer=propose)
    assert engine.generate(PROMPTS, NEW_TOKENS) == oracle
    by_accepted = engine.stats.spec_rows_by_accepted
    assert len(by_accepted) == 4 and min(by_accepted) > 0, by_accepted


def test_triton_backend_generates_the_oracle_tokens(oracle):
    """The executor's kernel path (interpreted on CPU) inside the engine, mixed graphs padded."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the kernels compiled (tests/test_engine_gpu.py)")
    model = runner(planner(tile=8), slots=4, backend="triton")
    config = EngineConfig(
        max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk_tokens=12, num_spec_tokens=3
    )
    assert Engine(model, config).generate(PROMPTS, NEW_TOKENS) == oracle


def test_incremental_drafts_are_propose_drafts_drafts(oracle):
    """The engine's own NgramIndex per request drafts what propose_drafts would: the same
    tokens, steps and acceptance counts."""
    config = EngineConfig(max_num_seqs=4, prefill_chunk_tokens=5, num_spec_tokens=3, ngram_max=2)
    engines = [
        Engine(runner(planner()), config),
        Engine(runner(planner()), config, proposer=lambda t, n: propose_drafts(t, n, 2)),
    ]
    outputs = [engine.generate(PROMPTS, NEW_TOKENS) for engine in engines]
    assert outputs[0] == outputs[1] == oracle
    assert engines[0].stats == engines[1].stats
    assert engines[0].stats.accepted_draft_tokens > 0


def test_drafts_stop_at_the_last_wanted_token():
    """No spec row feeds drafts past the request's last output: the KV cache needs only
    ``prompt + max_new_tokens - 1`` positions, and the last spec steps draft fewer."""
    prompt, new = [4, 5, 4, 5, 4, 5, 4, 5], 40  # 47 positions of 48
    config = EngineConfig(max_num_seqs=1, num_spec_tokens=3, ngram_max=2)
    engine = Engine(runner(planner()), config)
    assert len(engine.generate([prompt], new)[0]) == new
    assert engine.stats.draft_tokens < 3 * (engine.stats.steps - 1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (EngineConfig(num_spec_tokens=4), "num_spec_tokens: 4 drafts exceed the planner's 3"),
        (EngineConfig(max_num_seqs=9), "max_num_seqs: 9 exceeds the planner's 8"),
        (EngineConfig(max_num_batched_tokens=0), "max_num_batched_tokens and prefill_chunk"),
        (EngineConfig(prefill_chunk_tokens=0), "max_num_batched_tokens and prefill_chunk"),
        (EngineConfig(ngram_max=0), "ngram_max: must be at least 1, got 0"),
    ],
)
def test_engine_refuses_what_its_planner_cannot_plan(config, message):
    with pytest.raises(ValueError, match=message):
        Engine(runner(planner()), config)


@pytest.mark.parametrize(
    ("prompt", "new", "message"),
    [
        ([], 3, r"prompts\[1\]: needs a token and max_new_tokens >= 1"),
        ([1, 2], 0, r"prompts\[1\]: needs a token and max_new_tokens >= 1"),
        ([1, 64, 2], 3, r"prompts\[1\]: token 64 is outside the vocabulary 0\.\.63"),
        ([1, -1], 3, r"prompts\[1\]: token -1 is outside the vocabulary 0\.\.63"),
        (
            [1] * 40,
            10,
            r"prompts\[1\]: 40 prompt tokens and 10 new ones need 49 KV positions, "
            r"the runner has max_len = 48",
        ),
    ],
)
def test_bad_requests_are_refused_before_any_step(prompt, new, message):
    model = runner(planner())
    engine = Engine(model, EngineConfig(num_spec_tokens=3))
    with pytest.raises(ValueError, match=message):
        engine.generate([[3, 4], prompt], [2, new])
    assert engine.stats.steps == 0
    assert not model.conv_state_memory.any() and not model.cache.memory.any()
    assert engine.generate([[1] * 39], 10)[0]  # 48 positions fit; every slot is free again


def test_a_call_that_failed_midway_leaks_no_slot(oracle):
    calls = []

    def propose(tokens, count):  # fails on its first call, once both requests hold slots
        calls.append(count)
        if len(calls) == 1:
            raise RuntimeError("proposer down")
        return propose_drafts(tokens, count, 3)

    config = EngineConfig(max_num_seqs=2, num_spec_tokens=3)
    engine = Engine(runner(planner(), slots=3), config, proposer=propose)
    with pytest.raises(RuntimeError, match="proposer down"):
        engine.generate(PROMPTS[:2], NEW_TOKENS)
    assert engine.generate(PROMPTS[:2], NEW_TOKENS) == oracle[:2]


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


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), max_size=60),
    splits=st.lists(st.integers(1, 7), min_size=1, max_size=12),
    ngram_max=st.integers(1, 4),
    count=st.integers(0, 5),
)
def test_ngram_index_proposes_what_propose_drafts_does(tokens, splits, ngram_max, count):
    index = NgramIndex(tokens[: splits[0]], ngram_max)
    assert index.propose(count) == propose_drafts(tokens[: splits[0]], count, ngram_max)
    end = splits[0]
    for size in splits[1:]:
        index.extend(tokens[end : end + size])
        end += size
        assert index.propose(count) == propose_drafts(tokens[:end], count, ngram_max)
