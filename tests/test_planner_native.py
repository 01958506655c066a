"""The compiled packer: plans equal to compile_plan's byte for byte, its errors, its
install-time build (optional, checked against its sources, numpy where it is missing) and
its refusal of malformed arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from malformed_arrays import malformed
from planner_strategies import step_batches

from stepplan.planner import (
    ExecutionPlan,
    PlanError,
    PlanLayout,
    Planner,
    PlannerConfig,
    PlanShape,
    StepBatch,
    compile_plan,
)
from stepplan.planner import native as native_module
from stepplan.planner.native import NativeBuildError

PLAN_FIELDS = [field.name for field in attrs.fields(ExecutionPlan)]

# Several groups, padding rows, long prefills (many tiles), more rows than the largest
# graph, graph sizes of every mode: the packer's every branch.
_BATCHES = st.one_of(
    step_batches(max_rows=40, max_groups=4),
    step_batches(max_rows=10, max_prefill=40, graph_modes=("mixed",)),
    step_batches(max_rows=80, max_groups=2, max_prefill=600),
)


def assert_same_plan(got: ExecutionPlan, want: ExecutionPlan) -> None:
    for name in PLAN_FIELDS:
        if name == "packed":
            assert got.packed.dtype == want.packed.dtype and got.packed.shape == want.packed.shape
            assert got.packed.tobytes() == want.packed.tobytes()
        else:
            assert getattr(got, name) == getattr(want, name), name
            assert type(getattr(got, name)) is type(getattr(want, name)), name
    assert not got.packed.flags.writeable


@settings(max_examples=300, deadline=None)
@given(st.lists(_BATCHES, min_size=1, max_size=4))
def test_native_plans_equal_numpy_plans_field_by_field(cases):
    planners: dict[PlannerConfig, tuple[Planner, Planner]] = {}
    for batch, config in cases + cases[:1]:  # the repeat hits the kept shapes
        native, numpy = planners.setdefault(
            config, (Planner(config, native=True), Planner(config, native=False))
        )
        want = compile_plan(batch, config)
        assert_same_plan(native.compile(batch), want)
        assert_same_plan(numpy.compile(batch), want)


def test_the_native_path_builds_plans_in_field_order():
    # Planner.compile passes ExecutionPlan's fields by position (a third cheaper).
    assert PLAN_FIELDS == [
        "batch",
        "config",
        "num_spec_rows",
        "num_decode_rows",
        "num_prefill_rows",
        "num_spec_decode_tokens",
        "num_decode_tokens",
        "num_prefill_tokens",
        "max_prefill_query_len",
        "num_tiles",
        "graph",
        "layout",
        "packed",
    ]


def _spec_batch(accepted=(2, 4), drafts=(3, 3), rows=2) -> StepBatch:
    return StepBatch(
        query_lens=[d + 1 for d in drafts][:rows] + [1] * (rows - 2),
        num_computed_tokens=[3] * rows,
        slots=list(range(1, rows + 1)),
        num_draft_tokens=list(drafts)[:rows] + [-1] * (rows - 2),
        num_accepted_tokens=list(accepted)[:rows] + [1] * (rows - 2),
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(_BATCHES, min_size=1, max_size=4))
def test_rows_shapes_reads_the_bound_arrays_as_written(cases):
    """Arrays bound once (a scheduler's rows), each batch written into them in place: the
    shape of their first R rows is compile's shape of the batch, natively and in numpy."""
    for made, config in cases:
        batch = attrs.evolve(made, num_padded_tokens=None)
        room = (batch.num_groups, len(batch.query_lens) + 5)
        held = [np.full(room[1:], 9, np.int32) for _ in range(4)] + [np.full(room, 9, np.int32)]
        lens, computed, drafts, accepted, slots = held
        shapes = [
            Planner(config, native=native).rows_shapes(
                lens, computed, slots if batch.num_groups > 1 else slots[0], drafts, accepted
            )
            for native in (True, False)
        ]
        for written in (made, batch):  # twice into the same arrays
            rows = _rows_of(attrs.evolve(written, num_padded_tokens=None))
            r = len(rows[0])
            lens[:r], computed[:r], drafts[:r], accepted[:r] = rows[0], rows[1], rows[3], rows[4]
            slots[:, :r] = rows[2]
            want = compile_plan(batch, config).shape
            assert [shape_of(r) for shape_of in shapes] == [want, want]


@pytest.mark.parametrize(
    ("batch", "config"),
    [
        (_spec_batch(accepted=(2, 0)), PlannerConfig(num_spec_tokens=3)),
        (_spec_batch(accepted=(5, 1)), PlannerConfig(num_spec_tokens=3)),
        (_spec_batch(drafts=(3, 4), accepted=(0, 1)), PlannerConfig(num_spec_tokens=3)),
        (_spec_batch(rows=5), PlannerConfig(num_spec_tokens=3, max_num_seqs=4)),
        (_spec_batch(rows=5, accepted=(9, 1)), PlannerConfig(num_spec_tokens=3, max_num_seqs=4)),
        (_spec_batch(), PlannerConfig(num_spec_tokens=2, graph_mode="mixed")),
    ],
)
def test_native_errors_are_compile_plans_word_for_word(batch, config):
    with pytest.raises(PlanError) as want:
        compile_plan(batch, config)
    for native in (True, False):
        with pytest.raises(PlanError) as got:
            Planner(config, native=native).compile(batch)
        assert str(got.value) == str(want.value)
        assert (got.value.field, got.value.row) == (want.value.field, want.value.row)


@settings(max_examples=100, deadline=None)
@given(step_batches(max_rows=20), st.data())
def test_a_bad_accepted_count_is_refused_as_compile_plan_refuses_it(case, data):
    batch, config = case
    spec_rows = np.flatnonzero(batch.kinds == 0)
    if not spec_rows.size:
        return
    accepted = batch.num_accepted_tokens.copy()
    row = data.draw(st.sampled_from(spec_rows.tolist()))
    accepted[row] = data.draw(st.sampled_from([0, -1, config.query_len_max + 1]))
    bad = attrs.evolve(batch, num_accepted_tokens=accepted)
    with pytest.raises(PlanError) as want:
        compile_plan(bad, config)
    with pytest.raises(PlanError) as got:
        Planner(config, native=True).compile(bad)
    assert str(got.value) == str(want.value)


def _rows_of(batch: StepBatch) -> tuple[np.ndarray, ...]:
    """The batch's arrays as a scheduler holds them: fresh int32 copies, writable."""
    return tuple(
        np.array(array, np.int32)
        for array in (
            batch.query_lens,
            batch.num_computed_tokens,
            batch.slots,
            batch.num_draft_tokens,
            batch.num_accepted_tokens,
        )
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_BATCHES, min_size=1, max_size=3), st.booleans())
def test_the_shape_of_rows_is_the_compiled_plans_shape(cases, wide):
    planners: dict[PlannerConfig, tuple[Planner, Planner]] = {}
    for made, config in cases + cases[:1]:  # the repeat hits the kept shapes
        batch = attrs.evolve(made, num_padded_tokens=None)
        native, numpy = planners.setdefault(
            config, (Planner(config, native=True), Planner(config, native=False))
        )
        rows = _rows_of(batch)
        if batch.num_groups == 1 and wide:  # one group as [R]; int64 takes the other path
            rows = (rows[0], rows[1], rows[2][0], rows[3].astype(np.int64), rows[4])
        want = compile_plan(batch, config).shape
        got = native.shape_of_rows(*rows)
        assert got == want and type(got) is PlanShape
        layout = want.layout
        assert (got.padded_tokens, got.padded_rows) == (layout.num_tokens, layout.num_rows)
        assert numpy.shape_of_rows(*rows) == want
        # the first R rows of longer arrays (a scheduler's), whatever the rows past them
        longer = tuple(
            np.concatenate([a, np.full((*a.shape[:-1], 3), 7, a.dtype)], -1) for a in rows
        )
        assert native.shape_of_rows(*longer, rows=len(batch.query_lens)) == want
        assert numpy.shape_of_rows(*longer, rows=len(batch.query_lens)) == want


