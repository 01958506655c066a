"""StepBatch's compiled checks (``check_batch`` in csrc/check.c): the same batches and the
same errors as the numpy checks, and the C function's refusal of malformed arguments.

The numpy path is forced by replacing ``batch.native_check`` (the one place StepBatch asks
for the compiled check) with a function that returns ``None``, as where the extension is
not installed.
"""

from __future__ import annotations

import warnings
from unittest import mock

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from malformed_arrays import malformed

from stepplan.planner import PlanError, StepBatch
from stepplan.planner import batch as batch_module
from stepplan.planner import native as native_module

FIELDS = [field.name for field in attrs.fields(StepBatch)]
INT32_MAX = 2**31 - 1


def numpy_only():
    """StepBatch validates with numpy within this context."""
    return mock.patch.object(batch_module, "native_check", lambda: None)


def outcome(make):
    """``("ok", batch)`` or ``("error", (message, field, row))`` of ``make()``."""
    try:
        return "ok", make()
    except PlanError as error:
        return "error", (str(error), error.field, error.row)


def assert_same_batch(got: StepBatch, want: StepBatch) -> None:
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), name
            assert not a.flags.writeable, name
            assert a.flags.c_contiguous, name
        else:
            assert a == b and type(a) is type(b), name
            if isinstance(b, tuple):
                assert [type(x) for x in a] == [type(x) for x in b], name


@st.composite
def raw_batches(draw: st.DrawFn) -> dict:
    """StepBatch keywords, valid or broken in one or more of the ways SPEC §3.6 refuses:
    negative lengths, spec lengths that are not drafts + 1, token totals past int32,
    negative, NULL or repeated live slots in any group (small slots take the bytemap, large
    ones the hash set), padding rows on any slot, too few padded rows or tokens, rows that
    disagree between fields. Inputs come as int32 arrays (contiguous, strided or read-only),
    int64 arrays or lists."""
    rows = draw(st.integers(0, 10))
    groups = draw(st.integers(1, 3))
    kinds = draw(st.lists(st.sampled_from("sdpz"), min_size=rows, max_size=rows))
    drafts = [draw(st.integers(0, 3)) if kind == "s" else -1 for kind in kinds]
    lens = [
        {"s": d + 1, "d": 1, "z": 0}.get(k, draw(st.integers(2, 50)))
        for k, d in zip(kinds, drafts, strict=True)
    ]
    computed = draw(st.lists(st.integers(0, 9), min_size=rows, max_size=rows))
    accepted = draw(st.lists(st.integers(0, 5), min_size=rows, max_size=rows))
    big = draw(st.sampled_from([0, 20_000, INT32_MAX - 64]))  # bytemap, or the hash set
    pool = draw(st.integers(1, 3 * rows + 2))  # small pools repeat slots
    odd = st.sampled_from([0, -1, -5, big + 1])
    plain = st.integers(1, pool).map(lambda s: big + s)
    slot = st.integers(0, 19).flatmap(lambda i: odd if i == 0 else plain)  # 1 in 20 odd
    slots = draw(
        st.lists(st.lists(slot, min_size=rows, max_size=rows), min_size=groups, max_size=groups)
    )
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # spoil a length or a count
        if rows:
            row = draw(st.integers(0, rows - 1))
            target = draw(st.sampled_from([lens, drafts, computed]))
            target[row] = draw(st.sampled_from([-1, -2, 0, 1, 2, 5]))
    if rows >= 2 and draw(st.integers(0, 9)) == 0:  # two huge prefills: past int32 in all
        for row in (0, rows - 1):
            lens[row], drafts[row] = 2**30 + draw(st.integers(-1, 1)), -1
    fields = {
        "query_lens": lens,
        "num_computed_tokens": computed,
        "slots": slots,
        "num_draft_tokens": drafts,
        "num_accepted_tokens": accepted,
    }
    if rows and draw(st.integers(0, 9)) == 0:  # one field a row short
        name = draw(st.sampled_from(sorted(fields)))
        fields[name] = [row[:-1] for row in slots] if name == "slots" else fields[name][:-1]
    for name in fields:
        form = draw(st.sampled_from(["int32", "int64", "list", "strided", "read-only"]))
        if form != "list":
            array = np.array(fields[name], dtype=np.int64 if form == "int64" else np.int32)
            if form == "strided":  # every other entry of a wider array
                array = np.repeat(array, 2, axis=-1)[..., ::2]
            array.flags.writeable = form != "read-only"
            fields[name] = array
    if groups == 1 and draw(st.booleans()):
        fields["slots"] = np.asarray(fields["slots"])[0]  # 1-D: one group
    total = sum(lens)
    fields["num_padded_rows"] = draw(st.sampled_from([None, rows, rows + 3, rows - 1]))
    fields["num_padded_tokens"] = draw(st.sampled_from([None, total, total + 5, total - 1]))
    return {**fields, "allow_null_slots": draw(st.booleans())}


