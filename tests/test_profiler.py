"""The profile grid: valid batches, every graph bucket, the eager token grid, medians."""

from __future__ import annotations

import numpy as np

from stepplan.executor.model import sample_positions
from stepplan.planner import Planner, PlannerConfig
from stepplan.sim.timing.engine_profile import EngineProfile
from stepplan.sim.timing.profiler import GridLimits, measure, profile_batches, token_grid

CONFIG = PlannerConfig(num_spec_tokens=3, graph_mode="full", max_num_seqs=64)
LIMITS = GridLimits(max_num_batched_tokens=2048, num_slots=65, max_len=4096)


def fake_run(plan, ids, samples):
    """A deterministic 'engine': time grows with tokens and context."""
    assert ids.shape == (plan.num_tokens,)
    assert samples.max() < plan.num_tokens
    context = int(plan.batch.num_computed_tokens.sum())
    return 1e-4 + 1e-8 * plan.padded_tokens + 1e-10 * context, None, 1e-5


def test_grid_covers_every_bucket_and_the_token_grid():
    batches = profile_batches(CONFIG, LIMITS)
    planner = Planner(CONFIG)
    plans = [planner.compile(batch) for batch in batches]
    graphs = {plan.graph.num_rows for plan in plans if plan.graph is not None}
    assert graphs == set(CONFIG.row_sizes)
    eager = sorted(plan.num_tokens for plan in plans if plan.graph is None)
    assert eager[0] == 2 and eager[-1] == LIMITS.max_num_batched_tokens
    for batch in batches:
        assert (batch.num_computed_tokens + batch.query_lens <= LIMITS.max_len).all()
        assert batch.slots.max() < LIMITS.num_slots
    assert token_grid(LIMITS)[-1] == 2048


def test_measured_points_fit_back():
    batches = profile_batches(CONFIG, LIMITS, seed=3)
    points = measure(batches, Planner(CONFIG), fake_run, sample_positions, vocab_size=50, repeats=2)
    assert all(p.host_us > 0 for p in points)
    assert len(points) == len(batches)
    profile = EngineProfile(
        source="t",
        device="cpu",
        versions={},
        preset={},
        planner={},
        runner={},
        token_grid=token_grid(LIMITS),
        points=tuple(points),
    )
    errors = [
        abs(profile.fit.predict_us(p.shape) - p.wall_us) / p.wall_us
        for p in points
        if profile.fit.predict_us(p.shape) is not None
    ]
    assert len(errors) == len(points)
    # Planner compile times are measured, so the law is met only up to host noise.
    assert np.median(errors) < 0.5


def test_mixed_mode_grid_measures_mixed_graphs_across_their_sizes():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="mixed", max_num_seqs=64)
    plans = [Planner(config).compile(batch) for batch in profile_batches(config, LIMITS)]
    mixed = [plan for plan in plans if plan.graph is not None and plan.graph.kind == "mixed"]
    sizes = {plan.graph.num_tokens for plan in mixed}
    assert min(sizes) <= 8 and max(sizes) == config.sizes[-1]
    # Graphs full of spec rows beside a short chunk: what a mixed graph serves live.
    cap = min(config.max_num_seqs, LIMITS.num_slots) - 1
    assert max(plan.num_spec_rows for plan in mixed) == min(cap, config.sizes[-1] // 4 - 1)
    points = measure(
        [plan.batch for plan in mixed], Planner(config), fake_run, sample_positions,
        vocab_size=50, repeats=1, warmup=0, idle_gap_s=0.0,
    )  # fmt: skip
    profile = EngineProfile("t", "cpu", {}, {}, {}, {}, token_grid(LIMITS), tuple(points))
    assert all(profile.fit.predict_us(p.shape) is not None for p in points)


def test_every_eager_run_has_a_token_count_of_its_own():
    """A live eager step almost always has a new token count: the profile times such
    steps as first runs of their count, never repeats of one, and keeps the batch's shape."""
    batches = profile_batches(CONFIG, LIMITS, seed=5)
    planner = Planner(CONFIG)
    shapes = []

    def recording_run(plan, ids, samples):
        shapes.append((plan.graph is None, plan.num_tokens))
        assert (plan.batch.num_computed_tokens + plan.batch.query_lens <= LIMITS.max_len).all()
        assert plan.num_tokens <= LIMITS.max_num_batched_tokens
        return fake_run(plan, ids, samples)

    points = measure(batches, planner, recording_run, sample_positions, vocab_size=50, repeats=3)
    eager_counts = [tokens for eager, tokens in shapes if eager]
    assert len(eager_counts) > 100
    # A few tiny chunks run out of neighbours; everything else is run once per count.
    assert len(set(eager_counts)) >= 0.85 * len(eager_counts)
    graph_runs = sum(not eager for eager, _ in shapes)
    graphs = sum(planner.compile(b).graph is not None for b in batches)
    assert graph_runs == graphs * 5  # 2 warm-ups and 3 repeats of the same batch
    assert [p.shape.num_tokens for p in points] == [b.num_tokens for b in batches]


def test_a_grid_of_many_rows_measures_bursts_of_short_prompts():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="full", max_num_seqs=128)
    limits = GridLimits(max_num_batched_tokens=8192, num_slots=129, max_len=9232)
    chunks = [int((b.num_draft_tokens < 0).sum()) for b in profile_batches(config, limits)]
    assert max(chunks) >= 8


def test_a_round_times_steps_after_steps_of_about_their_weight():
    """Rounds go by weight (jittered, every other one turned round), never a fixed order:
    a light step is timed after light ones, as in a live run."""
    from stepplan.sim.timing.profiler import _round_order

    rng = np.random.default_rng(0)
    weights = np.geomspace(1e-3, 1.0, 60)
    orders = [_round_order(weights, repeat, rng) for repeat in range(4)]
    for repeat, order in enumerate(orders):
        ranked = weights[order] if repeat % 2 == 0 else weights[order][::-1]
        # A step never comes before one more than 1.25 / 0.8 times lighter.
        assert (np.maximum.accumulate(ranked) <= ranked * (1.25 / 0.8) + 1e-12).all()
        assert sorted(order.tolist()) == list(range(60))
    assert orders[0].tolist() != orders[2].tolist()  # the jitter moves neighbours
