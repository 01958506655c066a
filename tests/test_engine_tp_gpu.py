"""The live engine at tensor parallelism 2 over NCCL on two CUDA GPUs: the compiled
Triton conv in fp32 generates the single-GPU engine's tokens; in bf16 the CUDA graphs,
each holding its NCCL all-reduces, give both ranks the same tokens and the single-GPU
logits up to bf16 rounding.

Run on a machine with two GPUs: ``python -m pytest -q -m gpu tests/test_engine_tp_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from engine_cases import tensor_parallel_generate

from stepplan.executor.engine import launch_ranks

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")


def test_two_nccl_ranks_generate_the_single_gpu_tokens():
    tokens, logits = tensor_parallel_generate(0, 1, "triton", "cuda")
    for rank_tokens, rank_logits in launch_ranks(
        2, tensor_parallel_generate, (2, "triton", "cuda"), "cuda"
    ):
        assert rank_tokens == tokens
        torch.testing.assert_close(rank_logits, logits, atol=1e-4, rtol=1e-4)


def test_graphed_bf16_ranks_agree_and_match_the_single_gpu_logits():
    _, logits = tensor_parallel_generate(0, 1, "triton", "cuda", dtype="bfloat16")
    (first, first_logits), (second, second_logits) = launch_ranks(
        2, tensor_parallel_generate, (2, "triton", "cuda", 8, "bfloat16"), "cuda"
    )
    assert first == second and torch.equal(first_logits, second_logits)
    torch.testing.assert_close(first_logits, logits, atol=0.1, rtol=0.05)
