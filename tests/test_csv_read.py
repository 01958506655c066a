"""The compiled reader of number columns (``csv_compiled.py``, ``sim/results/csrc/``) gives
what the Python reader gives (its specification): the same chunks, columns, dtypes and
bytes, or the same error, for any cells -- plain numbers, empty cells, quoted cells, odd
number forms, blank lines, carriage returns, other field counts -- and any chunking."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_csv_number_columns import SCHEMA

from stepplan.sim.results import table
from stepplan.sim.results.csv_compiled import load_compiled_csv, read_number_lines
from stepplan.sim.results.table import ResultsError, iter_csv

COMPILED = load_compiled_csv()
pytestmark = pytest.mark.skipif(COMPILED is None, reason="the compiled reader is not built")

NUMBERS = ("step", "value", "count", "last")
floats = st.floats(width=64).map(lambda v: "" if v != v else repr(v))
#: Cells the compiled reader refuses or must read exactly as Python does.
odd = st.sampled_from(
    [
        "",
        "-0",
        "+5",
        "007",
        "1.",
        ".5",
        "-.5e-3",
        "1E5",
        "1e400",
        "1e-400",
        "inf",
        "-inf",
        "nan",
        "-nan",
        "Infinity",
        "1_000",
        " 1",
        "1 ",
        '"1"',
        '"1,2"',
        "9" * 18,
        "9" * 19,
        "1" * 70,
        "0x10",
        "1e",
        "e5",
        "-",
        "é",
        "4.9406564584124654e-324",
        "2.2250738585072011e-308",
        "9007199254740993",
        "0.1000000000000000055511151231257827",
    ]
)
ints = st.integers(-(2**63), 2**63 - 1).map(str)
cells = st.tuples(
    st.one_of(ints, odd),
    st.sampled_from(["", "x", "graph", '"a,b"', '"say ""hi"""']),
    st.one_of(floats, odd),
    st.one_of(st.integers(-(2**40), 2**40).map(str), odd),
    st.one_of(floats, odd),
)
plain = st.tuples(
    st.integers(-(2**40), 2**40).map(str),
    st.sampled_from(["", "x", "graph"]),
    floats,
    st.integers(0, 10**6).map(str),
    floats,
)


def outcome(path, columns, chunk: int, compiled):
    """The chunks' columns as (name, dtype, bytes), or the error's message."""
    try:
        chunks = list(iter_csv(path, SCHEMA, columns=columns, rows=chunk, compiled=compiled))
    except ResultsError as error:
        return str(error)
    return [[(k, v.dtype.str, v.tobytes()) for k, v in part.items()] for part in chunks]


def write(tmp_path, rows, ending: str = "\n", last: bool = True):
    path = tmp_path / "t.csv"
    lines = [",".join(SCHEMA.names), *(",".join(row) for row in rows)]
    path.write_bytes((ending.join(lines) + (ending if last else "")).encode())
    return path


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.one_of(plain, plain, cells), max_size=30),
    chunk=st.integers(1, 12),
    columns=st.sampled_from([None, NUMBERS, ("value",), ("last", "step")]),
    ending=st.sampled_from(["\n", "\n", "\r\n"]),
    last=st.booleans(),
    block=st.sampled_from([1, 7, 64, table.READ_BYTES]),
)
def test_compiled_reads_as_python(
    tmp_path_factory, rows, chunk, columns, ending, last, block
) -> None:
    path = write(tmp_path_factory.mktemp("csv"), rows, ending, last)
    with mock.patch.object(table, "READ_BYTES", block):  # lines across blocks
        compiled = outcome(path, columns, chunk, COMPILED)
    assert compiled == outcome(path, columns, chunk, None)


@pytest.mark.parametrize(
    "body",
    [
        "1,x,0.5,2,\n\n3,x,1.5,4,2.5\n",  # a blank line
        "1,x,0.5,2\n",  # a field short
        "1,x,0.5,2,3,4\n",  # a field too many
        "1,x,0.5,,3\n",  # an empty integer cell
        "1,x,0.5,2.0,3\n",  # a float in an integer column
        "1,x,abc,2,3\n",  # not a number
        "",  # a header alone
    ],
)
def test_refused_lines_read_by_python(tmp_path, body: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(",".join(SCHEMA.names) + "\n" + "0,y,1.0,1,1.0\n" * 3 + body)
    for chunk, block in ((1, 3), (2, 1 << 22), (100, 5)):
        with mock.patch.object(table, "READ_BYTES", block):
            compiled = outcome(path, NUMBERS, chunk, COMPILED)
        assert compiled == outcome(path, NUMBERS, chunk, None)


def test_plain_lines_read_in_one_call() -> None:
    data = b"1,x,0.25,3,\n-4,y,1e-3,0,2.5"
    columns = [np.empty(3, np.int64), np.empty(3), np.empty(3, np.int64), np.empty(3)]
    # not the file's end: the last line, without its newline, waits for more
    assert read_number_lines(COMPILED, data, 0, 5, [0, 2, 3, 4], columns, 0, False) == (1, 12)
    assert read_number_lines(COMPILED, data, 12, 5, [0, 2, 3, 4], columns, 1, True) == (2, 27)
    assert columns[0][:2].tolist() == [1, -4] and columns[1][:2].tolist() == [0.25, 0.001]
    assert columns[2][:2].tolist() == [3, 0] and math.isnan(columns[3][0]) and columns[3][1] == 2.5
    full = [np.empty(1, np.int64)]
    assert read_number_lines(COMPILED, data, 0, 5, [0], full, 0, True) == (1, 12)
    assert read_number_lines(COMPILED, b'1,"x",0.25,3,1\n', 0, 5, [0], full, 0, True) is None
