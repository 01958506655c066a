"""A simulation's result (:class:`SimResult`) and its results folder: writing it, and
reading it back for the CLI, the plots and the report.

The folder's files, every column of its tables and every key of its summary are
declared in ``schema.py`` (``docs/results.md`` shows them); ``outdir.py`` says what a
write may touch. The summary itself is made in ``summary.py``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..timing.cost import seed_host_us
from .outdir import ResultsFolder
from .records import CHUNK_STEPS
from .schema import (
    KIND_ROWS,
    KIND_TOKENS,
    MEASURED,
    MEASURED_STEPS,
    REQUESTS,
    RESULT_FILES,
    STEP_COUNT,
    STEPS,
    STEPS_IN_MEMORY,
    TableSchema,
)
from .table import (
    READ_ROWS,
    ResultsError,
    Table,
    header_names,
    iter_csv,
    join_tables,
    read_text,
)
from .writer import ResultsWriter, parquet_available

#: What a results folder holds, as error messages say it.
EXPECTED_FILES = "expected summary.json, steps.csv and requests.csv, as `stepplan simulate` writes"


def _as_table(schema: TableSchema) -> Callable[[Mapping[str, object]], Table]:
    """The converter of columns to a :class:`Table` typed by ``schema``."""

    def convert(columns: Mapping[str, object]) -> Table:
        return (
            columns
            if isinstance(columns, Table)
            else Table.from_columns(schema.file, columns, schema)
        )

    return convert


@attrs.frozen(eq=False)
class SimResult:
    """A simulation, finished or stopped early (``summary["complete"]``), just run or read
    back from its folder.

    Attributes:
        steps: ``steps.csv``'s columns and ``plan_us`` (``measured_steps.csv``),
            ``[num_steps]`` each, read-only (``schema.STEPS_IN_MEMORY``); columns given
            as a mapping are copied into a :class:`Table`.
        requests: ``requests.csv``'s columns, ``[N]`` each, read-only.
        itl_s: ``[k], float64`` every inter-token gap (empty when read back: the
            summary's ``itl_ms_quantiles`` has their distribution).
        summary: the ``summary.json`` document, with ``measured.json``'s under
            ``"measured"``.
        path: the folder it was read from or written to (``None``: in memory only).
        name: the run's name in legends and titles (``None``: see :attr:`label`).
    """

    steps: Table = attrs.field(converter=_as_table(STEPS_IN_MEMORY))
    requests: Table = attrs.field(converter=_as_table(REQUESTS))
    itl_s: np.ndarray
    summary: dict[str, Any]
    path: Path | None = attrs.field(default=None, kw_only=True)
    name: str | None = attrs.field(default=None, kw_only=True)

    @property
    def label(self) -> str:
        """A short name for legends: :attr:`name`, else the folder name, else ``run``."""
        if self.name is not None:
            return self.name
        return self.path.name if self.path is not None else "run"

    @property
    def config(self) -> Mapping[str, Any]:
        """The run's settings from the summary, by section (empty when absent)."""
        config = self.summary.get("config", {})
        return config if isinstance(config, Mapping) else {}

    def seed_host_us(self, num_groups: int) -> np.ndarray:
        """``[S], float64`` what the seed builder would spend on each step, in µs, over
        ``num_groups`` layer groups: the cost model's rule (``cost.seed_host_us``)."""
        steps = self.steps
        columns = ("num_rows", "num_spec_rows", "num_decode_rows")
        return seed_host_us(*(steps.column(name) for name in columns)) * num_groups


# ----------------------------------------------------------------------------- writing


def write_results(
    result: SimResult,
    out: str | Path | ResultsFolder,
    *,
    parquet: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write ``result`` into the results folder ``out``; returns the folder.

    ``out`` is a folder already claimed (:class:`ResultsFolder`), or a path that is
    claimed for the write: new or empty, or -- with ``overwrite`` -- an earlier stepplan
    run, whose listed files alone are replaced (see ``outdir.py``). The files are written
    a chunk of rows at a time by ``writer.py`` (as a run streams them), staged and renamed
    into place; a failed write leaves the folder as it was.
    """
    if not isinstance(out, ResultsFolder):
        with ResultsFolder.claim(out, overwrite=overwrite, names=RESULT_FILES) as folder:
            return write_results(result, folder, parquet=parquet)
    with ResultsWriter(out, parquet=parquet and parquet_available()) as writer:
        for rows in _chunks(result.steps.num_rows):
            writer.add_steps({name: values[rows] for name, values in result.steps.items()})
        for rows in _chunks(result.requests.num_rows):
            writer.add_request_columns({k: v[rows] for k, v in result.requests.items()})
        return writer.finish(result.summary)


def _chunks(count: int) -> list[slice]:
    return [slice(start, start + CHUNK_STEPS) for start in range(0, count, CHUNK_STEPS)]


# ----------------------------------------------------------------------------- reading


def read_results(folder: str | Path) -> SimResult:
    """Read a results folder: ``summary.json``, ``steps`` and ``requests`` (``.parquet``
    instead of ``.csv`` when the folder has them and pyarrow is installed), and the
    measured files when present, as the ``plan_us`` column and the ``"measured"``
    section. Anything unusable is a :class:`ResultsError` naming the file (and line and
    column). The tables are read a chunk at a time (:func:`iter_steps`); commands that
    need less than every row read the chunks themselves."""
    folder = Path(folder)
    summary = read_summary(folder)
    steps = join_tables(list(iter_steps(folder)), STEPS_IN_MEMORY)
    requests = join_tables(list(iter_table(folder, REQUESTS)), REQUESTS)
    return SimResult(steps, requests, np.zeros(0), summary, path=folder)


def read_summary(folder: Path) -> dict[str, Any]:
    """The folder's ``summary.json`` with ``measured.json`` as its ``measured`` section;
    a folder that is no results folder is a :class:`ResultsError`."""
    if not folder.is_dir():
        raise ResultsError(f"{folder}: not a results folder (no such directory)")
    if not any((folder / name).exists() for name in RESULT_FILES):
        raise ResultsError(f"{folder}: not a results folder ({EXPECTED_FILES})")
    summary = _read_json(folder / "summary.json")
    if not isinstance(summary, dict):
        raise ResultsError(f"{folder / 'summary.json'}: must hold a JSON object")
    if (folder / "measured.json").exists():
        summary[MEASURED] = _read_json(folder / "measured.json")
    return summary


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def iter_steps(folder: Path, columns: Collection[str] | None = None) -> Iterator[Table]:
    """The folder's steps a chunk at a time, with ``measured_steps``' columns (matched on
    ``step``) when the folder has them; ``columns``: only those (``plan_us`` among them
    reads the measured file)."""
    measured_columns = set(MEASURED_STEPS.names) - {"step"}
    stem = MEASURED_STEPS.file.removesuffix(".csv")
    has_measured = any((folder / f"{stem}{ext}").exists() for ext in (".csv", ".parquet"))
    wanted = None if columns is None else [c for c in columns if c not in measured_columns]
    joined = has_measured and (columns is None or bool(measured_columns & set(columns)))
    steps = iter_table(folder, STEPS, None if wanted is None else ["step", *wanted])
    if not joined:
        yield from steps
        return
    for chunk, measured in itertools.zip_longest(steps, iter_table(folder, MEASURED_STEPS)):
        if (
            chunk is None
            or measured is None
            or not np.array_equal(measured.column("step"), chunk.column("step"))
        ):
            raise ResultsError(f"{MEASURED_STEPS.file}: its steps differ from {STEPS.file}'s")
        merged = dict(chunk.columns)
        merged.update((k, v) for k, v in measured.columns.items() if k != "step")
        yield Table.from_columns(chunk.name, merged, STEPS_IN_MEMORY)


def iter_table(
    folder: Path, schema: TableSchema, columns: Collection[str] | None = None
) -> Iterator[Table]:
    """The table ``schema.file`` of ``folder`` a chunk at a time (its ``.parquet`` when
    only that exists); ``columns``: only those (of those the file has)."""
    path = folder / schema.file
    parquet = path.with_suffix(".parquet")
    if path.exists() or not parquet.exists():
        yield from iter_csv(path, schema, columns=columns)
        return
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ResultsError(f"{parquet}: reading Parquet needs pyarrow (not installed)") from None
    file = pq.ParquetFile(parquet)
    names = header_names(parquet, file.schema_arrow.names, schema)
    keys = dict(zip(names, file.schema_arrow.names, strict=True))
    wanted = names if columns is None else [name for name in names if name in set(columns)]
    if file.metadata.num_rows == 0:
        yield Table.from_columns(parquet.name, {n: np.zeros(0) for n in wanted}, schema)
        return
    for batch in file.iter_batches(batch_size=READ_ROWS, columns=[keys[n] for n in wanted]):
        parts = {n: batch.column(keys[n]).to_numpy(zero_copy_only=False) for n in wanted}
        yield Table.from_columns(parquet.name, parts, schema)


#: What sizing a step's CUDA graph depends on (``buckets.step_demand``, the bucketing
#: figure): the columns of a step's shape.
SHAPE_COLUMNS = (
    *KIND_ROWS.values(),
    *KIND_TOKENS.values(),
    "graph_hit",
    "graph_tokens",
    "graph_rows",
)


class StepShapes:
    """The distinct shapes of a run's steps (:data:`SHAPE_COLUMNS`) and how many steps had
    each, gathered a chunk at a time (:meth:`add`): memory grows with the shapes, which
    are few, not with the steps."""

    def __init__(self) -> None:
        self._shapes = np.zeros((0, len(SHAPE_COLUMNS)), np.int64)
        self._counts = np.zeros(0, np.int64)

    def add(self, steps: Mapping[str, np.ndarray]) -> None:
        """A chunk of steps with (at least) the shape columns."""
        if not isinstance(steps, Table):
            steps = Table.from_columns("steps", steps, STEPS_IN_MEMORY)
        block = np.stack([steps.column(name) for name in SHAPE_COLUMNS], axis=1)
        shapes = np.concatenate([self._shapes, block.astype(np.int64)])
        counts = np.concatenate([self._counts, np.ones(len(block), np.int64)])
        _, first, index = np.unique(_packed_rows(shapes), return_index=True, return_inverse=True)
        self._shapes = shapes[first]
        self._counts = np.bincount(index, counts, len(first)).astype(np.int64)

    def table(self) -> Table:
        """The shapes as a step table (with ``num_rows``, ``num_tokens``) and their
        :data:`~.schema.STEP_COUNT`, ordered by each row's bytes."""
        # The order of the bytes of each row, whatever order the packed keys kept them in.
        _, order = np.unique(_row_bytes(self._shapes), return_index=True)
        shapes, counts = self._shapes[order], self._counts[order]
        columns = {name: shapes[:, i] for i, name in enumerate(SHAPE_COLUMNS)}
        columns["num_rows"] = sum(columns[name] for name in KIND_ROWS.values())
        columns["num_tokens"] = sum(columns[name] for name in KIND_TOKENS.values())
        columns[STEP_COUNT] = counts
        return Table.from_columns("steps (distinct shapes)", columns, STEPS_IN_MEMORY)


def _row_bytes(rows: np.ndarray) -> np.ndarray:
    """``[n]`` each row of ``rows`` (``[n, k], int64``) as one opaque value of its bytes:
    ``np.unique`` sorts those 15x faster than rows field by field."""
    rows = np.ascontiguousarray(rows)
    return rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel()


def _packed_rows(rows: np.ndarray) -> np.ndarray:
    """``[n]`` keys of the rows of ``rows`` (``[n, k], int64``), equal where the rows are
    equal: each column's bits (as many as its largest value needs; 64 for a column with
    a negative value) packed into as few uint64 words as hold them -- one word for step
    shapes, which sorts another 10x faster than the rows' bytes."""
    if len(rows) == 0:
        return np.zeros(0, np.uint64)
    words, shift = [np.zeros(len(rows), np.uint64)], 0
    for low, high, column in zip(rows.min(axis=0), rows.max(axis=0), rows.T, strict=True):
        width = 64 if low < 0 else int(high).bit_length()
        if width == 0:
            continue
        if shift + width > 64:
            words.append(np.zeros(len(rows), np.uint64))
            shift = 0
        words[-1] |= column.astype(np.uint64) << np.uint64(shift)
        shift += width
    if len(words) == 1:
        return words[0]
    return _row_bytes(np.stack(words, axis=1))


def read_step_shapes(folder: str | Path) -> SimResult:
    """A results folder's summary and its steps' distinct shapes (:class:`StepShapes`),
    read a chunk at a time: what ``stepplan buckets`` needs of a run of any length."""
    folder = Path(folder)
    summary = read_summary(folder)
    shapes = StepShapes()
    for chunk in iter_steps(folder, SHAPE_COLUMNS):
        shapes.add(chunk)
    return SimResult(shapes.table(), empty_table(REQUESTS), np.zeros(0), summary, path=folder)


def empty_table(schema: TableSchema) -> Table:
    """``schema``'s table without rows."""
    return Table.from_columns(schema.file, {c.name: np.zeros(0) for c in schema.columns}, schema)
