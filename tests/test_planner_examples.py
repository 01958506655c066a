"""Hand-worked plans for every batch kind, checked field by field (SPEC §3, the seed's rules)."""

from __future__ import annotations

import numpy as np

from stepplan.executor.vllm import seed_view
from stepplan.planner import GraphKey, Planner, PlannerConfig, StepBatch, compile_plan

Q4 = PlannerConfig(num_spec_tokens=3, graph_mode="full", graph_sizes=(1, 2, 4, 8, 16))


def batch(q, computed, slots, drafts=None, accepted=None, **kw):
    rows = len(q)
    return StepBatch(
        query_lens=q,
        num_computed_tokens=computed,
        slots=slots,
        num_draft_tokens=[-1] * rows if drafts is None else drafts,
        num_accepted_tokens=[1] * rows if accepted is None else accepted,
        **kw,
    )


def live(plan, name):
    rows = plan.num_rows
    return {
        "token_map": plan.token_map[: plan.num_tokens],
        "row_query_start": plan.row_query_start[: rows + 1],
        "row_slot": plan.row_slot[:, :rows],
    }.get(name, plan.array(name)[:rows]).tolist()


def test_pure_spec_with_trailing_padding_rows():
    b = batch([4, 2, 0, 0], [10, 20, 0, 0], [5, 7, 0, 0], [3, 1, -1, -1], [2, 4, 1, 1])
    plan = compile_plan(b, Q4)
    assert (plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows) == (2, 0, 0)
    assert plan.graph == GraphKey("spec", 8, 2, 0)  # 2 rows x Q tokens
    assert plan.token_map.tolist() == [0, 1, 2, 3, 4, 5, -1, -1]
    assert plan.row_query_start.tolist() == [0, 4, 6]
    assert live(plan, "row_state_offset") == [1, 3]
    assert live(plan, "row_slot") == [[5, 7]]
    view = seed_view(plan)
    assert view["spec_state_indices_tensor"].tolist() == [5, 7, 0, 0]  # padded to num_reqs
    assert view["spec_query_start_loc"].tolist() == [0, 4, 6, 6, 6]
    assert view["num_accepted_tokens"].tolist() == [2, 4, 1, 1]
    assert view["spec_sequence_masks"].tolist() == [True, True, False, False]
    assert view["spec_token_indx"].tolist() == [0, 1, 2, 3, 4, 5]
    assert view["non_spec_token_indx"].tolist() == []
    assert view["state_indices_tensor"].tolist() == []
    assert view["non_spec_query_start_loc"] is None and view["has_initial_states_d"] is None
    assert (view["num_spec_decodes"], view["num_spec_decode_tokens"]) == (2, 6)


def test_pure_decode_pads_to_the_bucket():
    plan = compile_plan(batch([1, 1, 1], [0, 5, 7], [3, 1, 2]), Q4)
    assert plan.graph == GraphKey("decode", 4, 4, 0)
    assert plan.row_slot.tolist() == [[3, 1, 2, 0]]
    assert plan.row_kind.tolist() == [1, 1, 1, 3]
    assert plan.row_reads_state.tolist() == [0, 1, 1, 0]
    assert plan.row_query_start.tolist() == [0, 1, 2, 3, 3]
    view = seed_view(plan)
    assert view["state_indices_tensor_d"].tolist() == [3, 1, 2, 0]
    assert view["state_indices_tensor"].tolist() == [3, 1, 2, 0]
    assert view["has_initial_states_d"].tolist() == [False, True, True, False]
    assert view["query_start_loc_d"].tolist() == [0, 1, 2, 3]
    assert view["spec_state_indices_tensor"] is None and view["spec_token_indx"] is None


def test_pure_prefill_runs_eagerly_in_tiles():
    plan = compile_plan(batch([100, 3], [0, 64], [4, 9]), Q4)
    assert plan.graph is None  # the seed's full graphs are for uniform decode batches only
    assert plan.max_prefill_query_len == 100 and plan.num_prefill_tokens == 103
    assert plan.tile_row.tolist() == [0, 0, 1] and plan.tile_start.tolist() == [0, 64, 0]
    view = seed_view(plan)
    assert view["has_initial_states_p"].tolist() == [False, True]
    assert view["query_start_loc_p"].tolist() == [0, 100, 103]
    assert view["state_indices_tensor_p"].tolist() == [4, 9]
    assert view["num_computed_tokens_p"].tolist() == [0, 64]
    assert view["max_prefill_query_len"] == 100


