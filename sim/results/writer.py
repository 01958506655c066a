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
import itertools
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .outdir import OutDirError, ResultsFolder, no_space
from .records import CHUNK_STEPS, TRACE_COLUMNS, RequestRows
from .schema import MEASURED, MEASURED_STEPS, REQUESTS, STEPS, TEXT, TableSchema
from .table import CsvWriter, csv_cells, csv_lines

#: Columns of the steps in memory that ``measured_steps.csv`` holds, not ``steps.csv``.
_MEASURED_ONLY = frozenset(MEASURED_STEPS.names) - {"step"}


class TableFile(Protocol):
    """A table file written a chunk of rows at a time."""

    path: Path

    def append(self, columns: Mapping[str, np.ndarray]) -> None: ...

    def write(self, text: str) -> None: ...

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

    def write(self, text: str) -> None:
        raise TypeError("a Parquet file takes columns (append), not CSV text")

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


class RequestLines:
    """``requests.csv``'s lines of a run: its trace's columns formatted before the run into
    a spool file in the staging folder, then joined with each row's run columns once the
    row is final. The rows of requests the run never scheduled -- millions, when a long
    trace is stopped early -- share their run cells, so theirs take a string join and no
    formatting: a stopped run has little left to do."""

    def __init__(self, stage: Path, rows: RequestRows, stop: threading.Event | None) -> None:
        if REQUESTS.names[: len(TRACE_COLUMNS)] != TRACE_COLUMNS:
            raise ValueError(f"requests.csv must begin with {TRACE_COLUMNS}")
        path = stage / ".requests-trace.csv"
        #: Whether every row is spooled (a stop while spooling leaves it short).
        self.complete = False
        with path.open("w", newline="") as spool:
            for first in range(0, rows.count, CHUNK_STEPS):
                if stop is not None and stop.is_set():  # stopped before the first step
                    break
                columns = rows.columns(first, min(rows.count, first + CHUNK_STEPS))
                cells = [csv_cells(columns[name]) for name in TRACE_COLUMNS]
                spool.write(csv_lines(cells, [False] * len(cells)))  # numbers: never quoted
            else:
                self.complete = True
        self._spool = path.open(newline="")

    def lines(self, rows: RequestRows, start: int, stop: int) -> str:
        """The lines of rows ``start:stop`` (the next rows of the spool)."""
        heads = list(itertools.islice(self._spool, stop - start))  # each ends in "\n"
        columns = rows.columns(start, stop)
        run = [columns[name] for name in columns if name not in TRACE_COLUMNS]
        untouched = np.ones(stop - start, bool)
        for values in run:
            first = _first(values)
            untouched &= (values == first) | (np.isnan(values) & np.isnan(first))
        tail = "," + ",".join(csv_cells(_first(values))[0] for values in run) + "\n"
        edges = [0, *(np.flatnonzero(np.diff(untouched.astype(np.int8))) + 1), stop - start]
        pieces = []
        for a, b in itertools.pairwise(edges):
            if untouched[a]:  # the run never touched these: their run cells are one tail
                pieces.append("".join(heads[a:b]).replace("\n", tail))
            else:
                cells = [[h[:-1] for h in heads[a:b]], *(csv_cells(v[a:b]) for v in run)]
                pieces.append(csv_lines(cells, [False] * len(cells)))
        return "".join(pieces)

    def close(self) -> None:
        self._spool.close()


def _first(values: np.ndarray) -> np.ndarray:
    """``[1]``: what a run column holds for a request the run never scheduled (NaN for
    times, 0 for counts)."""
    return np.full(1, np.nan if values.dtype.kind == "f" else 0, values.dtype)


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
    interrupt. ``parquet`` writes the tables as Parquet (the caller checks pyarrow);
    ``stop`` (the run's stop event) cuts short the work before the first step."""

    def __init__(
        self,
        folder: ResultsFolder,
        *,
        parquet: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        self.folder = folder
        self._parquet, self._stop = parquet, stop
        self._requests_written = 0
        self._steps_seen = 0
        self._tables: dict[str, TableFile] = {}  # by schema file, made with their first rows
        self._lines: RequestLines | None = None
        try:
            folder.staging()
        except OSError as exc:
            raise self._failed(exc, "the staging folder") from None

    def add_steps(self, steps: Mapping[str, np.ndarray]) -> None:
        """One chunk of steps (``schema.STEPS_IN_MEMORY`` columns, ``[k]`` each; a
        table read back from an older folder may lack the measured ones)."""
        self._steps_seen += len(steps["step"])
        self._append(STEPS, {k: v for k, v in steps.items() if k not in _MEASURED_ONLY})
        # a deployment's steps carry their replica first (``deployment/loop.py``)
        names = ("replica", *MEASURED_STEPS.names) if "replica" in steps else MEASURED_STEPS.names
        self._append(MEASURED_STEPS, {k: steps[k] for k in names if k in steps})

    def start(self, rows: RequestRows) -> None:
        """Before the run: its requests' trace columns go to a spool (CSV only:
        :class:`RequestLines`)."""
        if self._parquet:
            return
        try:
            self._lines = RequestLines(self.folder.staging(), rows, self._stop)
            self._open(REQUESTS, tuple(rows.columns(0, 0)))
        except OSError as exc:
            self.discard()
            raise self._failed(exc, "the requests' spool") from None

    def add_requests(self, rows: RequestRows, *, every: bool = False) -> None:
        """The rows not written yet that are final: up to the first unfinished request
        (``every``: all of them, the run is over)."""
        start = self._requests_written
        stop = rows.count if every else rows.first_unfinished(start)
        for first in range(start, stop, CHUNK_STEPS):
            last = min(stop, first + CHUNK_STEPS)
            if self._lines is None or not self._lines.complete:
                self.add_request_columns(rows.columns(first, last))
                continue
            try:
                self._tables[REQUESTS.file].write(self._lines.lines(rows, first, last))
            except OSError as exc:
                self.discard()
                raise self._failed(exc, REQUESTS.file) from None
            self._requests_written = last

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
            if self._lines is not None:
                self._lines.close()
                self._lines = None
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
        if self._lines is not None:
            self._lines.close()
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
