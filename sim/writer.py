"""Writing a results folder as a run goes (``outdir.py`` says what it may touch).

The steps' tables are written a chunk at a time as the loop hands them on (a
``outcome.StepStore``), the request rows as they become final (every request before the
first unfinished one), the rest and the summary at the end; every file waits in the
folder's staging area and is renamed into place then. So writing takes no more memory
than a chunk, and a stopped run has little left to write. A full disk ends the run with
one line naming the folder and what was kept.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .outdir import OutDirError, ResultsFolder, no_space
from .records import CHUNK_STEPS, RequestRows
from .schema import MEASURED, MEASURED_STEPS, REQUESTS, STEPS, TEXT, TableSchema
from .table import CsvWriter

#: Columns of the steps in memory that ``measured_steps.csv`` holds, not ``steps.csv``.
_MEASURED_ONLY = frozenset(MEASURED_STEPS.names) - {"step"}


class TableFile(Protocol):
    """A table file written a chunk of rows at a time."""

    path: Path

    def append(self, columns: Mapping[str, np.ndarray]) -> None: ...

    def close(self) -> None: ...


class ParquetWriter:
    """A Parquet file written a chunk of rows (a row group) at a time; needs pyarrow.
    Columns are typed by ``schema`` (others, or all without one, as their first chunk's)."""

    def __init__(
        self, path: Path, names: tuple[str, ...], schema: TableSchema | None = None
    ) -> None:
        self.path, self.names, self._schema = path, names, schema
        self._writer: Any = None

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays = {name: self._values(name, columns[name]) for name in self.names}
        table = pa.table(arrays)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table.cast(self._writer.schema))

    def _values(self, name: str, values: np.ndarray) -> Any:
        column = self._schema.get(name) if self._schema is not None else None
        array = np.asarray(values)
        if array.dtype.kind in "OUS" or (column is not None and column.dtype == TEXT):
            return array.astype(str).tolist()
        return array if column is None else array.astype(column.numpy_dtype)

    def close(self) -> None:
        if self._writer is None:  # no rows: the columns alone
            self.append({name: np.zeros(0) for name in self.names})
        self._writer.close()


def write_parquet(path: Path, columns: Mapping[str, np.ndarray]) -> None:
    """Write ``columns`` (``[num_rows]`` each) as one Parquet file (needs pyarrow)."""
    writer = ParquetWriter(path, tuple(columns))
    writer.append(columns)
    writer.close()


def parquet_available() -> bool:
    """Whether ``pyarrow`` can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def table_file(
    folder: Path, schema: TableSchema, names: tuple[str, ...], parquet: bool
) -> TableFile:
    """``schema``'s table in ``folder`` with the columns ``names``: CSV, or Parquet with
    ``parquet``."""
    if parquet:
        return ParquetWriter(folder / schema.file.replace(".csv", ".parquet"), names, schema)
    return CsvWriter(folder / schema.file, names)


class ResultsWriter:
    """A run's results written into a claimed folder as the run goes (see the module
    docstring); a ``with`` block discards what it wrote when it ends in an error or an
    interrupt. ``parquet`` writes the tables as Parquet (the caller checks pyarrow)."""

    def __init__(self, folder: ResultsFolder, *, parquet: bool = False) -> None:
        self.folder = folder
        self._parquet = parquet
        self._requests_written = 0
        self._steps_seen = 0
        self._tables: dict[str, TableFile] = {}  # by schema file, made with their first rows
        try:
            folder.staging()
        except OSError as exc:
            raise self._failed(exc, "the staging folder") from None

    def add_steps(self, steps: Mapping[str, np.ndarray]) -> None:
        """One chunk of steps (``schema.STEPS_IN_MEMORY`` columns, ``[k]`` each; a
        table read back from an older folder may lack the measured ones)."""
        self._steps_seen += len(steps["step"])
        self._append(STEPS, {k: v for k, v in steps.items() if k not in _MEASURED_ONLY})
        self._append(MEASURED_STEPS, {k: steps[k] for k in MEASURED_STEPS.names if k in steps})

    def add_requests(self, rows: RequestRows, *, every: bool = False) -> None:
        """The rows not written yet that are final: up to the first unfinished request
        (``every``: all of them, the run is over)."""
        start = self._requests_written
        stop = rows.count if every else rows.first_unfinished(start)
        for first in range(start, stop, CHUNK_STEPS):
            self.add_request_columns(rows.columns(first, min(stop, first + CHUNK_STEPS)))

    def add_request_columns(self, columns: Mapping[str, np.ndarray]) -> None:
        """The next request rows, as ``requests.csv``'s columns (``[k]`` each)."""
        self._append(REQUESTS, columns)
        self._requests_written += len(columns["request_id"])

    def finish(self, summary: dict[str, Any], rows: RequestRows | None = None) -> Path:
        """Write the remaining request rows (of ``rows``) and the summary, then put every
        file into the folder; the folder."""
        if rows is not None:
            self.add_requests(rows, every=True)
        documents = {
            "summary.json": {k: v for k, v in summary.items() if k != MEASURED},
            "measured.json": summary.get(MEASURED, {}),
        }
        try:
            for schema in (STEPS, MEASURED_STEPS, REQUESTS):  # a table without rows too
                self._open(schema, schema.names)
            for table in self._tables.values():
                table.close()
            names = [table.path.name for table in self._tables.values()]
            for name, document in documents.items():
                (self.folder.staging() / name).write_text(json.dumps(document, indent=2) + "\n")
                names.append(name)
            complete = bool(summary.get("complete", True))
            self.folder.put(lambda stage: names, complete=complete)
        except OSError as exc:
            self.discard()
            raise self._failed(exc, "the summary") from None
        return self.folder.path

    def discard(self) -> None:
        """Close the files and remove them with the staging folder."""
        for table in self._tables.values():
            with contextlib.suppress(OSError):  # a full disk can't flush it: removed anyway
                table.close()
        self.folder.discard_staging()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is not None:
            self.discard()

    def _open(self, schema: TableSchema, names: tuple[str, ...]) -> TableFile:
        if schema.file not in self._tables:
            stage = self.folder.staging()
            self._tables[schema.file] = table_file(stage, schema, names, self._parquet)
        return self._tables[schema.file]

    def _append(self, schema: TableSchema, columns: Mapping[str, np.ndarray]) -> None:
        try:
            self._open(schema, tuple(columns)).append(columns)
        except OSError as exc:
            self.discard()
            raise self._failed(exc, schema.file) from None

    def _failed(self, error: OSError, what: str) -> OutDirError:
        """One line: the folder, what could not be written, and what was kept."""
        folder = self.folder.shown
        kept = (
            "nothing of this run was kept: the folder holds what it held before "
            "(removed, if the run made it)"
        )
        where = f", {self._steps_seen:,} steps in" if self._steps_seen else ""
        if no_space(error):
            return OutDirError(
                f"{folder}: no space left on the device while writing {what}{where}; {kept}"
            )
        reason = error.strerror or str(error)
        return OutDirError(f"{folder}: cannot write {what} ({reason}){where}; {kept}")
