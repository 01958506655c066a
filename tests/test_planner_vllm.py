"""The vLLM bridge: CommonAttentionMetadata in, the seed's metadata fields out."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from planner_strategies import step_batches

from stepplan.executor.vllm import plan_from_common_metadata, seed_view
from stepplan.planner import Planner, PlannerConfig, compile_plan


@attrs.frozen
class FakeCommonMetadata:
    """The CommonAttentionMetadata fields the bridge reads (no vLLM needed)."""

    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    num_reqs: int
    num_actual_tokens: int

    def compute_num_computed_tokens(self) -> torch.Tensor:
        return self.seq_lens - torch.diff(self.query_start_loc_cpu)


def test_plan_from_common_metadata_reads_vllms_fields():
    query_lens = torch.tensor([4, 1, 7, 0], dtype=torch.int32)
    qsl = torch.zeros(5, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    metadata = FakeCommonMetadata(
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor([20, 6, 7, 0], dtype=torch.int32),
        block_table_tensor=torch.tensor([[3, 99], [5, 99], [8, 99], [0, 0]], dtype=torch.int32),
        num_reqs=4,
        num_actual_tokens=16,
    )
    plan = plan_from_common_metadata(
        metadata,
        num_accepted_tokens=torch.tensor([2, 1, 1, 1]),
        num_decode_draft_tokens_cpu=torch.tensor([3, -1, -1, -1]),
        config=PlannerConfig(num_spec_tokens=3, graph_mode="mixed", graph_sizes=(8, 16, 32)),
    )
    assert plan.batch.num_computed_tokens.tolist() == [16, 5, 0, 0]
    assert plan.row_slot[0, :3].tolist() == [3, 5, 8]
    assert plan.graph.num_tokens == 16  # holds the engine's 16 padded tokens
    view = seed_view(plan)
    assert view["num_actual_tokens"] == 16 and view["num_reqs"] == 4
    assert view["spec_state_indices_tensor"].tolist() == [3]
    assert view["has_initial_states_d"].tolist() == [True]
    assert view["has_initial_states_p"].tolist() == [False]
    config = plan.config
    planner = Planner(config)
    for _ in range(2):  # the second step reuses the planner's kept shape
        kept = plan_from_common_metadata(
            metadata,
            num_accepted_tokens=torch.tensor([2, 1, 1, 1]),
            num_decode_draft_tokens_cpu=torch.tensor([3, -1, -1, -1]),
            config=config,
            planner=planner,
        )
        assert kept == plan and kept.packed.tobytes() == plan.packed.tobytes()
    with pytest.raises(ValueError, match="another config"):
        plan_from_common_metadata(
            metadata,
            num_accepted_tokens=None,
            num_decode_draft_tokens_cpu=None,
            config=PlannerConfig(),
            planner=planner,
        )


@settings(max_examples=100, deadline=None)
@given(step_batches())
def test_seed_view_is_consistent_with_the_plan(case):
    batch, config = case
    plan = compile_plan(batch, config)
    view = seed_view(plan, group=batch.num_groups - 1)
    ns, nd, npf = view["num_spec_decodes"], view["num_decodes"], view["num_prefills"]
    assert (ns, nd, npf) == (plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows)
    slots = batch.slots[-1]
    if ns:
        tokens = np.concatenate([view["spec_token_indx"], view["non_spec_token_indx"]])
        assert sorted(tokens.tolist()) == list(range(batch.num_tokens))
        spec_rows = np.flatnonzero(batch.kinds == 0)
        assert view["spec_state_indices_tensor"][:ns].tolist() == slots[spec_rows].tolist()
        assert (view["spec_state_indices_tensor"][ns:] == 0).all()
        assert view["spec_sequence_masks"].tolist() == (batch.kinds == 0).tolist()
        spec_qsl = view["spec_query_start_loc"]
        assert np.diff(spec_qsl[: ns + 1]).tolist() == batch.query_lens[spec_rows].tolist()
        assert (spec_qsl[ns:] == spec_qsl[ns]).all()
        assert (
            view["num_accepted_tokens"][:ns].tolist()
            == batch.num_accepted_tokens[spec_rows].tolist()
        )
    else:
        assert view["spec_token_indx"] is None and view["num_accepted_tokens"] is None
    decode_rows = np.flatnonzero(batch.kinds == 1)
    prefill_rows = np.flatnonzero(batch.kinds == 2)
    state = view["state_indices_tensor"]
    assert state[:nd].tolist() == slots[decode_rows].tolist()
    assert state[len(state) - npf :].tolist() == slots[prefill_rows].tolist()
    if nd:
        assert (
            view["has_initial_states_d"][:nd].tolist()
            == (batch.num_computed_tokens[decode_rows] > 0).tolist()
        )
    if npf:
        lens = np.diff(view["query_start_loc_p"])
        assert lens.tolist() == batch.query_lens[prefill_rows].tolist()
        assert view["max_prefill_query_len"] == lens.max()


def test_metadata_without_spec_info_plans_every_row_as_non_spec():
    qsl = torch.tensor([0, 1, 6], dtype=torch.int32)
    metadata = FakeCommonMetadata(
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor([9, 5], dtype=torch.int32),
        block_table_tensor=torch.tensor([[2], [4]], dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=6,
    )
    plan = plan_from_common_metadata(
        metadata, num_accepted_tokens=None, num_decode_draft_tokens_cpu=None, config=PlannerConfig()
    )
    assert (plan.num_decode_rows, plan.num_prefill_rows, plan.num_spec_rows) == (1, 1, 0)
