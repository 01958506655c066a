"""Engine profiles: the fit recovers a known step-time law, coverage, and every bad file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.timing.engine_fit import ProfilePoint, StepShape
from stepplan.sim.timing.engine_profile import (
    EngineProfile,
    EngineProfileError,
    read_engine_profile,
    write_engine_profile,
)

GRID = (1, 16, 64, 256, 1024, 4096)
KEYS = [("spec", 4 * r, r, 0) for r in (1, 8, 64)]
# Two row counts at a token count: a bucket's rows and rows x tokens are then told apart
# from its tokens, so buckets between the measured ones are determined.
MIXED = [("mixed", t, r, r + t // 64) for t, r in ((8, 2), (64, 16), (64, 4), (256, 64), (256, 16))]


def law(shape: StepShape) -> float:
    """A step-time law of the form the fit assumes: what it must recover exactly."""
    if shape.graph is not None and shape.graph[0] == "mixed":
        base = {8: 700.0, 64: 760.0, 256: 1300.0}[shape.graph[1]]
        return base + 0.02 * shape.context_tokens + 1e-5 * shape.prefill_pairs + 5 * shape.rows[0]
    if shape.graph is not None:
        base = {key: 900.0 + 40.0 * i for i, key in enumerate(KEYS)}[shape.graph]
        # Each bucket's own price per context token (few rows: a dearer KV entry) and per
        # token of its longest row (how long that row keeps the GPU to itself).
        per_token = {key: 0.03 / (1 + i) for i, key in enumerate(KEYS)}[shape.graph]
        long_row = {key: 0.05 / (1 + 4 * i) for i, key in enumerate(KEYS)}[shape.graph]
        return (
            base
            + per_token * shape.context_tokens
            + long_row * shape.max_context
            + 2.0 * shape.num_rows
        )
    tokens = shape.num_tokens
    dense = np.interp(tokens, GRID, [500, 520, 600, 900, 2100, 8000])
    return float(dense + 0.01 * shape.context_tokens + 2e-5 * shape.prefill_pairs + 3 * shape.tiles)


def random_points(rng: np.random.Generator, count: int) -> list[ProfilePoint]:
    points = []
    for _ in range(count):
        if rng.random() < 0.25:
            key = MIXED[rng.integers(len(MIXED))]
            spec = int(rng.integers(0, key[2]))
            chunk = int(rng.integers(2, key[1] - 4 * spec + 1)) if key[1] - 4 * spec >= 2 else 0
            if chunk == 0:
                spec, chunk = 0, key[1]
            computed = int(rng.integers(0, 3000))
            shape = StepShape(
                key,
                (spec, 0, 1),
                (4 * spec, 0, chunk),
                -(-chunk // 64),
                int(rng.integers(0, 5e4)) if spec else 0,
                chunk * (computed + (chunk + 1) / 2),
                0,
                computed + chunk,
            )
        elif rng.random() < 0.5:
            key = KEYS[rng.integers(len(KEYS))]
            rows = int(rng.integers(1, key[2] + 1))
            context = int(rng.integers(rows, 8192 * rows + 1))
            longest = int(rng.integers(-(-context // rows), min(context, 8192) + 1))
            shape = StepShape(key, (rows, 0, 0), (4 * rows, 0, 0), 0, context, 0.0, longest)
        else:
            spec, prefill = int(rng.integers(0, 16)), int(rng.integers(0, 2))
            chunk = int(rng.integers(2, 3000)) if prefill else 0
            pairs = chunk * (rng.integers(0, 2000) + (chunk + 1) / 2) if prefill else 0.0
            tokens = (4 * spec, 0, chunk)
            if sum(tokens) == 0:
                tokens, spec = (4, 0, 0), 1
            shape = StepShape(
                None,
                (spec, 0, prefill),
                tokens,
                -(-chunk // 64),
                int(rng.integers(0, 5e4)),
                float(pairs),
            )
        points.append(ProfilePoint(shape, law(shape)))
    return points


def profile(points, **overrides) -> EngineProfile:
    fields = dict(
        source="test",
        device="cpu",
        versions={"torch": "x"},
        preset={"name": "tiny", "hidden_size": 32},
        planner={"num_spec_tokens": 3, "graph_sizes": [1, 8, 64]},
        runner={"backend": "reference"},
        token_grid=GRID,
        points=tuple(points),
    )
    fields.update(overrides)
    return EngineProfile(**fields)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_fit_recovers_its_law(seed):
    rng = np.random.default_rng(seed)
    fit = profile(random_points(rng, 400)).fit
    for point in random_points(rng, 50):
        predicted = fit.predict_us(point.shape)
        if predicted is not None:
            assert predicted == pytest.approx(point.wall_us, rel=1e-6)


def test_a_bucket_measured_at_two_contexts_takes_the_shared_context_slope():
    """Buckets measured at three or more contexts price context each their own way; one
    measured at fewer shares a slope with the others like it, so it still extrapolates."""
    rng = np.random.default_rng(5)
    points = [p for p in random_points(rng, 400) if p.shape.graph in KEYS]
    few = [("spec", 16, 4, 0), ("spec", 64, 16, 0)]

    def few_law(shape: StepShape) -> float:
        return 950.0 + 10.0 * shape.graph[2] + 0.012 * shape.context_tokens

    for key in few:
        for context in (1000, 5000):
            shape = StepShape(key, (key[2], 0, 0), (key[1], 0, 0), 0, context, 0.0)
            points.append(ProfilePoint(shape, few_law(shape) + 2.0 * key[2]))
    fit = profile(points).fit
    assert [fit.context_us[key] for key in KEYS[1:]] == pytest.approx([0.015, 0.01])
    assert [fit.long_row_us[key] for key in KEYS[1:]] == pytest.approx([0.01, 0.05 / 9])
    # One row: its context is its longest row's, and only their sum is measured.
    one = KEYS[0]
    assert fit.context_us[one] + fit.long_row_us[one] == pytest.approx(0.03 + 0.05)
    for key in few:
        assert fit.context_us[key] == pytest.approx(0.012)
        shape = StepShape(key, (key[2], 0, 0), (key[1], 0, 0), 0, 3000, 0.0)
        assert fit.predict_us(shape) == pytest.approx(few_law(shape) + 2.0 * key[2])


def test_coverage():
    fit = profile(random_points(np.random.default_rng(1), 300)).fit
    unmeasured = StepShape(("spec", 512, 128, 0), (128, 0, 0), (512, 0, 0), 0, 10, 0.0)
    too_long = StepShape(None, (0, 0, 1), (0, 0, 9000), 141, 0, 1e6)
    far_context = StepShape(KEYS[0], (1, 0, 0), (4, 0, 0), 0, 10**9, 0.0)
    mixed_too_large = StepShape(("mixed", 512, 64, 72), (0, 0, 1), (0, 0, 512), 8, 0, 1e5)
    mixed_inside = StepShape(("mixed", 128, 32, 34), (8, 0, 1), (32, 0, 90), 2, 900, 5e3)
    assert fit.predict_us(mixed_too_large) is None
    assert fit.predict_us(mixed_inside) is not None  # between measured buckets: interpolated
    assert fit.predict_us(unmeasured) is None
    assert fit.predict_us(too_long) is None
    assert fit.predict_us(far_context) is None


def test_a_step_the_measurements_leave_undetermined_is_not_covered():
    """Without an eager prefill under 256 tokens, the price of a prefill row there is not
    measured (only its sum with the dense base above 256): no prediction, not a guess."""
    points = [
        p
        for p in random_points(np.random.default_rng(7), 600)
        if not (p.shape.graph is None and p.shape.rows[2] and p.shape.num_tokens < 256)
    ]
    fit = profile(points).fit
    small = StepShape(None, (1, 0, 1), (4, 0, 46), 1, 800, 46 * 300.0, 0, 0)
    large = StepShape(None, (1, 0, 1), (4, 0, 460), 8, 800, 460 * 300.0, 0, 0)
    assert fit.predict_us(small) is None
    assert fit.predict_us(large) == pytest.approx(law(large), rel=1e-6)
    spec_only = StepShape(None, (5, 0, 0), (20, 0, 0), 0, 800, 0.0, 0, 0)
    assert fit.predict_us(spec_only) == pytest.approx(law(spec_only), rel=1e-6)
    # No eager step under 256 tokens at all: the grid's nodes there were never measured.
    fit = profile([p for p in points if p.shape.graph is not None or p.shape.num_tokens >= 256]).fit
    assert fit.predict_us(spec_only) is None
    assert fit.predict_us(large) == pytest.approx(law(large), rel=1e-6)


def test_round_trip(tmp_path):
    original = profile(random_points(np.random.default_rng(2), 60))
    path = tmp_path / "profile.json"
    write_engine_profile(original, path)
    again = read_engine_profile(path)
    assert again.to_json() == original.to_json()
    shape = original.points[0].shape
    assert again.fit.predict_us(shape) == original.fit.predict_us(shape)


def test_setup_mismatch_is_named():
    p = profile(random_points(np.random.default_rng(3), 30))
    with pytest.raises(EngineProfileError, match="preset hidden_size = 32"):
        p.check_setup({"name": "tiny", "hidden_size": 64}, dict(p.planner))
    with pytest.raises(EngineProfileError, match="planner num_spec_tokens = 3"):
        p.check_setup(dict(p.preset), {"num_spec_tokens": 1})
    p.check_setup(dict(p.preset), {"num_spec_tokens": 3, "graph_sizes": (1, 8)})


def _good_document():
    return profile(random_points(np.random.default_rng(4), 20)).to_json()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x1f\x8b\x08\x00binary", "not a text file"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not an engine profile"),
        (json.dumps({**_good_document(), "version": 9}).encode(), "profile version 9"),
        (json.dumps({**_good_document(), "points": [{"graph": None}]}).encode(), "malformed"),
        (
            json.dumps(
                {**_good_document(), "points": [{**_good_document()["points"][0], "wall_us": -1}]}
            ).encode(),
            "wall_us must be positive",
        ),
    ],
)
def test_bad_files_are_one_error(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_bytes(content)
    with pytest.raises(EngineProfileError, match=message):
        read_engine_profile(path)
    with pytest.raises(EngineProfileError, match="cannot read"):
        read_engine_profile(tmp_path / "missing.json")


def test_the_shipped_mixed_profile_fits_its_settings_file():
    """The H200 profile in sim/data and docs/fidelity_h200.toml describe one setup: a
    fidelity or simulate run with that file is checked against the profile, not refused,
    and every point the profile measured is covered by its own fit."""
    from pathlib import Path

    from stepplan.sim.live import engine_setup
    from stepplan.sim.settings.config import load_config

    root = Path(__file__).resolve().parents[1]
    shipped = read_engine_profile(
        root / "sim" / "data" / "engine_profile_hybrid-8b_h200_mixed.json"
    )
    config = load_config(root / "docs" / "fidelity_h200.toml")
    shipped.check_setup(*engine_setup(config, config.plan))
    predicted = [shipped.fit.predict_us(point.shape) for point in shipped.points]
    assert None not in predicted
    measured = np.array([point.wall_us for point in shipped.points])
    assert float(np.mean(np.abs(np.array(predicted) / measured - 1))) < 0.05
