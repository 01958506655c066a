"""The compiled CSV text of results tables: the optional C extension
``stepplan.sim.results._csv`` (``csrc/``, built by ``pip install``), which writes a
table's lines from its columns (``csv_lines``) and reads its number columns back from a
block of plain lines (``read_columns``, about ten times faster than ``np.loadtxt``), each
in one call. ``table.py``'s Python code is the specification of both: the formatter
gives its bytes (``tests/test_csv_text.py``); the reader takes only lines it is sure of
and refuses the rest, which Python then reads, with the same values
(``tests/test_csv_read.py``)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from stepplan.planner.native import source_digest

#: The C sources of the extension (``setup.py`` builds ``_csv`` from them).
SOURCES = Path(__file__).with_name("csrc")
_KINDS = {np.dtype(np.int64): "i", np.dtype(np.float64): "f"}


def load_compiled_csv() -> ModuleType | None:
    """The compiled module, or ``None`` where it is not installed or was built from other
    sources than those beside this file (then Python formats and reads every table)."""
    try:
        module = importlib.import_module(f"{__package__}._csv")
    except ImportError:
        return None
    if SOURCES.is_dir() and getattr(module, "SOURCE_DIGEST", None) != source_digest(SOURCES):
        return None
    return module


def read_number_lines(
    compiled: ModuleType,
    data: bytes,
    offset: int,
    num_fields: int,
    fields: Sequence[int],
    columns: Sequence[np.ndarray],
    first_row: int,
    final: bool,
) -> tuple[int, int] | None:
    """Parse the whole CSV lines of ``data`` from byte ``offset`` on (lines of
    ``num_fields`` fields, each ended by ``\\n``; a last one without it only where
    ``final``, the file's end) into ``columns`` (``[rows]`` int64 or float64 arrays, one
    per field index of ``fields``; an empty float cell is NaN) from row ``first_row`` on,
    until they are full or the lines end. Returns the row after the last one read and the
    offset after its line; ``None`` where a line is not plain (quotes, a carriage return,
    a blank line, other fields than ``num_fields``, a byte beyond ASCII) or a cell not a
    number of a plain form."""
    kinds = "".join(_KINDS[column.dtype] for column in columns)
    return compiled.read_columns(
        data, offset, num_fields, tuple(fields), kinds, tuple(columns), first_row, final
    )
