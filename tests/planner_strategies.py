"""Hypothesis strategies for valid step batches (shared by the planner tests)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from stepplan.planner import PlannerConfig, StepBatch


@st.composite
def step_batches(
    draw: st.DrawFn,
    max_rows: int = 40,
    max_groups: int = 3,
    max_prefill: int = 300,
    graph_modes: tuple[str, ...] = ("none", "full", "mixed"),
) -> tuple[StepBatch, PlannerConfig]:
    """A valid (batch, config): rows of every kind in any order, unique slots per group,
    a graph mode of ``graph_modes``."""
    num_spec_tokens = draw(st.integers(0, 5))
    q_max = num_spec_tokens + 1
    rows = draw(st.integers(0, max_rows))
    kinds = draw(st.lists(st.sampled_from("sdpz"), min_size=rows, max_size=rows))
    query_lens, drafts, accepted = [], [], []
    for kind in kinds:
        draft = draw(st.integers(0, num_spec_tokens)) if kind == "s" else -1
        length = {"s": draft + 1, "d": 1, "z": 0}.get(kind) or draw(st.integers(2, max_prefill))
        query_lens.append(length)
        drafts.append(draft)
        accepted.append(draw(st.integers(1, q_max)) if kind == "s" else draw(st.integers(0, 9)))
    groups = draw(st.integers(1, max_groups))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    slots = np.stack([rng.permutation(np.arange(1, 3 * rows + 2))[:rows] for _ in range(groups)])
    computed = rng.integers(0, 3, rows) * rng.integers(1, 500, rows)
    padded_tokens = sum(query_lens) + draw(st.integers(0, 8)) if draw(st.booleans()) else None
    batch = StepBatch(
        query_lens=np.array(query_lens, dtype=np.int64),
        num_computed_tokens=computed,
        slots=slots.reshape(groups, rows),
        num_draft_tokens=drafts,
        num_accepted_tokens=accepted,
        num_padded_tokens=padded_tokens,
    )
    config = PlannerConfig(
        num_spec_tokens=num_spec_tokens,
        graph_mode=draw(st.sampled_from(graph_modes)),
        graph_sizes=draw(st.sampled_from([None, (1, 2, 4, 8, 16), (4, 64, 512), (1024,)])),
        max_num_seqs=max(rows, 1) + draw(st.integers(0, 64)),
        prefill_tile_tokens=draw(st.sampled_from([8, 16, 64])),
    )
    return batch, config