def test_mixed_with_spec_rows_not_in_front_and_a_zero_length_row():
    # engine rows: decode, prefill(5), spec(3), padding, spec(1), decode
    b = batch(
        [1, 5, 3, 0, 1, 1],
        [4, 0, 9, 0, 2, 0],
        [[1, 2, 3, 0, 4, 5], [11, 12, 13, 0, 14, 15]],
        drafts=[-1, -1, 2, -1, 0, -1],
        accepted=[7, 7, 3, 7, 1, 7],
    )
    plan = compile_plan(b, Q4)
    assert plan.graph is None  # mixed batches get no graph in "full" mode
    assert live(plan, "row_request") == [2, 4, 0, 5, 1]
    assert live(plan, "row_kind") == [0, 0, 1, 1, 2]
    # engine token rows: r0 [0], r1 [1..5], r2 [6,7,8], r4 [9], r5 [10]
    assert live(plan, "token_map") == [6, 7, 8, 9, 0, 10, 1, 2, 3, 4, 5]
    assert live(plan, "row_query_start") == [0, 3, 4, 5, 6, 11]
    assert live(plan, "row_token_start") == [6, 9, 0, 10, 1]
    assert live(plan, "row_slot") == [[3, 4, 1, 5, 2], [13, 14, 11, 15, 12]]
    assert live(plan, "row_state_offset") == [2, 0, 0, 0, 0]
    assert live(plan, "row_num_accepted") == [3, 1, 1, 1, 1]
    assert live(plan, "row_reads_state") == [1, 1, 1, 0, 0]
    view = seed_view(plan, group=1)
    assert view["spec_token_indx"].tolist() == [6, 7, 8, 9]
    assert view["non_spec_token_indx"].tolist() == [0, 10, 1, 2, 3, 4, 5]
    assert view["spec_state_indices_tensor"].tolist() == [13, 14]
    assert view["state_indices_tensor"].tolist() == [11, 15, 12]
    assert view["spec_query_start_loc"].tolist() == [0, 3, 4]
    assert view["non_spec_query_start_loc"].tolist() == [0, 1, 2, 7]
    assert view["query_start_loc_d"].tolist() == [0, 1, 2]
    assert view["query_start_loc_p"].tolist() == [0, 5]
    assert view["has_initial_states_d"].tolist() == [True, False]
    assert view["has_initial_states_p"].tolist() == [False]
    assert view["num_accepted_tokens"].tolist() == [3, 1]
    assert view["spec_sequence_masks"].tolist() == [False, False, True, False, True, False]


def test_zero_length_row_between_spec_rows_is_classified_by_mask():
    b = batch([4, 0, 4], [1, 0, 1], [1, 0, 2], [3, -1, 3], [1, 1, 2])
    plan = compile_plan(b, PlannerConfig(num_spec_tokens=3, graph_mode="none"))
    assert live(plan, "row_query_start") == [0, 4, 8]
    assert live(plan, "token_map") == list(range(8))
    # The seed slices query_start_loc by position here ([0, 4, 4]); by mask it is:
    assert seed_view(plan)["spec_query_start_loc"].tolist() == [0, 4, 8]


def test_one_request():
    plan = compile_plan(batch([3], [10], [9], [2], [4]), Q4)
    assert plan.graph == GraphKey("spec", 4, 1, 0)
    assert plan.token_map.tolist() == [0, 1, 2, -1]
    assert plan.row_state_offset.tolist() == [3]


def test_256_requests_fill_the_largest_spec_graph():
    config = PlannerConfig(num_spec_tokens=3, max_num_seqs=256)
    rows = 256
    b = batch([4] * rows, [50] * rows, np.arange(1, rows + 1), [3] * rows, [2] * rows)
    plan = compile_plan(b, config)
    assert plan.graph == GraphKey("spec", 1024, 256, 0)
    assert (plan.token_map == np.arange(1024)).all()
    assert plan.num_spec_decode_tokens == 1024
    assert seed_view(plan)["spec_state_indices_tensor"].tolist() == list(range(1, 257))


def test_several_layer_groups_keep_their_own_slots():
    slots = [[1, 2, 3], [7, 8, 9], [4, 5, 6]]
    plan = compile_plan(batch([1, 2, 1], [0, 0, 3], slots), Q4)
    assert live(plan, "row_slot") == [[1, 3, 2], [7, 9, 8], [4, 6, 5]]
    for group in range(3):
        assert seed_view(plan, group)["state_indices_tensor"].tolist() == [
            slots[group][0],
            slots[group][2],
            slots[group][1],
        ]