@pytest.mark.parametrize(
    ("batch", "config"),
    [
        (_spec_batch(accepted=(2, 0)), PlannerConfig(num_spec_tokens=3)),
        (_spec_batch(drafts=(3, 4), accepted=(0, 1)), PlannerConfig(num_spec_tokens=3)),
        (_spec_batch(rows=5), PlannerConfig(num_spec_tokens=3, max_num_seqs=4)),
        (_spec_batch(), PlannerConfig(num_spec_tokens=2, graph_mode="mixed")),
    ],
)
def test_the_shape_of_rows_refuses_as_compile_plan_does(batch, config):
    with pytest.raises(PlanError) as want:
        compile_plan(batch, config)
    rows = list(_rows_of(batch))
    with pytest.raises(PlanError) as got:
        Planner(config, native=True).shape_of_rows(*rows)
    assert str(got.value) == str(want.value)
    rows[1] = rows[1].copy()
    rows[1][0] = -1  # a negative computed count: StepBatch's own error
    with pytest.raises(PlanError, match="num_computed_tokens"):
        Planner(config, native=True).shape_of_rows(*rows)


# -- the build ----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _config_and_batch() -> tuple[PlannerConfig, StepBatch]:
    return PlannerConfig(num_spec_tokens=3), _spec_batch()


