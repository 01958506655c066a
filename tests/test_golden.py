"""The simulator's results equal the golden digests made by the code before the redesign."""

from __future__ import annotations

import json

import pytest
from golden_sim import GOLDEN, RENAMED, RUNS, digests, simulate_run

EXPECTED = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize(("name", "trace", "settings"), RUNS, ids=[run[0] for run in RUNS])
def test_results_equal_the_golden(name, trace, settings):
    steps, requests = simulate_run(trace, settings)
    # Every rename maps a column of today's output to a golden column.
    names = {*steps, *requests}
    golden = {*EXPECTED[name]["steps"], *EXPECTED[name]["requests"]}
    assert all(new in names and old in golden for new, old in RENAMED.items()), RENAMED
    for table, columns in (("steps", steps), ("requests", requests)):
        got, want = digests(columns), EXPECTED[name][table]
        # New columns may appear; every golden column must still be there, unchanged.
        assert set(want) <= set(got), f"{table}: columns gone: {sorted(set(want) - set(got))}"
        changed = sorted(column for column in want if got[column] != want[column])
        assert not changed, f"{name} {table}: columns changed: {changed}"