def test_mixed_mode_gives_mixed_batches_a_graph():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="mixed", graph_sizes=(4, 16, 64))
    b = batch([1, 5, 4], [1, 0, 3], [1, 2, 3], [-1, -1, 3], [1, 1, 2])
    plan = compile_plan(b, config)
    assert plan.graph == GraphKey("mixed", 16, 4, 4 + 16 // 64)
    assert plan.row_kind.tolist() == [0, 1, 2, 3]
    assert seed_view(plan)["state_indices_tensor"].tolist() == [
        1,
        2,
    ]  # the seed pads no mixed batch


def test_graph_mode_none_and_beyond_the_largest_graph_run_eagerly():
    b = batch([1] * 20, [1] * 20, np.arange(1, 21))
    assert compile_plan(b, PlannerConfig(graph_mode="none")).graph is None
    small = PlannerConfig(graph_mode="full", graph_sizes=(1, 2, 4, 8, 16))
    plan = compile_plan(b, small)
    assert plan.graph is None and plan.padded_rows == 20
    assert seed_view(plan)["state_indices_tensor_d"].tolist() == list(range(1, 21))


def test_engine_token_padding_picks_a_bucket_that_holds_it():
    b = batch([1, 1], [1, 1], [1, 2], num_padded_tokens=7)
    assert compile_plan(b, Q4).graph == GraphKey("decode", 8, 8, 0)


def test_empty_step():
    plan = compile_plan(batch([], [], np.zeros((1, 0), dtype=np.int32)), Q4)
    assert plan.graph is None and plan.num_rows == 0 and plan.ops[1:] == ()


def test_describe_and_op_graph():
    b = batch([1, 5, 4], [1, 0, 3], [[1, 2, 3], [4, 5, 6]], [-1, -1, 3], [1, 1, 2])
    plan = compile_plan(b, Q4)
    text = plan.describe()
    assert "eager" in text and "token_map" in text and "short_conv_rows" in text
    graph = plan.op_graph()
    ops = [n for n, kind in graph.nodes(data="kind") if kind == "op"]
    assert ops == ["upload", "rows[0]", "tiles[0]", "rows[1]", "tiles[1]"]
    assert graph.has_edge("plan", "rows[1]") and graph.has_edge("tiles[1]", "conv_state[1]")


def test_many_prefill_rows_tile_like_a_few():
    # Up to 8 prefill rows are tiled by a loop, more by numpy; both must agree.
    lens = [2, 70, 9, 130, 64, 65, 3, 128, 200, 5, 1000]
    config = PlannerConfig(graph_mode="none", prefill_tile_tokens=64)
    rows = len(lens)
    many = compile_plan(batch(lens, [0] * rows, np.arange(1, rows + 1)), config)
    expected_rows, expected_starts = [], []
    for row, length in enumerate(lens):
        starts = list(range(0, length, 64))
        expected_rows += [row] * len(starts)
        expected_starts += starts
    assert many.tile_row.tolist() == expected_rows
    assert many.tile_start.tolist() == expected_starts
    few = compile_plan(batch(lens[:8], [0] * 8, np.arange(1, 9)), config)
    assert few.tile_row.tolist() == expected_rows[: few.num_tiles]
    assert few.tile_start.tolist() == expected_starts[: few.num_tiles]


def test_more_rows_and_tokens_than_the_index_ramp():
    # index_ramp is 8192 long for this config; 9000 decode rows and a 20000-token
    # prefill need longer identity maps, in engine order and regrouped.
    config = PlannerConfig(graph_sizes=(8,), max_num_seqs=10000, prefill_tile_tokens=8)
    decode, prefill = [1] * 9000, [20000]
    for lens in (decode, decode + prefill, prefill + decode):
        rows = len(lens)
        b = batch(lens, [1] * rows, np.arange(1, rows + 1))
        plan = compile_plan(b, config)
        assert plan.graph is None and plan.num_rows == rows
        order = np.argsort(b.kinds, kind="stable")
        assert plan.row_request.tolist() == order.tolist()
        starts = np.concatenate([[0], np.cumsum(lens)])[order]
        expected = np.concatenate(
            [np.arange(s, s + b.query_lens[r]) for r, s in zip(order, starts, strict=True)]
        )
        assert (plan.token_map == expected).all()
        if len(lens) > 9000:
            assert plan.tile_start.tolist() == list(range(0, 20000, 8))
        planner = Planner(config)
        assert planner.compile(b) == plan == planner.compile(b)