def test_the_installed_extension_is_built_from_these_sources():
    # pip install builds it here and in CI; without it these tests compare numpy with numpy.
    module = native_module.load_packer()
    assert module.__name__ == "stepplan.planner._packer"
    assert native_module.source_digest(native_module.SOURCES) == module.SOURCE_DIGEST
    assert Planner(PlannerConfig(), native=None).native


@pytest.fixture
def not_installed(monkeypatch):
    """The extension as where the install could not build it."""
    monkeypatch.setitem(sys.modules, "stepplan.planner._packer", None)  # import fails


def test_without_the_extension_a_planner_warns_once_and_packs_with_numpy(not_installed):
    config, batch = _config_and_batch()
    with pytest.warns(RuntimeWarning) as caught:
        planner = Planner(config)
        plan = planner.compile(batch)
        planner.compile(batch)
    (warning,) = caught  # one per planner, when it is made
    message = str(warning.message)
    assert "packs plans with numpy" in message and "host time" in message
    assert "stepplan.planner._packer is not installed" in message and "pip install" in message
    assert not planner.native
    assert_same_plan(plan, compile_plan(batch, config))
    with pytest.raises(NativeBuildError, match="not installed"):
        Planner(config, native=True)


def test_native_false_never_asks_for_the_extension(not_installed):
    config, batch = _config_and_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        planner = Planner(config, native=False)
    assert not planner.native
    assert_same_plan(planner.compile(batch), compile_plan(batch, config))


def test_an_extension_built_from_other_sources_is_refused(monkeypatch):
    monkeypatch.setattr(native_module, "source_digest", lambda folder: "edited since the build")
    with pytest.raises(NativeBuildError, match="built from other C sources"):
        native_module.load_packer()
    assert native_module.installed_packer() is None
    with pytest.warns(RuntimeWarning, match="reinstall stepplan"):
        assert not Planner(PlannerConfig()).native


def test_a_failed_build_of_the_extension_leaves_the_install_going(tmp_path):
    # setup.py marks the extension optional: a compiler that fails is a warning, exit 0.
    pytest.importorskip("setuptools")
    command = [sys.executable, "setup.py", "-q", "build_ext", "-b", str(tmp_path / "lib")]
    command += ["-t", str(tmp_path / "tmp")]
    environment = {**os.environ, "CC": "false"}
    done = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert 'building extension "stepplan.planner._packer" failed' in done.stdout + done.stderr
    assert not list(tmp_path.rglob("*.so"))


# -- malformed arguments are refused before anything is written --------------------------


def _pack_arguments():
    config, batch = _config_and_batch()
    plan = compile_plan(batch, config)
    layout = plan.layout
    arrays = [
        np.full(layout.size + 16, 12345, dtype=np.int32),  # packed, with a guard tail
        batch.query_start,
        batch.num_computed_tokens,
        batch.num_accepted_tokens,
        batch.slots,
        batch.kinds,
    ]
    counts = [layout.num_tokens, layout.num_rows, layout.num_tiles, layout.num_groups, 4, 64]
    return arrays, counts, plan


def test_the_raw_packer_fills_exactly_the_layout():
    (guarded, *batch), counts, plan = _pack_arguments()
    packed = guarded[: plan.layout.size]
    found = native_module.load_packer().pack(packed, *batch, *counts)
    # The plan's counts as PlanShape orders them (its fields after num_padded_tokens).
    counts_at = PlanShape._fields.index("num_padded_tokens") + 1
    assert found == tuple(getattr(plan, name) for name in PlanShape._fields[counts_at:])
    assert found[:3] == (2, 0, 0) and found[3] == 8
    assert packed.tobytes() == plan.packed.tobytes()
    assert (guarded[plan.layout.size :] == 12345).all()


