"""The serving engine on a CUDA GPU: the compiled Triton conv in fp32 generates the dense
oracle's tokens, and CUDA-graph replay generates the eager engine's tokens in bf16.

Run on a CUDA machine: ``python -m pytest -q -m gpu tests/test_engine_gpu.py``.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from engine_cases import MARGIN, MODEL, dense_greedy

import stepplan.executor.model.runner as runner_module
from stepplan.executor.engine import Engine, EngineConfig
from stepplan.executor.model import HybridModelRunner, ModelShape, make_weights
from stepplan.planner import PlannerConfig
from stepplan.sim.settings.presets import MODEL_PRESETS

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
PLANNER = PlannerConfig(num_spec_tokens=3, graph_mode="mixed", max_num_seqs=8)
CONFIG = EngineConfig(
    max_num_seqs=4, max_num_batched_tokens=40, prefill_chunk_tokens=16, num_spec_tokens=3
)
LENGTHS, NEW_TOKENS, MAX_LEN = (1, 7, 30, 45, 12, 3), 24, 80


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, n).tolist() for n in LENGTHS]


def _moved(value: object, device: torch.device) -> object:
    """``value`` (weights: attrs classes, tuples, tensors) with every tensor on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_moved(v, device) for v in value)
    if attrs.has(type(value)):
        fields = attrs.fields(type(value))
        return attrs.evolve(
            value, **{f.name: _moved(getattr(value, f.name), device) for f in fields}
        )
    return value


def test_engine_on_gpu_generates_the_dense_oracles_tokens(monkeypatch):
    """fp32 (sdpa, so no graphs; plans still padded to their buckets) with the weights the
    CPU draws, so the CPU oracle, its leads checked, is the answer."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(
        runner_module,
        "make_weights",
        lambda shape, device, shard=None: _moved(make_weights(shape, "cpu", shard), device),
    )
    requests = prompts(MODEL.vocab_size)
    oracle, lead = dense_greedy(make_weights(MODEL, "cpu"), MODEL, requests, NEW_TOKENS)
    assert lead > MARGIN
    runner = HybridModelRunner(
        MODEL, PLANNER, num_slots=5, max_len=MAX_LEN, num_groups=2, device=CUDA, backend="triton"
    )
    assert runner.attention == "sdpa" and runner.weights.embedding.device.type == "cuda"
    assert Engine(runner, CONFIG).generate(requests, NEW_TOKENS) == oracle


def test_graphed_engine_generates_the_eager_engines_tokens():
    """bf16 with flash attention: every step replays its bucket's graph or runs eagerly
    with the same shapes, so the tokens are equal bit for bit."""
    shape = ModelShape(
        **{**MODEL_PRESETS["tiny"], "dtype": "bfloat16", "head_dim": 64, "vocab_size": 512},
        seed=2,
    )
    outputs, runners = [], []
    for use_graphs in (True, False):
        runner = HybridModelRunner(
            shape,
            PLANNER,
            num_slots=5,
            max_len=MAX_LEN,
            num_groups=2,
            device=CUDA,
            backend="triton",
            use_graphs=use_graphs,
        )
        outputs.append(Engine(runner, CONFIG).generate(prompts(512), NEW_TOKENS))
        runners.append(runner)
    assert outputs[0] == outputs[1]
    assert len(runners[0].captured_graphs) >= 2, runners[0].captured_graphs
    assert runners[1].captured_graphs == ()
