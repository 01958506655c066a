"""``StepRows``: its list path (the vLLM scheduler's, a few rows a step) writes what its
array path (stepplan's scheduler's) writes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.scheduler.state import (
    ATTENTION_PAIRS,
    DECODING,
    EMITS_FIRST,
    KV_TOKENS,
    SPEC,
    StepRows,
)

FIELDS = ("ids", "query_lens", "computed", "slots", "drafts", "accepted", "flags", "info")

row = st.tuples(
    st.integers(0, 10**6),  # request
    st.integers(1, 8192),  # q
    st.integers(0, 10**6),  # computed
    st.sampled_from([0, EMITS_FIRST, DECODING, DECODING | SPEC]),
    st.integers(0, 512),  # slot
    st.integers(1, 8),  # accepted
)


@settings(max_examples=200, deadline=None)
@given(st.lists(row, min_size=1, max_size=40))
def test_fill_lists_writes_what_fill_writes(rows):
    ids, q, computed, flags, slots, accepted = (list(column) for column in zip(*rows, strict=True))
    by_arrays, by_lists = StepRows(64), StepRows(64)
    by_arrays.fill(
        np.array(ids, np.int64),
        np.array(q, np.int64),
        np.array(computed, np.int64),
        np.array(flags, np.uint8),
        np.array(slots, np.int32),
        np.array(accepted, np.int32),
    )
    kv_tokens, pairs = by_lists.fill_lists(ids, q, computed, flags, slots, accepted)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(by_lists, name), getattr(by_arrays, name), name)
    assert kv_tokens == by_arrays.info[KV_TOKENS] and type(kv_tokens) is int
    assert pairs == by_arrays.info[ATTENTION_PAIRS]
