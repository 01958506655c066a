"""The results schema is what the simulator writes and reads: every column in order with
its type, every summary key; older folders read with their old column names; the docs
are the schema's."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import attrs
import numpy as np
import pytest
from synthetic_results import write_synthetic_results

from stepplan.sim.results.schema import (
    COST_COLUMNS,
    MEASURED,
    MEASURED_STEPS,
    MEASURED_SUMMARY,
    MEMORY_COLUMNS,
    REQUESTS,
    STEPS,
    STEPS_IN_MEMORY,
    SUMMARY,
    markdown,
)
from stepplan.sim.results.sim_result import SimResult, read_results, write_results
from stepplan.sim.results.table import ResultsError, Table
from stepplan.sim.run import simulate
from stepplan.sim.scheduler import StepMemory
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.timing.cost import COST_TERMS
from stepplan.sim.workloads import parse_synthetic

DOCS = Path(__file__).parents[1] / "docs" / "results.md"


@pytest.fixture(scope="module")
def simulation():
    config = with_settings(SimConfig(), {"scheduler.num_spec_tokens": 2})
    return simulate(parse_synthetic("synthetic:n=30,rate=30,output=uniform:1:40"), config)


def header(path: Path) -> list[str]:
    with path.open(newline="") as handle:
        return next(csv.reader(handle))


def test_docs_are_the_schema():
    assert DOCS.read_text() == markdown(), (
        "run: python -m stepplan.sim.results.schema > docs/results.md"
    )


def test_cost_and_memory_columns_come_from_their_records():
    assert [c.name for c in COST_COLUMNS] == [f"{term}_s" for term in COST_TERMS]
    assert [c.name for c in MEMORY_COLUMNS] == [f.name for f in attrs.fields(StepMemory)]
    assert [c.dtype for c in MEMORY_COLUMNS] == ["int64"] * 4 + ["float64"]


def test_the_simulation_has_every_column_in_order_and_type(simulation):
    for table, schema in ((simulation.steps, STEPS_IN_MEMORY), (simulation.requests, REQUESTS)):
        assert tuple(table) == schema.names
        for column in schema.columns:
            values = table[column.name]
            assert not values.flags.writeable, column.name
            assert values.dtype.kind == np.dtype(column.numpy_dtype).kind, column.name


def test_the_files_have_the_schemas_columns(simulation, tmp_path):
    out = write_results(simulation, tmp_path / "run")
    for schema in (STEPS, REQUESTS, MEASURED_STEPS):
        assert tuple(header(out / schema.file)) == schema.names, schema.file


def test_the_summary_has_the_schemas_keys(simulation):
    known = {key.name: key for key in SUMMARY}
    assert set(simulation.summary) - {MEASURED} <= set(known)
    for name, value in simulation.summary.items():
        if name != MEASURED and known[name].keys is not None:
            assert tuple(value) == known[name].keys, name
    measured = {key.name: key for key in MEASURED_SUMMARY}
    for name, value in simulation.summary[MEASURED].items():
        assert tuple(value) == measured[name].keys, name


def rewrite_header(path: Path, old: str, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    names = lines[0].rstrip("\n").split(",")
    lines[0] = ",".join(new if name == old else name for name in names) + "\n"
    path.write_text("".join(lines))


def test_an_older_folders_column_names_are_read_as_the_new(tmp_path):
    folder = write_synthetic_results(tmp_path / "run", num_steps=12, num_requests=5)
    new = read_results(folder).steps["num_spec_decode_tokens"]
    rewrite_header(folder / "steps.csv", "num_spec_decode_tokens", "num_spec_tokens")
    old = read_results(folder)
    assert "num_spec_tokens" not in old.steps
    np.testing.assert_array_equal(old.steps["num_spec_decode_tokens"], new)
    rewrite_header(folder / "steps.csv", "num_decode_tokens", "num_spec_decode_tokens")
    both = r"columns 'num_spec_tokens' \(the older name\) and 'num_spec_decode_tokens' are one"
    with pytest.raises(ResultsError, match=both):
        read_results(folder)
    rewrite_header(folder / "steps.csv", "num_spec_tokens", "num_spec_decode_tokens")
    with pytest.raises(ResultsError, match="column 'num_spec_decode_tokens' appears twice"):
        read_results(folder)


def test_a_column_of_the_wrong_type_is_refused():
    with pytest.raises(ResultsError, match=r"steps\.csv: column 'num_rows' must hold int64"):
        SimResult({"num_rows": [1.5]}, {}, np.zeros(0), {})
    with pytest.raises(ResultsError, match="column 'ttft_s' must hold float64, got <U"):
        Table.from_columns("requests.csv", {"ttft_s": ["soon"]}, REQUESTS)
    table = Table.from_columns("t", {"kv_usage": [1], "other": [0.5]}, STEPS)
    assert table["kv_usage"].dtype == np.float64 and table["other"].dtype == np.float64


def test_an_unknown_column_is_kept(tmp_path):
    folder = write_synthetic_results(tmp_path / "run", num_steps=4, num_requests=3)
    rows = list(csv.reader((folder / "requests.csv").open()))
    rows[0].append("region")
    rows[1:] = [[*row, text] for row, text in zip(rows[1:], ("eu", "us", "eu"), strict=True)]
    with (folder / "requests.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    assert read_results(folder).requests["region"].tolist() == ["eu", "us", "eu"]


def test_parquet_round_trip(simulation, tmp_path):
    pytest.importorskip("pyarrow")
    out = write_results(simulation, tmp_path / "run", parquet=True)
    assert (out / "steps.parquet").exists() and not (out / "steps.csv").exists()
    back = read_results(out)
    for table, original in ((back.steps, simulation.steps), (back.requests, simulation.requests)):
        assert tuple(table) == tuple(original)
        for name, column in original.items():
            assert table[name].dtype.kind == column.dtype.kind, name
            np.testing.assert_array_equal(table[name], column, err_msg=name)
    assert back.summary == json.loads(json.dumps(simulation.summary))
