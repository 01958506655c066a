"""What the engine tests share: the tiny model, the prompts, and the dense oracle's plain
one-token-at-a-time greedy decoding."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch

from stepplan.executor.engine import Engine, EngineConfig
from stepplan.executor.model import HybridModelRunner, ModelShape, ModelWeights
from stepplan.executor.model.dense import dense_logits
from stepplan.planner import PlannerConfig, StepBatch
from stepplan.sim.settings import presets

MODEL = ModelShape(**presets.MODEL_PRESETS["tiny"], seed=1)
MAX_LEN = 48
NEW_TOKENS = 14
MARGIN = 1e-3  # the oracle's greedy choices must lead the runner-up by more than this
# Distinct first tokens, so a prompt is never a prefix of another request's tokens; the
# second repeats itself, so prompt lookup finds drafts.
PROMPTS = [[5], [6, 7, 8, 9, 6, 7, 8, 9, 6, 7], [11, 60, 3, 22, 17], [20, *range(21, 40)]]


def dense_greedy(
    weights: ModelWeights, shape: ModelShape, prompts: Sequence[Sequence[int]], new_tokens: int
) -> tuple[list[list[int]], float]:
    """Each prompt's ``new_tokens`` greedy tokens, the whole stream through
    :func:`dense_logits` for every one, and the smallest lead of a chosen token over the
    runner-up."""
    outputs, lead = [], float("inf")
    for prompt in prompts:
        tokens = list(prompt)
        for _ in range(new_tokens):
            with torch.no_grad():
                logits = dense_logits(weights, shape, torch.tensor(tokens))[-1].float()
            top = logits.topk(2).values
            lead = min(lead, float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
        outputs.append(tokens[len(prompt) :])
    return outputs, lead


def tensor_parallel_generate(
    rank: int,
    world_size: int,
    backend: str,
    device: str,
    new_tokens: int = NEW_TOKENS,
    dtype: str = MODEL.dtype,
) -> tuple[list[list[int]], torch.Tensor]:
    """One tensor-parallel rank (:func:`~stepplan.executor.engine.launch_ranks`'s worker):
    the engine's ``new_tokens`` greedy tokens for :data:`PROMPTS` at ``world_size`` ranks
    (spec steps and chunked prefill on), then ``[4, V]`` logits after each prompt, every
    prompt prefilled in one step; the tiny model in ``dtype`` (half precision on CUDA takes
    flash attention and CUDA graphs)."""
    if device == "cuda":
        device = f"cuda:{rank}"
    planner = PlannerConfig(num_spec_tokens=3, graph_mode="mixed", max_num_seqs=8)
    runner = HybridModelRunner(
        attrs.evolve(MODEL, dtype=dtype),
        planner,
        num_slots=5,
        max_len=MAX_LEN,
        num_groups=2,
        device=device,
        backend=backend,
        tensor_parallel=world_size,
    )
    config = EngineConfig(
        max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk_tokens=12, num_spec_tokens=3
    )
    tokens = Engine(runner, config).generate(PROMPTS, new_tokens)
    # Every prompt prefilled whole in one fresh step (slots 1..4 of both groups).
    lens = [len(p) for p in PROMPTS]
    slots = list(range(1, len(PROMPTS) + 1))
    batch = StepBatch(
        query_lens=lens,
        num_computed_tokens=[0] * len(lens),
        slots=[slots, slots],
        num_draft_tokens=[-1] * len(lens),
        num_accepted_tokens=[1] * len(lens),
    )
    ids = np.array([t for p in PROMPTS for t in p], dtype=np.int64)
    logits = runner.logits(runner.planner.compile(batch), ids, np.cumsum(lens) - 1)
    return tokens, logits.float().cpu()