def test_the_compiled_check_is_in_use_here():
    # pip install builds the extension on every machine these tests run on; without it
    # they compare numpy with numpy.
    assert batch_module.native_check() is not None


@settings(max_examples=1500, deadline=None)
@given(raw_batches())
def test_native_checks_build_the_numpy_batch_or_raise_its_error(fields):
    got = outcome(lambda: StepBatch(**fields))
    with numpy_only():
        want = outcome(lambda: StepBatch(**fields))
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        assert_same_batch(got[1], want[1])
        # and the compiled check accepted it itself (its copies share one buffer): a
        # check that refused valid batches would fall back to numpy unseen
        buffer = got[1].query_start.base
        assert buffer is not None and got[1].query_lens.base is buffer
    else:
        assert got[1] == want[1]


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ({}, None),
        ({"slots": [[5, 6, 7, 5], [1, 2, 3, 3]]}, None),  # the padding row's slot is ignored
        ({"slots": [5, 0, 7, -1], "allow_null_slots": True}, None),
        ({"query_lens": [1, 2, -1, 0]}, ("query_lens", 2)),
        ({"num_computed_tokens": [0, 0, 0, -3]}, ("num_computed_tokens", 3)),
        ({"num_draft_tokens": [1, -2, -1, -1]}, ("num_draft_tokens", 1)),
        ({"query_lens": [3, 1, 7, 0]}, ("query_lens", 0)),
        ({"query_lens": [2, 1, INT32_MAX - 2, 0]}, ("query_lens", None)),
        ({"slots": [5, 6, -7, -1]}, ("slots", 2)),
        ({"slots": [5, 0, 7, -1]}, ("slots", 1)),
        ({"slots": [5, 6, 5, 5]}, ("slots", 2)),
        ({"slots": [[5, 6, 7, 5], [1, 2, 2, 3]]}, ("slots", 2)),
        ({"slots": [[5, 6, 7, 5], [1, 2 + 10**6, 2 + 10**6, 3]]}, ("slots", 2)),
        ({"slots": [[1, 2, 3]]}, ("slots", None)),
        ({"num_accepted_tokens": [1, 1]}, ("num_accepted_tokens", None)),
        ({"slots": np.zeros((0, 4), np.int32)}, ("slots", None)),
        ({"num_padded_rows": 3}, ("num_padded_rows", None)),
        ({"num_padded_tokens": 7}, ("num_padded_tokens", None)),
    ],
)
def test_each_check_passes_or_fails_alike_on_both_paths(overrides, refused):
    fields = {
        "query_lens": [2, 1, 5, 0],
        "num_computed_tokens": [0, 4, 0, 0],
        "slots": [5, 6, 7, -1],
        "num_draft_tokens": [1, -1, -1, -1],
        "num_accepted_tokens": [1, 1, 1, 1],
        **overrides,
    }
    got = outcome(lambda: StepBatch(**fields))
    with numpy_only():
        want = outcome(lambda: StepBatch(**fields))
    if refused is None:
        assert got[0] == want[0] == "ok"
        assert_same_batch(got[1], want[1])
    else:
        assert got[0] == want[0] == "error"
        assert got[1] == want[1] and got[1][1:] == refused


def test_many_rows_take_the_heap_hash_set():
    rows = 3000
    slots = np.arange(10**6, 10**6 + 2 * rows, 2, dtype=np.int32)[None].repeat(2, 0)
    fields = {
        "query_lens": np.ones(rows, np.int32),
        "num_computed_tokens": np.zeros(rows, np.int32),
        "slots": slots,
        "num_draft_tokens": np.full(rows, -1, np.int32),
        "num_accepted_tokens": np.ones(rows, np.int32),
    }
    batch = StepBatch(**fields)
    with numpy_only():
        assert_same_batch(batch, StepBatch(**fields))
    slots[1, -1] = slots[1, 7]
    for context in (mock.MagicMock(), numpy_only()):
        with context, pytest.raises(PlanError, match=r"slots\[2999\]: slot 1000014 of group 1"):
            StepBatch(**fields)


