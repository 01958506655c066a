"""The live engine under tensor parallelism: each rank's weights are its block of the
single-process weights, and ranks in a CPU gloo process group (spawned on localhost)
generate exactly the single-process engine's greedy tokens, with its logits up to the
all-reduce's summation order. The NCCL run of the same on two GPUs is
``tests/test_engine_tp_gpu.py``."""

from __future__ import annotations

import attrs
import pytest
import torch
from engine_cases import MODEL, NEW_TOKENS, PROMPTS, tensor_parallel_generate
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor.engine import launch_ranks
from stepplan.executor.model import HybridModelRunner, ModelShape, make_weights
from stepplan.executor.model.parallel import TensorShard
from stepplan.planner import PlannerConfig
from stepplan.sim.settings.presets import MODEL_PRESETS

LOGITS_TOLERANCE = 1e-4  # fp32 logits of O(1): far below the greedy choices' leads


@pytest.fixture(scope="module")
def single_process() -> tuple[list[list[int]], torch.Tensor]:
    """The engine's tokens and logits without tensor parallelism (no process group)."""
    return tensor_parallel_generate(0, 1, "reference", "cpu")


def _joined(shape: ModelShape, size: int) -> list[torch.Tensor]:
    """Every rank's weights, each tensor's blocks joined back along the dim it was cut."""
    ranks = [make_weights(shape, "cpu", TensorShard(rank, size)).tensors() for rank in range(size)]
    whole = make_weights(shape, "cpu").tensors()
    joined = []
    for index, full in enumerate(whole):
        parts = [tensors[index] for tensors in ranks]
        if all(part.shape == full.shape for part in parts):  # not cut: whole on every rank
            assert all(torch.equal(part, full) for part in parts)
            joined.append(full)
        elif parts[0].shape[0] == full.shape[0]:
            joined.append(torch.cat(parts, dim=1))
        else:
            joined.append(_rows(parts, full))
    return joined


def _rows(parts: list[torch.Tensor], full: torch.Tensor) -> torch.Tensor:
    """Row blocks joined: fused tensors (q | k | v, gate | up) rejoin part by part."""
    heads = MODEL.num_heads * MODEL.head_dim
    kv = MODEL.num_kv_heads * MODEL.head_dim
    for sizes in ((heads, kv, kv), (MODEL.mlp_size, MODEL.mlp_size), (full.shape[0],)):
        if sum(sizes) != full.shape[0]:
            continue
        cut = [part.split([s // len(parts) for s in sizes]) for part in parts]
        candidate = torch.cat([torch.cat(pieces) for pieces in zip(*cut, strict=True)])
        if torch.equal(candidate, full):
            return candidate
    raise AssertionError(f"no way of joining the row blocks gives the whole {tuple(full.shape)}")


@settings(max_examples=6, deadline=None)
@given(size=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_rank_blocks_join_into_the_single_process_weights(size, seed):
    shape = attrs.evolve(MODEL, seed=seed)
    whole = make_weights(shape, "cpu").tensors()
    joined = _joined(shape, size)
    assert all(torch.equal(a, b) for a, b in zip(joined, whole, strict=True))


def test_rank_weights_have_the_rank_shapes_parameter_count():
    shard = TensorShard(1, 2)
    weights = make_weights(MODEL, "cpu", shard)
    assert weights.num_params() == shard.rank_shape(MODEL).num_params
    assert weights.layers[0].mixer.in_proj.untyped_storage().nbytes() == 32 * 32 * 4  # not a view


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_ranks_hold_the_split_parameters_once_and_the_rest_each(preset):
    """Per rank: embedding, LM head and norms whole, every other parameter a 1/N share."""
    shape = ModelShape(**MODEL_PRESETS[preset])
    hidden = shape.hidden_size
    whole_on_each = 2 * shape.vocab_size * hidden + hidden + 2 * hidden * shape.num_layers
    for size in (1, 2, 4, 8):
        if shape.num_kv_heads % size:
            with pytest.raises(ValueError, match=f"tensor_parallel: {size} ranks must divide"):
                TensorShard(0, size).rank_shape(shape)
            continue
        split = shape.num_params - whole_on_each
        assert TensorShard(0, size).rank_shape(shape).num_params == whole_on_each + split // size


def test_world_size_one_needs_no_process_group(single_process):
    assert not torch.distributed.is_initialized()
    tokens, _ = single_process
    plain = HybridModelRunner(
        MODEL, PlannerConfig(max_num_seqs=8), num_slots=3, max_len=16, tensor_parallel=1
    )
    assert plain.rank_shape == MODEL
    assert len(tokens) == len(PROMPTS) and all(len(t) == NEW_TOKENS for t in tokens)


@pytest.mark.parametrize(
    ("degree", "message"),
    [
        (2, "tensor_parallel: 2 ranks need an initialised torch.distributed process group"),
        (0, "tensor_parallel: must be a positive integer, got 0"),
        (3, "tensor_parallel: 3 ranks must divide conv_channels = 64"),
    ],
)
def test_a_degree_that_cannot_run_is_refused(degree, message):
    with pytest.raises(ValueError, match=message):
        HybridModelRunner(
            MODEL, PlannerConfig(max_num_seqs=8), num_slots=3, max_len=16, tensor_parallel=degree
        )


def test_two_gloo_ranks_generate_the_single_process_tokens(single_process):
    """One launch of two ranks, each over its 32 of 64 channels, 2 of 4 heads, 1 of 2 KV
    heads: the executor's reference conv serving every token, then its Triton kernels
    (interpreted on the CPU, so only the first tokens: prefill steps and one spec step)."""
    tokens, logits = single_process
    results = launch_ranks(2, _both_backends, (), "cpu")
    for rank_results in results:
        for (rank_tokens, rank_logits), new in zip(rank_results, _NEW, strict=True):
            assert rank_tokens == [t[:new] for t in tokens]
            torch.testing.assert_close(
                rank_logits, logits, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE
            )
    # Every rank computed the same sums, bit for bit: the ranks never disagree on a token.
    assert torch.equal(results[0][0][1], results[1][0][1])


_NEW = (NEW_TOKENS, 2)  # tokens generated on the reference backend, then on Triton


def _both_backends(rank: int) -> list[tuple[list[list[int]], torch.Tensor]]:
    return [
        tensor_parallel_generate(rank, 2, backend, "cpu", new)
        for backend, new in zip(("reference", "triton"), _NEW, strict=True)
    ]
