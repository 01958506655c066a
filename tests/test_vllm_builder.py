"""The vLLM builder drop-in: device fields equal ``seed_view`` of the plan, at fixed addresses."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor.vllm import (
    BOOL_FIELDS,
    INT32_FIELDS,
    PlanMetadataBuilder,
    plan_from_common_metadata,
    seed_view,
)
from stepplan.planner import PlannerConfig


@attrs.frozen
class FakeCommonMetadata:
    """The fields of vLLM's ``CommonAttentionMetadata`` the planner reads."""

    query_start_loc_cpu: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    num_computed: torch.Tensor

    def compute_num_computed_tokens(self) -> torch.Tensor:
        return self.num_computed


def fake_metadata(query_lens, computed, slots, extra_tokens=0, device="cpu"):
    starts = torch.tensor(np.concatenate([[0], np.cumsum(query_lens)]), dtype=torch.int32)
    computed = torch.tensor(computed, dtype=torch.int32)
    table = torch.tensor(np.stack([slots, np.zeros_like(slots)], axis=1), dtype=torch.int32)
    return FakeCommonMetadata(
        query_start_loc_cpu=starts,
        query_start_loc=starts.to(device),
        seq_lens=(computed + torch.diff(starts)).to(device),
        block_table_tensor=table.to(device),
        num_reqs=len(query_lens),
        num_actual_tokens=int(sum(query_lens)) + extra_tokens,
        num_computed=computed.to(device),
    )


def random_step(rng: np.random.Generator, rows: int, q_max: int, weights=(7, 6, 4, 3)):
    """Metadata plus spec info for random rows of the kinds (spec, decode, prefill, padding)."""
    kinds = rng.choice(4, size=rows, p=np.array(weights) / sum(weights))
    q = np.choose(
        kinds, [1 + rng.integers(0, q_max, rows), np.ones(rows, int), rng.integers(2, 30, rows), 0]
    )
    computed = np.where(kinds == 0, 1, 0) + rng.integers(0, 30, rows) * (rng.random(rows) < 0.6)
    slots = np.where(kinds == 3, 0, rng.permutation(np.arange(1, rows + 1)))
    drafts = torch.tensor(np.where(kinds == 0, q - 1, -1), dtype=torch.int32)
    accepted = torch.tensor(rng.integers(1, q_max + 1, rows), dtype=torch.int32)
    m = fake_metadata(q, np.where(kinds == 3, 0, computed), slots, int(rng.integers(0, 5)))
    return m, accepted, drafts


def assert_matches_seed_view(md, want: dict) -> None:
    for name, value in want.items():
        got = getattr(md, name)
        if value is None or isinstance(value, int):
            assert got == value, name
            continue
        assert got is not None, name
        assert got.dtype == (torch.bool if value.dtype == np.bool_ else torch.int32), name
        np.testing.assert_array_equal(got.cpu().numpy(), value, err_msg=name)


CONFIGS = [
    PlannerConfig(num_spec_tokens=3, graph_mode=mode, max_num_seqs=64)
    for mode in ("full", "mixed", "none")
] + [PlannerConfig(num_spec_tokens=0, graph_mode="full", max_num_seqs=64)]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 40),
    config=st.sampled_from(CONFIGS),
    weights=st.sampled_from([(1, 0, 0, 0), (1, 0, 0, 1), (0, 1, 0, 0), (7, 6, 4, 3)]),
)
def test_build_equals_seed_view_of_the_plan(seed, rows, config, weights):
    rng = np.random.default_rng(seed)
    m, accepted, drafts = random_step(rng, rows, config.query_len_max, weights)
    if config.num_spec_tokens == 0:
        accepted, drafts = None, None
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    md = builder.build(0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts)
    plan = plan_from_common_metadata(
        m,
        # The planner reads accepted counts on spec rows only (and wants int32 ones otherwise).
        num_accepted_tokens=np.ones(rows, np.int32) if accepted is None else accepted,
        num_decode_draft_tokens_cpu=drafts,
        config=config,
    )
    assert md.plan == plan
    assert_matches_seed_view(md, seed_view(plan))
    np.testing.assert_array_equal(md.plan_buffer.numpy(), plan.packed)
    assert md.query_start_loc is m.query_start_loc and md.seq_lens is m.seq_lens


def test_fields_keep_their_addresses_across_steps():
    """A CUDA graph captured over one step's metadata reads the next step's values."""
    config = CONFIGS[0]
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    rng = np.random.default_rng(7)
    seen: dict[str, int] = {}
    for rows in (30, 4, 17, 1):
        m, accepted, drafts = random_step(rng, rows, config.query_len_max)
        md = builder.build(0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts)
        for name in (*INT32_FIELDS, *BOOL_FIELDS, "plan_buffer"):
            tensor = getattr(md, name)
            if tensor is not None and tensor.numel():  # an empty view has no address
                assert seen.setdefault(name, tensor.data_ptr()) == tensor.data_ptr(), name
    assert len(seen) == len(INT32_FIELDS) + len(BOOL_FIELDS) + 1


def test_build_for_cudagraph_capture_treats_rows_as_fully_accepted_spec_rows():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="full", max_num_seqs=8)
    builder = PlanMetadataBuilder(config, "cpu")
    m = fake_metadata(np.full(8, 4), np.full(8, 5), np.arange(1, 9))
    md = builder.build_for_cudagraph_capture(m)
    plan = plan_from_common_metadata(
        m,
        num_accepted_tokens=np.full(8, 4),
        num_decode_draft_tokens_cpu=np.full(8, 3),
        config=config,
    )
    assert md.num_spec_decodes == 8 and md.plan.graph is not None
    assert_matches_seed_view(md, seed_view(plan))
    too_many = fake_metadata(np.full(9, 4), np.full(9, 5), np.arange(1, 10))
    with pytest.raises(ValueError, match="at most 8 requests and 32 tokens, got 9 and 36"):
        builder.build_for_cudagraph_capture(too_many)


def test_build_for_cudagraph_capture_without_speculation_is_a_decode_batch():
    config = PlannerConfig(num_spec_tokens=0, graph_mode="full", max_num_seqs=8)
    builder = PlanMetadataBuilder(config, "cpu")
    md = builder.build_for_cudagraph_capture(
        fake_metadata(np.ones(5), np.full(5, 2), [1, 2, 3, 4, 5])
    )
    assert md.num_decodes == 5 and md.num_spec_decodes == 0
    assert md.state_indices_tensor_d.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]


def test_capacity_is_checked_with_a_clear_error():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="none", max_num_seqs=4, graph_sizes=[4])
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=16)
    m = fake_metadata(np.ones(5), np.zeros(5), [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="num_reqs: 5 exceeds the builder's max_num_reqs = 4"):
        builder.build(0, m)
    long = fake_metadata(np.array([100]), np.zeros(1), [1])
    with pytest.raises(ValueError, match="raise max_num_tokens"):
        builder.build(0, long)
    md = builder.build(0, fake_metadata(np.array([3, 1]), np.array([0, 2]), [2, 1]))
    assert md.num_prefills == 1 and md.state_indices_tensor.tolist() == [1, 2]
