"""CSV chunks of number columns are parsed in C (``np.loadtxt``); the result is the
careful cell-by-cell reader's, for any values, empty cells, chunking and bad cells."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.results import table as table_module
from stepplan.sim.results.schema import FLOAT, INT, TEXT, Column, TableSchema
from stepplan.sim.results.table import ResultsError, iter_csv, join_tables

SCHEMA = TableSchema(
    "t.csv",
    "a test table",
    (
        Column("step", INT, "", ""),
        Column("note", TEXT, "", ""),
        Column("value", FLOAT, "s", ""),
        Column("count", INT, "", ""),
        Column("last", FLOAT, "", ""),
    ),
)
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=64), st.just(math.nan))
rows = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from(["", "x", "graph"]),
        floats,
        st.integers(-(2**40), 2**40),
        floats,
    ),
    max_size=40,
)


def text_of(rows: list[tuple]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "" if value != value else repr(value)
        return str(value)

    lines = [",".join(SCHEMA.names)] + [",".join(map(cell, row)) for row in rows]
    return "\n".join(lines) + "\n"


def read(path, columns, chunk: int):
    return join_tables(list(iter_csv(path, SCHEMA, columns=columns, rows=chunk)), SCHEMA)


@settings(max_examples=60, deadline=None)
@given(
    rows=rows,
    chunk=st.integers(1, 50),
    columns=st.sampled_from([None, ("step", "value", "count", "last"), ("value",), ("last",)]),
)
def test_the_c_parse_equals_the_careful_reader(tmp_path_factory, rows, chunk, columns):
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_text(text_of(rows))
    fast = read(path, columns, chunk)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(table_module, "_number_columns", lambda *args: None)
        careful = read(path, columns, chunk)
    assert list(fast) == list(careful)
    for name in careful:
        assert fast[name].dtype == careful[name].dtype, name
        np.testing.assert_array_equal(fast[name], careful[name])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("3,,1.5,2.5,1", "column 'count' has '2.5', expected an integer"),
        ("3,,1.5,,1", "column 'count' has '', expected an integer"),
        ("3,,x,2,1", "column 'value' has 'x', expected a number"),
        ("3,,1.5,2,1,9", "6 fields, the header has 5"),
        ("3,,1.5,2", "4 fields, the header has 5"),
    ],
)
def test_a_bad_cell_names_its_line_as_before(tmp_path, line, message):
    good = [(i, "", 0.5, i, 1.0) for i in range(5)]
    lines = text_of(good).splitlines()
    path = tmp_path / "t.csv"
    path.write_text("\n".join([*lines[:4], line, *lines[4:]]) + "\n")
    with pytest.raises(ResultsError, match=f"t.csv:5: {message}"):
        read(path, ("step", "value", "count"), 64)
