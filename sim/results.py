"""A simulation's result (:class:`SimResult`) and its results folder: writing it, and
reading it back for the CLI, the plots and the report.

The folder's files, every column of its tables and every key of its summary are
declared in ``schema.py`` (``docs/results.md`` shows them); ``outdir.py`` says what a
write may touch. The summary itself is made in ``summary.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .outdir import ResultsFolder
from .schema import (
    MEASURED,
    MEASURED_STEPS,
    REQUESTS,
    RESULT_FILES,
    STEPS,
    STEPS_IN_MEMORY,
    TableSchema,
)
from .table import ResultsError, Table, header_names, read_csv, read_text, write_csv

#: What a results folder holds, as error messages say it.
EXPECTED_FILES = "expected summary.json, steps.csv and requests.csv, as `stepplan simulate` writes"
#: Columns of the steps in memory that ``measured_steps.csv`` holds, not ``steps.csv``.
_MEASURED_ONLY = frozenset(MEASURED_STEPS.names) - {"step"}


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


# ----------------------------------------------------------------------------- writing


def write_parquet(path: Path, columns: Mapping[str, np.ndarray]) -> None:
    """Write ``columns`` (``[num_rows]`` each) as a Parquet file (needs pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = {k: v.tolist() if v.dtype.kind in "OU" else v for k, v in columns.items()}
    pq.write_table(pa.table(table), path)


def parquet_available() -> bool:
    """Whether ``pyarrow`` can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def _write_files(stage: Path, result: SimResult, parquet: bool) -> list[str]:
    """Write the result's files into ``stage``; their names."""
    use_parquet = parquet and parquet_available()
    write_table = write_parquet if use_parquet else write_csv
    suffix = ".parquet" if use_parquet else ".csv"
    steps = {k: v for k, v in result.steps.items() if k not in _MEASURED_ONLY}
    measured_steps = {k: result.steps[k] for k in MEASURED_STEPS.names if k in result.steps}
    summary = {k: v for k, v in result.summary.items() if k != MEASURED}
    tables = {"steps": steps, "requests": result.requests, "measured_steps": measured_steps}
    names = []
    for name, columns in tables.items():
        write_table(stage / f"{name}{suffix}", columns)
        names.append(f"{name}{suffix}")
    documents = {"summary.json": summary, "measured.json": result.summary.get(MEASURED, {})}
    for name, document in documents.items():
        (stage / name).write_text(json.dumps(document, indent=2) + "\n")
        names.append(name)
    return names


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
    run, whose listed files alone are replaced (see ``outdir.py``). Files are staged
    and renamed into place; a failed write leaves the folder as it was.
    """
    summary_complete = bool(result.summary.get("complete", True))
    if isinstance(out, ResultsFolder):
        out.put(lambda stage: _write_files(stage, result, parquet), complete=summary_complete)
        return out.path
    with ResultsFolder.claim(out, overwrite=overwrite, names=RESULT_FILES) as folder:
        folder.put(lambda stage: _write_files(stage, result, parquet), complete=summary_complete)
    return folder.path


# ----------------------------------------------------------------------------- reading


def read_results(folder: str | Path) -> SimResult:
    """Read a results folder: ``summary.json``, ``steps`` and ``requests`` (``.parquet``
    instead of ``.csv`` when the folder has them and pyarrow is installed), and the
    measured files when present, as the ``plan_us`` column and the ``"measured"``
    section. Anything unusable is a :class:`ResultsError` naming the file (and line and
    column)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: not a results folder (no such directory)")
    if not any((folder / name).exists() for name in RESULT_FILES):
        raise ResultsError(f"{folder}: not a results folder ({EXPECTED_FILES})")
    summary = _read_json(folder / "summary.json")
    if not isinstance(summary, dict):
        raise ResultsError(f"{folder / 'summary.json'}: must hold a JSON object")
    if (folder / "measured.json").exists():
        summary[MEASURED] = _read_json(folder / "measured.json")
    steps = _with_measured(_read_table(folder, STEPS), folder)
    requests = _read_table(folder, REQUESTS)
    return SimResult(steps, requests, np.zeros(0), summary, path=folder)


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def _with_measured(steps: Table, folder: Path) -> Table:
    """``steps`` with the columns of ``measured_steps`` (matched on ``step``) when present."""
    stem = MEASURED_STEPS.file.removesuffix(".csv")
    if not any((folder / f"{stem}{ext}").exists() for ext in (".csv", ".parquet")):
        return steps
    measured = _read_table(folder, MEASURED_STEPS)
    if not np.array_equal(measured.column("step"), steps.column("step")):
        raise ResultsError(f"{measured.name}: its steps differ from {steps.name}'s")
    columns = dict(steps.columns)
    columns.update((k, v) for k, v in measured.columns.items() if k != "step")
    return Table.from_columns(steps.name, columns, STEPS_IN_MEMORY)


def _read_table(folder: Path, schema: TableSchema) -> Table:
    """The table ``schema.file`` of ``folder``, or its ``.parquet`` when only that exists."""
    path = folder / schema.file
    parquet = path.with_suffix(".parquet")
    if path.exists() or not parquet.exists():
        return read_csv(path, schema)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ResultsError(f"{parquet}: reading Parquet needs pyarrow (not installed)") from None
    table = pq.read_table(parquet)
    names = header_names(parquet, table.column_names, schema)
    columns = {
        name: table.column(key).to_numpy(zero_copy_only=False)
        for key, name in zip(table.column_names, names, strict=True)
    }
    return Table.from_columns(parquet.name, columns, schema)
