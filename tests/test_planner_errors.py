"""Every invalid input of SPEC §3.6 is refused with a PlanError naming its field and row."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest
import torch

from stepplan.planner import PlanError, PlannerConfig, StepBatch, compile_plan

CONFIG = PlannerConfig(num_spec_tokens=3, max_num_seqs=8)


def good(**overrides):
    fields = dict(
        query_lens=[4, 1, 6, 0],
        num_computed_tokens=[10, 3, 0, 0],
        slots=[[1, 2, 3, 0], [5, 6, 7, 0]],
        num_draft_tokens=[3, -1, -1, -1],
        num_accepted_tokens=[2, 1, 1, 1],
    )
    fields.update(overrides)
    return fields


def refused(field, row, **overrides):
    with pytest.raises(PlanError) as caught:
        compile_plan(StepBatch(**good(**overrides)), CONFIG)
    assert caught.value.field == field and caught.value.row == row
    prefix = field if row is None else f"{field}[{row}]"
    assert str(caught.value).startswith(prefix + ":")
    return str(caught.value)


def test_the_good_batch_plans():
    assert compile_plan(StepBatch(**good()), CONFIG).num_rows == 3


@pytest.mark.parametrize(
    ("field", "row", "overrides"),
    [
        ("query_lens", 2, {"query_lens": [4, 1, -6, 0]}),
        ("num_computed_tokens", 1, {"num_computed_tokens": [10, -3, 0, 0]}),
        ("num_draft_tokens", 3, {"num_draft_tokens": [3, -1, -1, -2]}),
        ("query_lens", 0, {"query_lens": [3, 1, 6, 0]}),  # spec q != drafts + 1
        ("slots", 1, {"slots": [[1, 0, 3, 0], [5, 6, 7, 0]]}),  # live row on NULL
        ("slots", 2, {"slots": [[1, 2, 3, 0], [5, 6, 5, 0]]}),  # slot twice in group 1
        ("slots", 2, {"slots": [[1, 2, 3, 0], [5, 6, -7, 0]]}),
        ("num_accepted_tokens", 0, {"num_accepted_tokens": [0, 1, 1, 1]}),
        ("num_accepted_tokens", 0, {"num_accepted_tokens": [5, 1, 1, 1]}),
        ("num_draft_tokens", 0, {"num_draft_tokens": [4, -1, -1, -1], "query_lens": [5, 1, 6, 0]}),
        ("num_computed_tokens", None, {"num_computed_tokens": [1, 2, 3]}),
        ("slots", None, {"slots": [[1, 2, 3], [4, 5, 6]]}),
        ("num_padded_tokens", None, {"num_padded_tokens": 10}),
        ("num_padded_rows", None, {"num_padded_rows": 3}),
        ("query_lens", None, {"query_lens": [4.0, 1.5, 6.0, 0.0]}),
        ("query_lens", None, {"query_lens": [[4, 1, 6, 0]]}),
        ("num_accepted_tokens", None, {"num_accepted_tokens": [[1, 2], [3]]}),
    ],
)
def test_bad_input_is_refused_naming_field_and_row(field, row, overrides):
    refused(field, row, **overrides)


def test_more_live_rows_than_capacity():
    rows = 10
    fields = good(
        query_lens=[1] * rows,
        num_computed_tokens=[0] * rows,
        slots=np.arange(1, rows + 1),
        num_draft_tokens=[-1] * rows,
        num_accepted_tokens=[1] * rows,
    )
    with pytest.raises(PlanError, match=r"query_lens\[8\]: 10 live rows exceed max_num_seqs = 8"):
        compile_plan(StepBatch(**fields), CONFIG)


def test_a_token_total_past_int32_is_refused():
    with pytest.raises(PlanError, match=r"query_lens: total \d+ tokens do not fit int32"):
        StepBatch(**good(query_lens=[2**31 - 1, 1, 6, 0]))


def test_messages_say_what_is_wrong():
    assert "already used by live row 0" in refused("slots", 2, slots=[[1, 2, 3, 0], [5, 6, 5, 0]])
    assert "NULL slot 0" in refused("slots", 1, slots=[[1, 0, 3, 0], [5, 6, 7, 0]])
    assert "outside 1..Q = 1..4" in refused(
        "num_accepted_tokens", 0, num_accepted_tokens=[5, 1, 1, 1]
    )


def test_padding_rows_may_carry_any_slot_and_null_rows_can_be_allowed():
    # vLLM marks padded rows with PAD_SLOT_ID = -1; a padding row's slot is never used.
    padding_on_live_slot = good(slots=[[1, 2, 3, 2], [5, 6, 7, -1]])
    plan = compile_plan(StepBatch(**padding_on_live_slot), CONFIG)
    assert plan.row_slot.tolist() == [[1, 2, 3], [5, 6, 7]]
    null_live = good(slots=[[1, 0, 3, 0], [5, 0, 7, 0]], allow_null_slots=True)
    plan = compile_plan(StepBatch(**null_live), CONFIG)
    assert plan.row_slot[:, :3].tolist() == [[1, 0, 3], [5, 0, 7]]


def test_a_negative_live_slot_is_reported_on_its_own_row_past_padding():
    # A padding row marked -1 comes first; the error must name the live row and its slot.
    for slots, message in (
        ([-1, -5], r"slots\[1\]: negative slot -5 in group 0"),
        ([[-1, 2, 3], [-1, 6, -5]], r"slots\[2\]: negative slot -5 in group 1"),
    ):
        rows = np.shape(slots)[-1]
        fields = dict(
            query_lens=[0] + [1] * (rows - 1),
            num_computed_tokens=[0] * rows,
            slots=slots,
            num_draft_tokens=[-1] * rows,
            num_accepted_tokens=[1] * rows,
        )
        with pytest.raises(PlanError, match=message):
            StepBatch(**fields)


def test_config_is_checked():
    with pytest.raises(PlanError, match="graph_mode"):
        PlannerConfig(graph_mode="sometimes")
    with pytest.raises(PlanError, match="prefill_tile_tokens"):
        PlannerConfig(prefill_tile_tokens=48)
    with pytest.raises(PlanError, match="num_spec_tokens"):
        PlannerConfig(num_spec_tokens=-1)


def test_input_arrays_are_copied_not_aliased():
    fields = good(query_lens=np.array([4, 1, 6, 0], dtype=np.int32))
    batch = StepBatch(**fields)
    fields["query_lens"][2] = 99
    assert batch.query_lens.tolist() == [4, 1, 6, 0]


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"slots": [["1", "2", "3", "4"]]}, "slots", "must be integers, got strings"),
        ({"slots": "1 2 3 4"}, "slots", "must be integers, got strings"),
        (
            {"num_accepted_tokens": np.array(["2"] * 4)},
            "num_accepted_tokens",
            "must be integers, got strings",
        ),
        ({"query_lens": [b"4"] * 4}, "query_lens", "must be integers, got bytes"),
        (
            {"query_lens": [4.0, 1.5, 6.0, 0.0]},
            "query_lens",
            "must be integers, got 1.5 (not a whole number)",
        ),
        (
            {"query_lens": [4, 1, 6, float("nan")]},
            "query_lens",
            "must be integers, got nan (not a whole number)",
        ),
        ({"query_lens": [True, True, True, False]}, "query_lens", "must be integers, got booleans"),
        (
            {"query_lens": torch.tensor([1, 1, 1, 0]).bool()},
            "query_lens",
            "must be integers, got booleans",
        ),
        ({"query_lens": [1j] * 4}, "query_lens", "must be integers, got complex numbers"),
        ({"query_lens": None}, "query_lens", "must be integers, got None"),
        ({"num_draft_tokens": [3, None, -1, -1]}, "num_draft_tokens", "must be integers, got None"),
        (
            {"num_computed_tokens": [Decimal(1)] * 4},
            "num_computed_tokens",
            "must be integers, got values of type Decimal",
        ),
        ({"slots": {1: 2}}, "slots", "must be integers, got values of type dict"),
        ({"query_lens": object()}, "query_lens", "must be integers, got values of type object"),
        (
            {"slots": [[1, 2, 3, 0], [5, 6]]},
            "slots",
            "must be a rectangular array of integers, got rows of unequal lengths",
        ),
        (
            {"query_lens": [[4, 1], [6]]},
            "query_lens",
            "must be a rectangular array of integers, got rows of unequal lengths",
        ),
        ({"query_lens": [4, 1, 6, 2**70]}, "query_lens", "values do not fit int32"),
        ({"query_lens": [4, 1, 6, 1e12]}, "query_lens", "values do not fit int32"),
        ({"num_padded_tokens": "12"}, "num_padded_tokens", "must be an integer or None, got '12'"),
        ({"num_padded_rows": True}, "num_padded_rows", "must be an integer or None, got True"),
        ({"allow_null_slots": "no"}, "allow_null_slots", "must be True or False, got 'no'"),
    ],
)
def test_values_of_the_wrong_type_are_refused_in_plain_words(overrides, field, words):
    with pytest.raises(PlanError) as caught:
        StepBatch(**good(**overrides))
    assert str(caught.value) == f"{field}: {words}"
    assert caught.value.field == field and caught.value.row is None


def test_whole_floats_and_numpy_scalars_are_taken_as_integers():
    batch = StepBatch(**good(query_lens=[4.0, 1.0, 6.0, 0.0], num_padded_tokens=np.int64(12)))
    assert batch.query_lens.tolist() == [4, 1, 6, 0] and batch.num_padded_tokens == 12
    assert compile_plan(batch, CONFIG) == compile_plan(StepBatch(**good()), CONFIG)


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        (
            {"graph_sizes": [10**10]},
            "graph_sizes",
            "must be at most 1048576 tokens, got 10000000000",
        ),
        (
            {"graph_sizes": [8, 2**20 + 1]},
            "graph_sizes",
            "must be at most 1048576 tokens, got 1048577",
        ),
        ({"graph_sizes": [0, 8]}, "graph_sizes", "must be positive integers, at least one"),
        ({"graph_sizes": []}, "graph_sizes", "must be positive integers, at least one"),
        ({"graph_sizes": ["8"]}, "graph_sizes", "must be integers, got '8'"),
        ({"graph_sizes": [8.5]}, "graph_sizes", "must be integers, got 8.5"),
        ({"graph_sizes": [True]}, "graph_sizes", "must be integers, got True"),
        ({"graph_sizes": 8}, "graph_sizes", "must be a list of integers, got 8"),
        ({"max_num_seqs": 10**9}, "max_num_seqs", "must be in 1..1048576, got 1000000000"),
        ({"max_num_seqs": 0}, "max_num_seqs", "must be in 1..1048576, got 0"),
        ({"max_num_seqs": "8"}, "max_num_seqs", "must be an integer, got '8'"),
        ({"num_spec_tokens": True}, "num_spec_tokens", "must be an integer, got True"),
        ({"prefill_tile_tokens": 64.0}, "prefill_tile_tokens", "must be an integer, got 64.0"),
    ],
)
def test_config_bounds_and_types_are_refused_before_anything_is_allocated(settings, field, words):
    with pytest.raises(PlanError) as caught:
        PlannerConfig(**settings)
    assert str(caught.value) == f"{field}: {words}" and caught.value.field == field


def test_the_largest_sizes_are_taken():
    config = PlannerConfig(graph_sizes=[2**20], max_num_seqs=2**20, graph_mode="mixed")
    assert config.sizes == (2**20,) and config.row_sizes == (2**20,)
    assert PlannerConfig(graph_sizes=[8.0, 4]).sizes == (4, 8)
