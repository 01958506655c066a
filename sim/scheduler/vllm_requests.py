"""The requests of a vLLM-scheduled run (``vllm_engine_scheduler.py``): their prompts
as token ids, and what the step path follows of each one vLLM has not finished.

Prompt tokens: a trace's prefix hash ``h`` (Mooncake's ``hash_ids``, one per
``memory.prefix_block_tokens`` tokens) becomes that many tokens of id ``HASHED_TOKEN +``
the rank of ``h`` among the trace's distinct hashes (:func:`hashed_block_tokens`), so
equal hash blocks are equal tokens, different ones different, and vLLM's block hasher
sees the trace's sharing, whatever the hashes' values; the rest of a prompt, and every
output token, is the request's own id, shared with no other request.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..traces import RequestTable

#: Token ids of hashed prompt blocks start here; request ids (the other tokens) are below.
HASHED_TOKEN = 1 << 30


def hashed_block_tokens(table: RequestTable) -> np.ndarray:
    """``[num_blocks], int64`` the token id of each of the trace's prefix blocks
    (``table.prefix_blocks``): ``HASHED_TOKEN`` plus its hash's rank among the distinct
    hashes (a hash's value, 64 bits, does not fit vLLM's token ids; its rank does, one
    id per hash). Empty where the trace has no hashes."""
    if table.prefix_blocks is None:
        return np.zeros(0, np.int64)
    ranks = np.unique(table.prefix_blocks, return_inverse=True)[1]
    return HASHED_TOKEN + ranks.astype(np.int64).reshape(-1)


def prompt_tokens(
    table: RequestTable, request: int, block_tokens: int, block_ids: np.ndarray
) -> list[int]:
    """Request ``request``'s prompt as token ids (see the module docstring);
    ``block_ids`` are :func:`hashed_block_tokens` of ``table``."""
    length = int(table.prompt_tokens[request])
    tokens: list[int] = []
    if table.prefix_offsets is not None and table.prefix_blocks is not None:
        start, end = table.prefix_offsets[request], table.prefix_offsets[request + 1]
        for token in block_ids[start:end].tolist():
            tokens += [token] * block_tokens
    del tokens[length:]
    tokens += [request] * (length - len(tokens))
    return tokens


class UnfinishedRequest:
    """A request handed to vLLM and not finished: its row in the table, vLLM's
    ``Request``, and what the step path reads of it each step (Python numbers: a step
    holds a few rows, where an array operation costs more than a loop over them)."""

    __slots__ = (
        "accepted",
        "emitted",
        "index",
        "left",
        "request",
        "slot",
        "spec_steps",
        "target",
    )

    def __init__(self, index: int, request: Any, target: int, left: int) -> None:
        self.index, self.request = index, request
        self.target = target  # tokens before decoding (prompt, plus output once preempted)
        self.slot = 0  # 0 while not running
        self.accepted = 1  # num_accepted_tokens of its next spec row
        self.left = left  # output tokens still to emit
        self.emitted = 0  # output tokens emitted
        self.spec_steps = 0  # spec rows it ran


def placeholder_drafts(out: Any, ids: np.ndarray, decoding: np.ndarray) -> np.ndarray:
    """``[R], int64`` placeholder drafts of prefill rows: vLLM pads an admitted
    request with one token left to ``1 + num_spec_tokens`` rows when others run
    (its full-graph padding); they are rejected, the row samples one token.

    Args:
        out: vLLM's ``SchedulerOutput`` of the step.
        ids: ``[R], int64`` the rows' requests. decoding: ``[R], bool`` the decode rows.
    """
    padded = np.zeros(ids.size, np.int64)
    drafts = out.scheduled_spec_decode_tokens
    if drafts:
        for row in np.flatnonzero(~decoding).tolist():
            padded[row] = len(drafts.get(str(ids[row]), ()))
    return padded
