"""``RequestLog``: its list path (a few rows a step, the vLLM scheduler's) records what
its array path records, step after step."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.results.records import RequestLog

N = 12
FIELDS = ("first_token_s", "finish_s", "last_emit_s", "num_steps", "drafted", "accepted")

step_rows = st.lists(
    st.tuples(st.integers(0, N - 1), st.integers(0, 4), st.booleans(), st.integers(0, 3)),
    max_size=N,
    unique_by=lambda row: row[0],  # a step's requests are distinct
)


@settings(max_examples=150, deadline=None)
@given(st.lists(step_rows, min_size=1, max_size=300), st.floats(0.001, 2.0))
def test_record_rows_records_what_record_records(steps, step_s):
    by_arrays, by_lists = RequestLog(N), RequestLog(N)
    for number, rows in enumerate(steps):
        end_s = (number + 1) * step_s
        ids = [row[0] for row in rows]
        emitted = [row[1] for row in rows]
        finished = [row[2] for row in rows]
        drafts = [row[3] for row in rows]
        accepted = [min(row[1], row[3]) for row in rows]
        by_lists.record_spec_rows(ids, drafts, accepted)
        by_lists.record_rows(ids, emitted, finished, end_s)
        id_array = np.array(ids, np.int64)
        by_arrays.record_spec(id_array, np.array(drafts, np.int64), np.array(accepted, np.int64))
        by_arrays.record(id_array, np.array(emitted, np.int64), np.array(finished, bool), end_s)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(by_lists, name), getattr(by_arrays, name), name)
    np.testing.assert_array_equal(by_lists.itl_s, by_arrays.itl_s)
