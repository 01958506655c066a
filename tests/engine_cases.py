"""What the engine tests share: the tiny model, the prompts, and the dense oracle's plain
one-token-at-a-time greedy decoding."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from stepplan.executor.model import ModelShape, ModelWeights
from stepplan.executor.model.dense import dense_logits
from stepplan.sim import presets

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
