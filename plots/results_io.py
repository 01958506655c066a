"""Read a simulation results folder (``steps.csv``, ``requests.csv``, ``summary.json``,
and the measured files ``measured_steps.csv`` and ``measured.json`` when present).

The folder is the contract between the simulator and everything that draws or
analyses its output, so this module reads files and never imports the simulator.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import attrs
import numpy as np

#: Columns whose type the schema fixes (``stepplan.sim.results``, which plots may
#: not import); any other column is read as numbers when every value parses as
#: one, and as text otherwise. Listed, not inferred: a bad cell in a schema column
#: must be an error naming its line, and an all-empty column (no TPOT, or every
#: step eager in ``graph_kind``) does not say its type. ``tests/test_plots.py``
#: checks these lists against what the simulator writes.
INT_COLUMNS = frozenset(
    {
        "step",
        "num_spec_rows",
        "num_decode_rows",
        "num_prefill_rows",
        "num_spec_tokens",
        "num_decode_tokens",
        "num_prefill_tokens",
        "num_rows",
        "num_tokens",
        "graph_tokens",
        "graph_rows",
        "graph_hit",
        "padded_tokens",
        "padded_rows",
        "request_id",
        "prompt_tokens",
        "output_tokens",
        "num_steps",
        "accepted_tokens",
        "drafted_tokens",
        "num_waiting",
        "num_preempted",
        "kv_used_blocks",
        "kv_cached_blocks",
        "num_preemptions",
        "recomputed_tokens",
        "cached_tokens",
    }
)
FLOAT_COLUMNS = frozenset(
    {
        "start_s",
        "duration_s",
        "plan_us",
        "model_s",
        "conv_s",
        "host_s",
        "launch_s",
        "engine_s",
        "arrival_s",
        "first_token_s",
        "finish_s",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "kv_usage",
    }
)
TEXT_COLUMNS = frozenset({"graph_kind"})
#: The summary's section that holds ``measured.json`` (as the simulator keeps it in memory).
MEASURED = "measured"


#: Files of a results folder (tables as ``.csv``, or ``.parquet``).
RESULT_FILES = ("summary.json", "steps.csv", "requests.csv", "steps.parquet", "requests.parquet")
#: What a results folder holds, as error messages say it.
EXPECTED_FILES = "expected summary.json, steps.csv and requests.csv, as `stepplan simulate` writes"


class ResultsError(ValueError):
    """A results folder or table that cannot be used, naming the file, column and row."""


@attrs.frozen(eq=False)
class Table:
    """One CSV table as read-only numpy columns of equal length.

    Attributes:
        name: where it came from (a file name), used in every error message.
        columns: column name -> ``[num_rows]`` array (int64, float64 or str).
    """

    name: str
    columns: Mapping[str, np.ndarray]

    @classmethod
    def from_columns(cls, name: str, columns: Mapping[str, object]) -> Table:
        """Build a table from in-memory columns; mismatched lengths are an error."""
        frozen = {}
        for key, values in columns.items():
            array = np.array(values, copy=True)
            if array.ndim != 1:
                raise ResultsError(f"{name}: column {key!r} must be 1-D, got shape {array.shape}")
            array.flags.writeable = False
            frozen[key] = array
        lengths = {key: len(array) for key, array in frozen.items()}
        if len(set(lengths.values())) > 1:
            raise ResultsError(f"{name}: columns have different lengths {lengths}")
        return cls(name, MappingProxyType(frozen))

    @property
    def num_rows(self) -> int:
        """Rows of the table (0 for a table without columns)."""
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def column(self, key: str) -> np.ndarray:
        """The column ``key``; a missing column is an error naming the table."""
        if key not in self.columns:
            raise ResultsError(f"{self.name}: missing column {key!r} (has {sorted(self.columns)})")
        return self.columns[key]

    def require_rows(self, what: str) -> None:
        """Refuse an empty table with an error saying what needed rows."""
        if self.num_rows == 0:
            raise ResultsError(f"{self.name}: has no rows; {what} needs at least one")


@attrs.frozen(eq=False)
class Results:
    """One simulation's output.

    Attributes:
        path: the folder it was read from (``None`` when built in memory).
        steps: one row per simulated step (see the simulator's ``steps.csv``), with
            ``plan_us`` from ``measured_steps.csv`` when the folder has it.
        requests: one row per request.
        summary: the parsed ``summary.json``, with ``measured.json`` under ``"measured"``.
        name: the run's name in legends and titles (``None``: see :attr:`label`).
    """

    path: Path | None
    steps: Table
    requests: Table
    summary: Mapping[str, object]
    name: str | None = attrs.field(default=None, kw_only=True)

    @property
    def label(self) -> str:
        """A short name for legends: :attr:`name`, else the folder name, else ``run``."""
        if self.name is not None:
            return self.name
        return self.path.name if self.path is not None else "run"

    @property
    def config(self) -> Mapping[str, object]:
        """The run's configuration from the summary (empty when absent)."""
        config = self.summary.get("config", {})
        return config if isinstance(config, Mapping) else {}


def results_from_columns(
    steps: Mapping[str, object],
    requests: Mapping[str, object],
    summary: Mapping[str, object],
    path: str | Path | None = None,
) -> Results:
    """Results held in memory (a simulation just run), as :func:`load_results` gives them."""
    folder = Path(path) if path is not None else None
    return Results(
        folder,
        Table.from_columns("steps.csv", steps),
        Table.from_columns("requests.csv", requests),
        MappingProxyType(dict(summary)),
    )


def load_results(folder: str | Path) -> Results:
    """Read ``steps.csv``, ``requests.csv`` and ``summary.json`` from ``folder``
    (``.parquet`` tables instead of CSV when the folder has them and pyarrow is installed),
    and the measured ``plan_us`` column and figures when it has them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: not a results folder (no such directory)")
    if not any((folder / name).exists() for name in RESULT_FILES):
        raise ResultsError(f"{folder}: not a results folder ({EXPECTED_FILES})")
    summary_path = folder / "summary.json"
    try:
        summary = json.loads(_read_text(summary_path))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{summary_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(summary, dict):
        raise ResultsError(f"{summary_path}: must hold a JSON object")
    measured = folder / "measured.json"
    if measured.exists():
        summary[MEASURED] = _read_json(measured)
    steps = _with_measured(_read_any(folder, "steps"), folder)
    requests = _read_any(folder, "requests")
    return Results(folder, steps, requests, MappingProxyType(summary))


def _read_json(path: Path) -> object:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def _with_measured(steps: Table, folder: Path) -> Table:
    """``steps`` with the columns of ``measured_steps`` (matched on ``step``) when present."""
    if not any((folder / f"measured_steps{ext}").exists() for ext in (".csv", ".parquet")):
        return steps
    measured = _read_any(folder, "measured_steps")
    if not np.array_equal(measured.column("step"), steps.column("step")):
        raise ResultsError(f"{measured.name}: its steps differ from {steps.name}'s")
    columns = dict(steps.columns)
    columns.update((k, v) for k, v in measured.columns.items() if k != "step")
    return Table.from_columns(steps.name, columns)


def _read_any(folder: Path, name: str) -> Table:
    parquet = folder / f"{name}.parquet"
    if (folder / f"{name}.csv").exists() or not parquet.exists():
        return read_table(folder / f"{name}.csv")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ResultsError(f"{parquet}: reading Parquet needs pyarrow (not installed)") from None
    table = pq.read_table(parquet)
    columns = {key: table.column(key).to_numpy(zero_copy_only=False) for key in table.column_names}
    return Table.from_columns(parquet.name, columns)


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None


def read_table(path: Path) -> Table:
    """Read one CSV file with a header line into a :class:`Table`."""
    rows = list(csv.reader(_read_text(path).splitlines()))
    if not rows:
        raise ResultsError(f"{path}: empty file, expected a header line")
    header, body = rows[0], rows[1:]
    for index, row in enumerate(body):
        if len(row) != len(header):
            raise ResultsError(
                f"{path}:{index + 2}: {len(row)} fields, the header has {len(header)}"
            )
    columns = {}
    for position, key in enumerate(header):
        texts = [row[position] for row in body]
        columns[key] = _parse_column(path, key, texts)
    return Table.from_columns(path.name, columns)


def _parse_column(path: Path, key: str, texts: list[str]) -> np.ndarray:
    if key in TEXT_COLUMNS:
        return np.array(texts, dtype=str)
    kind = np.int64 if key in INT_COLUMNS else np.float64
    try:
        return np.array(texts, dtype=str).astype(kind) if texts else np.zeros(0, kind)
    except ValueError:
        pass
    # The fast conversion failed: find the line, or keep an unknown column as text.
    unknown = kind is np.float64 and key not in FLOAT_COLUMNS
    if unknown and not all(_is_number(text) for text in texts):
        return np.array(texts, dtype=str)
    return np.array([_parse_cell(path, key, i, t, kind) for i, t in enumerate(texts)], kind)


def _is_number(text: str) -> bool:
    return text == "" or _parse_float(text) is not None


def _parse_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _parse_cell(path: Path, key: str, index: int, text: str, kind: type) -> float | int:
    line = index + 2  # the header is line 1
    if kind is np.float64:
        if text == "":
            return math.nan  # e.g. no TPOT for a one-token output
        value = _parse_float(text)
        if value is None:
            raise ResultsError(f"{path}:{line}: column {key!r} has {text!r}, expected a number")
        return value
    try:
        return int(text)
    except ValueError:
        raise ResultsError(
            f"{path}:{line}: column {key!r} has {text!r}, expected an integer"
        ) from None
