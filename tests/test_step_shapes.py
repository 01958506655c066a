"""The distinct step shapes (``StepShapes``) kept a chunk at a time are every step's
shapes, counted, in the order of each row's bytes -- for any values, negative and wide
ones included (the packed keys of ``add`` take more words then), and any chunking."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.results.schema import STEP_COUNT
from stepplan.sim.results.sim_result import SHAPE_COLUMNS, StepShapes

values = st.one_of(st.integers(0, 3), st.integers(0, 2**20), st.integers(-(2**63), 2**63 - 1))
rows = st.lists(st.tuples(*[values] * len(SHAPE_COLUMNS)), min_size=1, max_size=60)


@settings(max_examples=80, deadline=None)
@given(rows=rows, chunk=st.integers(1, 25))
def test_shapes_are_every_row_counted_in_byte_order(rows, chunk) -> None:
    array = np.array(rows, dtype=np.int64)
    shapes = StepShapes()
    for start in range(0, len(array), chunk):
        part = array[start : start + chunk]
        shapes.add({name: part[:, i] for i, name in enumerate(SHAPE_COLUMNS)})
    table = shapes.table()
    got = [tuple(int(table[name][i]) for name in SHAPE_COLUMNS) for i in range(table.num_rows)]
    counted = Counter(map(tuple, array.tolist()))
    assert dict(zip(got, table[STEP_COUNT].tolist(), strict=True)) == counted
    # each row's bytes, as memcmp orders them: the order the table keeps
    keys = [np.array(shape, dtype=np.int64).tobytes() for shape in got]
    assert keys == sorted(keys)