@pytest.mark.parametrize(
    ("position", "bad", "error", "names"),
    [
        (0, "short", ValueError, "packed"),
        (0, "long", ValueError, "packed"),
        (0, "read-only", ValueError, "packed"),
        (0, "int64", TypeError, "packed"),
        (0, "list", TypeError, "packed"),
        (1, "int64", TypeError, "query_start"),
        (1, "strided", ValueError, "query_start"),
        (1, "decreasing", ValueError, "query_start"),
        (1, "offset", ValueError, "query_start"),
        (2, "short", ValueError, "num_computed_tokens"),
        (3, "uint32", TypeError, "num_accepted_tokens"),
        (4, "strided", ValueError, "slots"),
        (4, "short", ValueError, "slots"),
        (5, "short", ValueError, "kinds"),
        (5, "int32", TypeError, "kinds"),
        (5, "kind 7", ValueError, "kinds"),
        (6, "rows", ValueError, "packed"),
        (7, "-1", ValueError, "num_rows"),
        (9, "0", ValueError, "num_groups"),
        (8, "text", TypeError, "num_tiles"),
    ],
)
def test_malformed_arguments_are_refused_naming_them(position, bad, error, names):
    (guarded, *batch), counts, plan = _pack_arguments()
    arguments = [guarded[: plan.layout.size], *batch, *counts]
    own = {
        "long": lambda _: guarded[: plan.layout.size + 1],
        "read-only": lambda _: plan.packed,  # the plan's own buffer
        "kind 7": lambda _: np.array([0, 7], dtype=np.int8),
        "decreasing": lambda _: np.array([0, 8, 4], dtype=np.int32),
        "offset": lambda _: np.array([1, 5, 9], dtype=np.int32),
        "rows": lambda _: 1,  # a layout of one token: not the buffer's
        "-1": lambda _: -1,
        "0": lambda _: 0,
        "text": lambda _: "4",
    }
    value = arguments[position]
    arguments[position] = own[bad](value) if bad in own else malformed(value, bad)
    with pytest.raises(error, match=names):
        native_module.load_packer().pack(*arguments)
    assert (guarded[plan.layout.size :] == 12345).all()


def test_the_packer_refuses_to_write_into_the_batch():
    (_, starts, *batch), counts, plan = _pack_arguments()
    memory = np.zeros(plan.layout.size + starts.size, dtype=np.int32)
    shared_starts = memory[-starts.size :]
    shared_starts[:] = starts
    packed = memory[1 : plan.layout.size + 1]  # its last entries are the query starts read
    with pytest.raises(ValueError, match="shares memory"):
        native_module.load_packer().pack(packed, shared_starts, *batch, *counts)


def test_a_layout_too_small_for_the_batch_is_refused():
    (_, *batch), counts, _ = _pack_arguments()
    tokens, groups = counts[0], counts[3]
    packed = np.zeros(PlanLayout(tokens, 1, 0, groups).size, dtype=np.int32)  # 1 row, 2 live
    with pytest.raises(ValueError, match="exceed the layout"):
        native_module.load_packer().pack(packed, *batch, tokens, 1, 0, groups, 4, 64)


def test_prefill_tiles_counts_and_checks():
    packer = native_module.load_packer()
    lens, kinds = np.array([1, 65, 0, 128], np.int32), np.array([1, 2, 3, 2], np.int8)
    assert packer.prefill_tiles(lens, kinds, 64) == 4
    with pytest.raises(ValueError, match="kinds"):
        packer.prefill_tiles(lens, kinds[:3], 64)
    with pytest.raises(TypeError, match="query_lens"):
        packer.prefill_tiles(lens.astype(np.int64), kinds, 64)
    with pytest.raises(ValueError, match="tile"):
        packer.prefill_tiles(lens, kinds, 0)
    with pytest.raises(TypeError, match="3 arguments"):
        packer.prefill_tiles(lens, kinds)


@pytest.mark.parametrize("groups", [1, 4, 5])
@pytest.mark.parametrize("rows", [1, 255, 256, 257, 1000])
def test_the_shape_of_rows_is_the_same_on_either_side_of_the_stack_scratch(rows, groups):
    # shape_counts copies a batch of up to 256 rows of up to 4 groups to the stack, a
    # larger one to the heap: both give compile's shape (spec, decode and prefill rows)
    kind = np.arange(rows) % 3
    batch = StepBatch(
        query_lens=np.where(kind == 0, 4, np.where(kind == 1, 1, 7)),
        num_computed_tokens=np.where(kind == 2, 0, 9),
        slots=np.tile(np.arange(1, rows + 1), (groups, 1))
        if groups > 1
        else np.arange(1, rows + 1),
        num_draft_tokens=np.where(kind == 0, 3, -1),
        num_accepted_tokens=np.where(kind == 0, 2, 1),
    )
    config = PlannerConfig(num_spec_tokens=3, max_num_seqs=1000)
    want = compile_plan(batch, config).shape
    assert Planner(config, native=True).shape_of_rows(*_rows_of(batch)) == want
    assert Planner(config, native=False).shape_of_rows(*_rows_of(batch)) == want
