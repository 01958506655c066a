"""``Planner.pack_host_step``: a host step's plan bytes without the batch or the plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from planner_strategies import step_batches

from stepplan.planner import (
    FIELDS,
    SUMMARY,
    PlanError,
    Planner,
    PlannerConfig,
    host_ints,
    host_step_batch,
    plan_summary,
)

NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])


def addressed(values):
    """``values`` (int32 numpy or None) as a :func:`host_ints` tuple of its memory."""
    return None if values is None else (values.ctypes.data, len(values))


def host_inputs(batch, offset: int, extra: int, drafts_given: bool):
    """The batch's host data as an engine passes it: query starts from ``offset`` (not
    necessarily 0) with ``extra`` entries past the rows, drafts (or None) likewise."""
    starts = offset + np.concatenate([[0], np.cumsum(batch.query_lens)])
    starts = np.concatenate([starts, np.full(extra, starts[-1])]).astype(np.int32)
    drafts = None
    if drafts_given:
        drafts = np.concatenate([batch.num_draft_tokens, np.zeros(extra, np.int32)])
        drafts = drafts.astype(np.int32)
    return starts, drafts


@NATIVE
@settings(max_examples=150, deadline=None)
@given(
    case=step_batches(),
    offset=st.integers(0, 50),
    extra=st.integers(0, 3),
    drafts_given=st.booleans(),
    slack=st.integers(0, 40),
)
def test_the_bytes_and_shape_are_the_compiled_plans(
    native, case, offset, extra, drafts_given, slack
):
    batch, config = case
    assume(drafts_given or not (batch.num_draft_tokens >= 0).any())
    starts, drafts = host_inputs(batch, offset, extra, drafts_given)
    rows, groups = batch.num_rows, batch.num_groups
    padded = batch.num_padded_tokens
    planner = Planner(config, native=native)
    want = planner.compile(
        host_step_batch(starts, drafts, rows, num_padded_tokens=padded, num_groups=groups)
    )
    out = np.full(want.layout.size + slack, 7, np.int32)
    summary = np.full(len(SUMMARY) + 2, 7, np.int32)
    shape = planner.pack_host_step(
        out, starts, drafts, rows, num_padded_tokens=padded, num_groups=groups, summary=summary
    )
    assert shape == want.shape
    # The summary: the plan's counts, and where each of its fields lies in the bytes.
    assert summary[: len(SUMMARY)].tolist() == list(plan_summary(want.shape))
    assert (summary[len(SUMMARY) :] == 7).all()
    words = dict(zip(SUMMARY, summary.tolist(), strict=False))
    assert words["num_tokens"] == want.num_tokens and words["layout.size"] == want.layout.size
    assert words["num_spec_rows"] == want.num_spec_rows
    assert words["layout.num_rows"] == want.layout.num_rows
    for name, _, _ in FIELDS:  # each start, and the next field's (or the size) after it
        at = SUMMARY.index(f"start:{name}")
        begin, end = summary[at], summary[at + 1]
        np.testing.assert_array_equal(out[begin:end].reshape(-1), want.array(name).reshape(-1))
    np.testing.assert_array_equal(out[: want.layout.size], want.packed)
    assert (out[want.layout.size :] == 7).all()  # nothing past the plan
    # The placeholders: no computed tokens, one accepted token, NULL slots.
    assert not want.batch.num_computed_tokens.any() and not want.batch.slots.any()
    assert (want.batch.num_accepted_tokens == 1).all()
    # The same memory passed by address packs the same bytes, on either path.
    again = np.full_like(out, 7)
    shape = planner.pack_host_step(
        again, addressed(starts), addressed(drafts), rows,
        num_padded_tokens=padded, num_groups=groups,
    )  # fmt: skip
    assert shape == want.shape
    np.testing.assert_array_equal(again, out)


@NATIVE
def test_a_short_buffer_is_refused_before_anything_is_written(native):
    config = PlannerConfig(num_spec_tokens=3, graph_mode="none")
    starts, drafts = np.array([0, 4, 5, 105], np.int32), np.array([3, -1, -1], np.int32)
    planner = Planner(config, native=native)
    size = planner.pack_host_step(np.empty(4096, np.int32), starts, drafts, 3).layout.size
    out = np.full(size - 1, 7, np.int32)
    with pytest.raises(ValueError, match=rf"out: {size - 1} entries, the plan needs {size}"):
        planner.pack_host_step(out, starts, drafts, 3)
    assert (out == 7).all()


@NATIVE
@pytest.mark.parametrize("mode", ["none", "full"])
def test_a_bad_summary_is_refused_before_anything_is_written(native, mode):
    """Too short, inside the plan's own bytes or over the step's arrays: refused, neither
    the plan nor the summary written."""
    config = PlannerConfig(num_spec_tokens=3, graph_mode=mode)
    host = np.zeros(2 * len(SUMMARY), np.int32)
    starts, drafts = host[:4], host[4:7]
    starts[:], drafts[:] = [0, 4, 8, 12], [3, 3, 3]
    planner = Planner(config, native=native)
    out = np.full(4096, 7, np.int32)
    for summary, message in (
        (np.zeros(len(SUMMARY) - 1, np.int32), "summary: too short"),
        (out[10 : 10 + len(SUMMARY)], "summary: shares memory"),
        (host[: len(SUMMARY)], "summary: shares memory"),
        (host[6 : 6 + len(SUMMARY)], "summary: shares memory"),
    ):
        before = host.copy()
        with pytest.raises(ValueError, match=message):
            planner.pack_host_step(out, starts, drafts, 3, summary=summary)
        assert (out == 7).all()
        np.testing.assert_array_equal(host, before)


@NATIVE
@pytest.mark.parametrize(
    ("starts", "drafts", "padded", "message"),
    [
        ([0, 4, 3], [3, -1], None, r"^query_lens\[1\]: must be >= 0"),
        ([0, 3, 4], [3, -1], None, r"^query_lens\[0\]: spec row must schedule"),
        ([0, 4, 5], [3, -2], None, r"^num_draft_tokens\[1\]"),
        ([0, 6, 7], [5, -1], None, r"num_spec_tokens"),
        ([0, 4, 5], [3, -1], 4, r"^num_padded_tokens: 4 is fewer than the 5 tokens"),
        ([0, 4], [3, -1], None, r"^query_start: needs num_reqs \+ 1 = 3 entries"),
        ([0, 4, 5], [3], None, r"^num_draft_tokens: needs num_reqs = 2 entries"),
    ],
)
def test_bad_steps_get_the_batchs_errors(native, starts, drafts, padded, message):
    """Whatever the path, a step the rules refuse raises the error StepBatch and
    compile_plan raise, naming the field (and nothing is written)."""
    config = PlannerConfig(num_spec_tokens=3, graph_mode="full", max_num_seqs=8)
    out = np.full(1024, 7, np.int32)
    args = (np.array(starts, np.int32), np.array(drafts, np.int32), 2)
    with pytest.raises(PlanError, match=message):
        Planner(config, native=native).pack_host_step(out, *args, num_padded_tokens=padded)
    with pytest.raises(PlanError, match=message):  # the same memory passed by address
        Planner(config, native=native).pack_host_step(
            out, addressed(args[0]), addressed(args[1]), 2, num_padded_tokens=padded
        )
    assert (out == 7).all()


def test_host_ints_read_the_memory_they_name():
    values = np.array([5, -1, 7], np.int32)
    read = host_ints(addressed(values))
    assert read.tolist() == [5, -1, 7] and not read.flags.writeable
    values[1] = 2  # a view, not a copy
    assert read.tolist() == [5, 2, 7]
    assert host_ints((0, 0)).tolist() == []
    assert host_ints(values) is values
    for bad in ((0, 3), (values.ctypes.data, -1), (values.ctypes.data, 3, 0), (1.5, 2)):
        with pytest.raises(ValueError, match="host ints: "):
            host_ints(bad)
    # A malformed tuple the packer refuses reaches the same clear error, nothing written.
    out = np.full(64, 7, np.int32)
    for native in (True, False):
        with pytest.raises(ValueError, match="host ints: "):
            Planner(PlannerConfig(), native=native).pack_host_step(out, (0, 3), None, 2)
    assert (out == 7).all()


@pytest.mark.parametrize("mode", ["none", "full", "mixed"])
def test_too_many_rows_get_compile_plans_error(mode):
    """Whether the step runs eagerly or may replay a graph (pure decode), the limits are
    checked before anything is written."""
    config = PlannerConfig(num_spec_tokens=0, graph_mode=mode, max_num_seqs=2)
    starts = np.arange(4, dtype=np.int32)  # three decode rows
    out = np.full(256, 7, np.int32)
    with pytest.raises(PlanError, match="max_num_seqs"):
        Planner(config).pack_host_step(out, starts, None, 3)
    with pytest.raises(PlanError, match="num_padded_tokens: 2 is fewer than the 3 tokens"):
        Planner(PlannerConfig(num_spec_tokens=0, graph_mode=mode)).pack_host_step(
            out, starts, None, 3, num_padded_tokens=2
        )
    assert (out == 7).all()


def test_other_dtypes_take_the_batchs_path_to_the_same_bytes():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="mixed")
    starts32 = np.array([0, 4, 5, 105, 105], np.int32)
    drafts32 = np.array([3, -1, -1, -1], np.int32)
    planner = Planner(config)
    one, other = np.zeros(4096, np.int32), np.zeros(4096, np.int32)
    shape = planner.pack_host_step(one, starts32, drafts32, 4, num_padded_tokens=110)
    again = planner.pack_host_step(
        other, starts32.astype(np.int64), drafts32.tolist(), 4, num_padded_tokens=110
    )
    assert shape == again and shape.graph is not None
    np.testing.assert_array_equal(one, other)


def _expected_host_bytes(starts, drafts, rows):
    """What ``host_bytes`` must give, read with numpy."""
    drafts_bytes = None if drafts is None else drafts[:rows].tobytes()
    return starts[: rows + 1].tobytes(), drafts_bytes, int(starts[rows]) - int(starts[0])


@settings(max_examples=120, deadline=None)
@given(
    rows=st.integers(0, 40),
    extra=st.integers(0, 3),
    dtypes=st.sampled_from([(np.int32, np.int32), (np.int64, np.int32), (np.int64, np.int64)]),
    drafts_given=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_host_bytes_are_the_arrays_bytes_and_keep_an_equal_answer(
    rows, extra, dtypes, drafts_given, seed
):
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.integers(-3, 9, rows + 1 + extra)).astype(dtypes[0])
    drafts = rng.integers(-1, 4, rows + extra).astype(dtypes[1]) if drafts_given else None
    host_bytes = Planner(PlannerConfig(num_spec_tokens=3), native=True).host_bytes
    want = _expected_host_bytes(starts, drafts, rows)
    got = host_bytes(starts, drafts, rows, None)
    assert got == want
    if dtypes == (np.int32, np.int32):  # int32 memory passed by address: the same answer
        assert host_bytes(addressed(starts), addressed(drafts), rows, None) == want
        assert host_bytes(addressed(starts), addressed(drafts), rows, got) is got
    # An earlier equal answer comes back itself; any other value gives a new answer.
    assert host_bytes(starts.copy(), None if drafts is None else drafts.copy(), rows, got) is got
    changed = starts.copy()
    changed[rng.integers(0, rows + 1)] += 1
    other = host_bytes(changed, drafts, rows, got)
    assert other is not got and other == _expected_host_bytes(changed, drafts, rows)
    if drafts is not None and rows:
        changed = drafts.copy()
        changed[rng.integers(0, rows)] += 1
        other = host_bytes(starts, changed, rows, got)
        assert other is not got and other == _expected_host_bytes(starts, changed, rows)


def test_host_bytes_leave_other_arrays_to_the_caller():
    host_bytes = Planner(PlannerConfig(num_spec_tokens=3), native=True).host_bytes
    starts, drafts = np.arange(9, dtype=np.int32), np.zeros(8, np.int32)
    for args in (
        (starts[::2], None, 2),  # not contiguous
        (starts.reshape(3, 3), None, 2),  # not 1-D
        (starts.astype(np.float32), None, 2),  # not integers
        (starts.astype(np.int16), None, 2),  # other widths
        (starts, drafts, 9),  # too short for the rows
        (starts, drafts[:3], 4),
        (starts.tolist(), None, 2),  # not an array
        (starts, None, -1),
        ((starts.ctypes.data, 2), None, 2),  # an address too short for the rows
        ((starts.ctypes.data,), None, 2),  # not (address, items)
        ((starts.ctypes.data, -1), None, 0),
        ((0, 3), None, 2),  # no address
    ):
        assert host_bytes(*args, None) is None
    assert (
        Planner(PlannerConfig(num_spec_tokens=3), native=False).host_bytes(starts, drafts, 2, None)
        is None
    )
