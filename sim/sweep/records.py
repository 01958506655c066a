"""A sweep's points on disk: the key that identifies a point, the record a finished point
leaves (``points/<digest>.json``), and the tables made from the records.

A point is keyed by the digest of its trace (the file's sha256, or a synthetic spec),
the trace format, its effective settings and stepplan's version: a re-run into the same
folder finds the records of the points it has already run and skips them. The tables
are always made from the records, those read back as those just written, so a resumed
sweep's table is the table of one uninterrupted run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..results.outdir import config_digest
from ..results.schema import (
    FLOAT,
    INT,
    SWEEP,
    SWEEP_MEASURED,
    SWEEP_PATHS,
    TEXT,
    Column,
    TableSchema,
)
from ..results.table import ResultsError, Table, write_csv
from ..results.writer import parquet_available, write_parquet
from ..settings.config import SimConfig
from ..settings.config_toml import toml_value

#: Sub-folders of a sweep folder: the points' records, and ``--keep-runs``' results folders.
RECORDS, RUNS = "points", "runs"
_DIGEST_CHARS = 16
_SETTING = "a swept setting, as the point ran it"


def _version() -> str:
    try:
        return metadata.version("stepplan")
    except metadata.PackageNotFoundError:
        return "unknown"


def point_digest(trace: Mapping[str, Any], fmt: str | None, config: SimConfig) -> str:
    """The point's key: ``trace`` is the trace's identity (its path is left out, so a
    moved file keeps its points), ``fmt`` the format asked for."""
    identity = {key: value for key, value in trace.items() if key != "path"}
    key = {"trace": identity, "format": fmt, "config": config.to_dict(), "stepplan": _version()}
    return config_digest(key, _DIGEST_CHARS)


@attrs.frozen
class PointRecord:
    """A finished point, as ``points/<digest>.json`` holds it.

    Attributes:
        digest: its key. trace: the trace's name in the sweep.
        settings: every swept setting's value (dotted key -> JSON value).
        summary: the run's ``summary.json`` document, ``measured`` section included.
    """

    digest: str
    trace: str
    settings: Mapping[str, Any]
    summary: Mapping[str, Any]

    def to_json(self) -> bytes:
        document = {
            "digest": self.digest,
            "trace": self.trace,
            "settings": dict(self.settings),
            "summary": dict(self.summary),
        }
        return (json.dumps(document, indent=1) + "\n").encode()


def read_records(folder: Path) -> dict[str, PointRecord]:
    """The records under ``folder/points/`` by digest; a record that cannot be read is
    left out (its point runs again and replaces it)."""
    found: dict[str, PointRecord] = {}
    for path in sorted((folder / RECORDS).glob("*.json")):
        try:
            document = json.loads(path.read_text())
            record = PointRecord(
                document["digest"], document["trace"], document["settings"], document["summary"]
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.digest == path.stem:
            found[record.digest] = record
    return found


def setting_value(config: SimConfig, key: str) -> Any:
    """The value of the dotted setting ``key`` in ``config``, as JSON (tuples as lists)."""
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return list(value) if isinstance(value, tuple) else value


def metric(summary: Mapping[str, Any], name: str) -> float | int | None:
    """The metric column ``name``'s value in ``summary`` (``schema.SWEEP_PATHS``)."""
    value: Any = summary
    for key in SWEEP_PATHS[name]:
        value = value.get(key) if isinstance(value, Mapping) else None
    return None if isinstance(value, bool) else value


def _metric_column(column: Column, summaries: Sequence[Mapping[str, Any]]) -> np.ndarray:
    values = [metric(summary, column.name) for summary in summaries]
    if column.dtype == INT:
        if any(value is None for value in values):
            raise ResultsError(f"{column.name}: a point's summary has no value")
        return np.array(values, np.int64)
    return np.array([math.nan if v is None else v for v in values], np.float64)


def _setting_column(key: str, values: list[Any]) -> tuple[Column, np.ndarray]:
    """A swept setting's column: integers, numbers, or else TOML text (``[1, 2, 4]``)."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) == len(values) and all(isinstance(v, int) for v in values):
        return Column(key, INT, "", _SETTING), np.array(values, np.int64)
    if len(numbers) == len(values):
        return Column(key, FLOAT, "", _SETTING), np.array(values, np.float64)
    texts = ["" if v is None else v if isinstance(v, str) else toml_value(v) for v in values]
    return Column(key, TEXT, "", _SETTING), np.array(texts, dtype=str)


def metric_columns(
    summaries: Sequence[Mapping[str, Any]], columns: Sequence[Column]
) -> dict[str, np.ndarray]:
    """``columns``' values over ``summaries``, ``[num_points]`` each."""
    return {column.name: _metric_column(column, summaries) for column in columns}


@attrs.frozen
class TableRow:
    """One row of a sweep's table: the point's number, trace name and swept settings in
    this sweep, and its record (which an earlier sweep of other settings may have left)."""

    point: int
    trace: str
    settings: Mapping[str, Any]
    record: PointRecord


def _lead(rows: Sequence[TableRow]) -> dict[str, np.ndarray]:
    return {
        "point": np.array([row.point for row in rows], dtype=np.int64),
        "trace": np.array([row.trace for row in rows], dtype=str),
        "digest": np.array([row.record.digest for row in rows], dtype=str),
    }


def sweep_table(rows: Sequence[TableRow], keys: Sequence[str]) -> Table:
    """``sweep.csv``: one row per point, its settings ``keys`` between the digest and
    the metrics."""
    settings = [_setting_column(key, [row.settings[key] for row in rows]) for key in keys]
    columns = {**_lead(rows), **{column.name: values for column, values in settings}}
    metrics = SWEEP.columns[3:]
    columns |= metric_columns([row.record.summary for row in rows], metrics)
    return Table.from_columns(SWEEP.file, columns, sweep_schema([c for c, _ in settings]))


def sweep_schema(settings: Sequence[Column]) -> TableSchema:
    """The schema of a sweep's table with these setting columns."""
    return attrs.evolve(SWEEP, columns=SWEEP.columns[:3] + tuple(settings) + SWEEP.columns[3:])


def measured_table(rows: Sequence[TableRow]) -> Table:
    """``sweep_measured.csv``: each point's wall time, speed and planner time."""
    lead = _lead(rows)
    columns = {"point": lead["point"], "digest": lead["digest"]}
    columns |= metric_columns([row.record.summary for row in rows], SWEEP_MEASURED.columns[2:])
    return Table.from_columns(SWEEP_MEASURED.file, columns, SWEEP_MEASURED)


def write_table(stage: Path, table: Table) -> list[str]:
    """``table`` as ``<name>.csv``, and ``<name>.parquet`` when pyarrow is installed;
    the names written."""
    stem = Path(table.name).stem
    write_csv(stage / f"{stem}.csv", table)
    names = [f"{stem}.csv"]
    if parquet_available():
        write_parquet(stage / f"{stem}.parquet", table)
        names.append(f"{stem}.parquet")
    return names
