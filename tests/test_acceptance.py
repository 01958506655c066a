"""Acceptance models: empirical rates match parameters; draws are pure and bounded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.acceptance import (
    DEEPSEEK_MTP_PROBS,
    EAGLE3_PROBS,
    AcceptanceError,
    FixedLength,
    PerPosition,
    Replay,
    draw_rows,
    load_replay,
    make_acceptance,
    uniform,
    uniforms,
)
from stepplan.sim.settings.config import AcceptanceConfig

N = 40_000


def rows(n: int = N, drafts: int = 3):
    ids = np.arange(n, dtype=np.int64) % 997
    steps = np.arange(n, dtype=np.int64) // 997
    return ids, steps, np.full(n, drafts, dtype=np.int64)


def within(observed: float, expected: float, n: int, sigmas: float = 5.0) -> bool:
    spread = np.sqrt(max(expected * (1 - expected), 1e-12) / n)
    return abs(observed - expected) <= sigmas * spread + 1e-9


def test_uniforms_are_uniform_and_independent():
    u = uniforms(7, *rows()[:2], width=4)
    assert u.shape == (N, 4) and u.min() >= 0 and u.max() < 1
    for column in u.T:
        counts = np.histogram(column, bins=10, range=(0, 1))[0]
        chi2 = (((counts - N / 10) ** 2) / (N / 10)).sum()
        assert chi2 < 40  # 9 degrees of freedom; p < 1e-5
    assert abs(np.corrcoef(u.T)[0, 1]) < 0.03


@pytest.mark.parametrize("probs", [(0.87,), (0.9, 0.6, 0.3), (0.5, 1.0, 0.0)])
def test_per_position_rates_match_probabilities(probs):
    model = PerPosition(probs, seed=3)
    ids, steps, drafts = rows()
    accepted = model.draw(ids, steps, drafts)
    padded = list(probs) + [probs[-1]] * (3 - len(probs))
    for position, p in enumerate(padded[:3], start=1):
        reached = accepted >= position - 1  # drafts 1..position-1 were accepted
        rate = (accepted[reached] >= position).mean()
        assert within(rate, p, int(reached.sum())), (position, rate, p)
    length = 1 + accepted.mean()
    assert abs(length - model.mean_length(3)) < 5 * accepted.std() / np.sqrt(N)


def test_presets_give_documented_figures():
    assert PerPosition(EAGLE3_PROBS).mean_length(7) == pytest.approx(3.50, abs=0.01)
    assert all(0.85 <= p <= 0.90 for p in DEEPSEEK_MTP_PROBS)  # DeepSeek-V3's MTP range


def test_fixed_length_mean_and_cap():
    model = FixedLength(3.4, seed=1)
    ids, steps, drafts = rows()
    accepted = model.draw(ids, steps, drafts)
    assert set(np.unique(accepted).tolist()) == {2, 3}
    assert within(accepted.mean() - 2, 0.4, N)
    assert (model.draw(ids, steps, np.ones(N, np.int64)) == 1).all()


def test_replay_follows_the_trace(tmp_path):
    path = tmp_path / "acc.jsonl"
    path.write_text('{"accepted": [3, 0, 1]}\n\n{"accepted": [2]}\n')
    model = load_replay(path)
    ids = np.array([0, 0, 0, 0, 1, 2, 3], np.int64)
    steps = np.array([0, 1, 2, 3, 0, 1, 5], np.int64)
    drafts = np.array([2, 3, 3, 3, 3, 3, 3], np.int64)
    assert model.draw(ids, steps, drafts).tolist() == [2, 0, 1, 3, 2, 0, 2]


@pytest.mark.parametrize(
    "text, line",
    [('{"accepted": [1]}\n{"accepted": []}\n', 2), ("not json\n", 1), ('{"x": 1}\n', 1)],
)
def test_replay_errors_name_the_line(tmp_path, text, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(AcceptanceError, match=f"bad.jsonl:{line}:"):
        load_replay(path)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 50), st.integers(0, 7)), min_size=1),
    st.sampled_from(["per-position", "fixed"]),
    st.integers(0, 2**32),
)
def test_draws_are_bounded_and_independent_of_the_batch(items, kind, seed):
    ids, steps, drafts = (np.array(c, np.int64) for c in zip(*items, strict=True))
    config = AcceptanceConfig(model=kind, probs=(0.8, 0.6), length=2.7)
    model = make_acceptance(config, seed)
    full = model.draw(ids, steps, drafts)
    assert ((full >= 0) & (full <= drafts)).all()
    for i in range(len(items)):  # a row alone draws what it drew in the batch
        alone = model.draw(ids[i : i + 1], steps[i : i + 1], drafts[i : i + 1])
        assert alone[0] == full[i]
    np.testing.assert_array_equal(model.draw(ids, steps, drafts), full)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10**7), st.integers(0, 10**4), st.integers(0, 8)), min_size=1
    ),
    st.sampled_from(["per-position", "fixed", "replay"]),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    st.floats(1.0, 6.0),
    st.integers(0, 2**40),
)
def test_the_list_draw_is_the_array_draw(tmp_path_factory, items, kind, probs, length, seed):
    """``draw_rows`` (Python numbers, a few rows a step) draws what ``draw`` draws."""
    ids, steps, drafts = (list(column) for column in zip(*items, strict=True))
    trace = None
    if kind == "replay":
        trace = str(tmp_path_factory.mktemp("replay") / "acc.jsonl")
        Path(trace).write_text('{"accepted": [3, 0, 1]}\n{"accepted": [2, 5]}\n')
    config = AcceptanceConfig(model=kind, probs=tuple(probs), length=length, trace=trace)
    model = make_acceptance(config, seed)
    arrays = (np.array(column, np.int64) for column in (ids, steps, drafts))
    assert draw_rows(model, ids, steps, drafts) == model.draw(*arrays).tolist()
    u = uniforms(seed, np.array(ids, np.int64), np.array(steps, np.int64), 1)[:, 0]
    assert [uniform(seed, i, s) for i, s in zip(ids, steps, strict=True)] == u.tolist()


def test_seed_changes_draws():
    ids, steps, drafts = rows(2000)
    a = PerPosition((0.5,), seed=1).draw(ids, steps, drafts)
    b = PerPosition((0.5,), seed=2).draw(ids, steps, drafts)
    assert (a != b).mean() > 0.3


def test_make_acceptance_picks_the_configured_model(tmp_path):
    assert isinstance(make_acceptance(AcceptanceConfig(model="fixed"), 0), FixedLength)
    assert make_acceptance(AcceptanceConfig(probs=(0.3,)), 5) == PerPosition((0.3,), 5)
    path = tmp_path / "acc.jsonl"
    path.write_text('{"accepted": [1]}\n')
    assert isinstance(make_acceptance(AcceptanceConfig(model="replay", trace=str(path)), 0), Replay)
    with pytest.raises(ValueError, match="trace"):
        AcceptanceConfig(model="replay")