def test_without_the_extension_batches_validate_with_numpy_quietly(monkeypatch):
    monkeypatch.setattr(batch_module, "_INSTALLED", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = StepBatch(
            query_lens=[2, 1],
            num_computed_tokens=[0, 0],
            slots=[3, 4],
            num_draft_tokens=[1, -1],
            num_accepted_tokens=[1, 1],
        )
    assert batch.kind_counts == (1, 1, 0, 0) and batch.query_start.tolist() == [0, 2, 3]


# -- the C function's own argument checks -------------------------------------------------


def _arguments(rows: int = 3, groups: int = 2):
    arrays = [
        np.array([1, 2, 1][:rows], np.int32),
        np.zeros(rows, np.int32),
        np.array([-1, -1, 0][:rows], np.int32),
        np.ones(rows, np.int32),
        np.arange(1, groups * rows + 1, dtype=np.int32).reshape(groups, rows),
    ]
    data = np.empty((5 + groups) * rows + 1, np.int32)
    return [*arrays, False, data, np.empty(rows, np.int8)]


def test_check_batch_copies_checks_and_derives():
    arguments = _arguments()
    assert native_module.load_packer().check_batch(*arguments) == (1, 1, 1, 0)
    data, kinds = arguments[6:]
    inputs = np.concatenate([array.ravel() for array in arguments[:5]])
    assert data[: inputs.size].tolist() == inputs.tolist()
    assert data[inputs.size :].tolist() == [0, 1, 3, 4] and kinds.tolist() == [1, 2, 0]


def test_check_batch_copies_inputs_at_any_strides():
    arguments = _arguments(groups=3)
    expected = np.concatenate([array.ravel() for array in arguments[:5]])
    # the same values read backwards from the end, every other entry, column by column
    arguments[0] = arguments[0][::-1].copy()[::-1]
    arguments[1] = np.repeat(arguments[1], 2)[::2]
    arguments[2] = arguments[2][::-1].copy()[::-1]
    arguments[3] = np.repeat(arguments[3], 2)[::2]
    arguments[4] = np.asfortranarray(arguments[4])
    assert native_module.load_packer().check_batch(*arguments) == (1, 1, 1, 0)
    assert arguments[6][: expected.size].tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("position", "bad", "error", "names"),
    [
        (0, "int64", TypeError, "query_lens"),
        (1, "text", TypeError, "num_computed_tokens"),
        (2, "list", TypeError, "num_draft_tokens"),
        (3, "int64", TypeError, "num_accepted_tokens"),
        (4, "uint32", TypeError, "slots"),
        (6, "int8", TypeError, "data"),
        (6, "short", ValueError, "data"),
        (6, "strided", ValueError, "data"),
        (7, "int32", TypeError, "kinds"),
        (7, "short", ValueError, "kinds"),
        (7, "read-only", ValueError, "kinds"),
        (6, "aliased", ValueError, "data: shares memory with query_lens"),
    ],
)
def test_malformed_arguments_are_refused_naming_them(position, bad, error, names):
    arguments = _arguments()
    value = arguments[position]
    guarded = np.full(arguments[6].size + 8, 77, np.int32)  # data over query_lens, a guard
    own = {"text": lambda: "0, 0, 0", "aliased": lambda: guarded[: value.size]}
    arguments[position] = own[bad]() if bad in own else malformed(value, bad)
    if bad == "aliased":
        arguments[0] = guarded[-11:-8]  # the last query lengths under the data's end
    with pytest.raises(error, match=names):
        native_module.load_packer().check_batch(*arguments)
    assert (guarded[-8:] == 77).all()


@pytest.mark.parametrize(
    ("position", "spoil"),
    [
        (1, lambda value: value[:2]),
        (3, lambda value: value[:2]),
        (0, lambda value: value[None]),  # 2-D
        (4, lambda value: value[:, :2]),
        (4, lambda value: value[0]),  # 1-D
        (4, lambda value: value[:0]),  # no group
    ],
)
def test_rows_that_disagree_are_left_to_numpy_to_name(position, spoil):
    arguments = _arguments()
    arguments[position] = spoil(arguments[position])
    assert native_module.load_packer().check_batch(*arguments) is None


def test_check_batch_takes_eight_arguments():
    with pytest.raises(TypeError, match="8 arguments"):
        native_module.load_packer().check_batch(*_arguments()[:7])
