"""The compiled CSV formatter changes nothing: a table's lines are the bytes of
``csv_lines(csv_cells(...))`` (``sim/results/table.py``'s specification), floats as Python's
``repr`` -- whatever the values, repeated or not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.planner.native import source_digest
from stepplan.sim.results.csv_compiled import SOURCES, load_compiled_csv
from stepplan.sim.results.table import csv_cells, csv_lines, csv_text

COMPILED = load_compiled_csv()
needs_compiled = pytest.mark.skipif(COMPILED is None, reason="the CSV formatter is not built")


def test_the_compiled_formatter_is_built():
    """The install builds it: a failed build must fail here, not pass by skipping."""
    assert COMPILED is not None


def test_one_module_from_one_folder_writes_and_reads_the_csv_text():
    # the formatter and the number reader are one extension, built from csrc/ alone
    assert COMPILED is not None and COMPILED.__name__ == "stepplan.sim.results._csv"
    assert hasattr(COMPILED, "csv_lines") and hasattr(COMPILED, "read_columns")
    assert source_digest(SOURCES) == COMPILED.SOURCE_DIGEST
    assert sorted(path.name for path in SOURCES.iterdir() if path.suffix in (".c", ".h")) == [
        "csv.h",
        "csv_read.c",
        "csv_text.c",
        "module.c",
    ]


def python_text(arrays):
    text = [array.dtype.kind in "OUS" for array in arrays]
    return csv_lines([csv_cells(array) for array in arrays], text)


# Any float64 (NaN, infinities, -0.0, subnormals), and a few repeated values, as a step
# table has (zeros, the same cost term of a repeated shape).
floats = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
repeated = st.sampled_from([0.0, -0.0, 1e-6, 0.1 + 0.2, 8.02e-06, 1e16, 1e-5, 123456789.0])
ints = st.integers(-(2**63), 2**63 - 1)
texts = st.text(max_size=6)


@st.composite
def tables(draw):
    rows = draw(st.integers(0, 40))
    kinds = draw(st.lists(st.sampled_from("fril"), min_size=1, max_size=5))
    arrays = []
    for kind in kinds:
        if kind == "f":
            arrays.append(np.array(draw(st.lists(floats, min_size=rows, max_size=rows)), float))
        elif kind == "r":
            values = draw(st.lists(repeated, min_size=rows, max_size=rows))
            arrays.append(np.array(values, np.float64))
        elif kind == "i":
            arrays.append(np.array(draw(st.lists(ints, min_size=rows, max_size=rows)), np.int64))
        else:
            arrays.append(np.array(draw(st.lists(texts, min_size=rows, max_size=rows)), str))
    return arrays


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(tables())
def test_compiled_lines_equal_the_python_specification(arrays):
    assert csv_text(arrays) == python_text(arrays)
    assert csv_text(arrays, compiled=None) == python_text(arrays)


@needs_compiled
@settings(max_examples=100, deadline=None)
@given(st.lists(floats, min_size=1, max_size=200), st.integers(0, 2**32 - 1))
def test_every_float_is_its_repr(values, seed):
    """The formatter's own call, on floats alone: each cell ``repr`` (NaN empty), however
    often a value repeats within the call (its cache of reprs)."""
    column = np.array(values * 3, np.float64)
    np.random.default_rng(seed).shuffle(column)
    lines = COMPILED.csv_lines([column, column]).splitlines()
    assert lines == [",".join(["" if v != v else repr(v)] * 2) for v in column.tolist()]


@needs_compiled
def test_other_columns_take_the_python_path():
    """int32 and bool columns, and text that csv quotes, are formatted by Python: the same
    text as ``csv.writer``'s."""
    arrays = [np.array([1, 2], np.int32), np.array([True, False]), np.array(['a,"b', "c"])]
    assert csv_text(arrays) == python_text(arrays) == '1,True,"a,""b"\n2,False,c\n'
    with pytest.raises(TypeError):
        COMPILED.csv_lines([np.array([1, 2], np.int32), np.array([1.0, 2.0])])
    with pytest.raises(ValueError, match="different lengths"):
        COMPILED.csv_lines([np.zeros(2), np.zeros(3)])
