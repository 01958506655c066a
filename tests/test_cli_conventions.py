"""The command line's conventions: --version, defaults in --help, `stepplan config` and its
TOML round trip, the provenance in summary.json, compare's saved table, and reports of
compare folders and of folders that are not results."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shlex
import shutil
import subprocess
from importlib import metadata, resources
from pathlib import Path

import attrs
import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepplan.planner import GRAPH_MODES
from stepplan.sim import cli
from stepplan.sim.admission import POLICY_NAMES
from stepplan.sim.cli.helptext import DefaultsHelpFormatter
from stepplan.sim.cli.provenance import git_state
from stepplan.sim.cli.tables import METRIC_PATHS
from stepplan.sim.results.sim_result import read_results
from stepplan.sim.results.summary import summary_rows
from stepplan.sim.settings.config import (
    ACCEPTANCE_MODELS,
    HOST_COSTS,
    LIVE_ATTENTION,
    LIVE_BACKENDS,
    LIVE_DEVICES,
    LIVE_DTYPES,
    LIVE_TIMES,
    SECTIONS,
    ConfigError,
    SimConfig,
    flatten,
    load_config,
    with_settings,
)
from stepplan.sim.settings.config_toml import config_toml
from stepplan.sim.settings.links import KV_LINK_NAMES

EMBEDDED = Path(str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv")))
SYNTHETIC = "synthetic:n=30,rate=10,prompt=fixed:64,output=fixed:8"


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def read_back(text: str) -> SimConfig:
    """What ``--config`` makes of a TOML text (``load_config``'s steps, without a file)."""
    return with_settings(SimConfig(), flatten(tomllib.loads(text)))


def squeeze(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ version and --help


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"stepplan {metadata.version('stepplan')}\n"


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_every_option_of_every_subcommand_shows_its_default(name):
    parser = subparsers()[name]
    formatter = DefaultsHelpFormatter(prog=name)
    for action in parser._actions:
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue  # positionals say their own defaults; -h has none
        assert action.help, f"{name} {action.option_strings[0]}: no help text"
        help_text = formatter._get_help_string(action)
        assert "default" in help_text.lower(), f"{name} {action.option_strings[0]}: {help_text}"
        shown = "".join(parser.format_help().split())  # as printed, wrapping undone
        assert "".join((help_text % vars(action)).split()) in shown


def test_help_shows_the_settings_defaults_and_the_graph_size_units(capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    text = squeeze(capsys.readouterr().out)
    assert "most requests running at once (default: 256)" in text
    assert "(default: 8192)" in text and "(default: 0.87)" in text
    assert "(default: per-position)" in text and "(default: full)" in text
    assert "s*Q tokens" in text and "counts tokens, as vLLM's capture sizes do" in text
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = squeeze(capsys.readouterr().out)
    assert "column title of run B (default: B and the settings it differs in" in text
    with pytest.raises(SystemExit):
        cli.main(["buckets", "--help"])
    text = squeeze(capsys.readouterr().out)  # its overrides default to the run's settings
    assert "row limit (default: the run's)" in text and "(default: 256)" not in text


# ------------------------------------------------------------------ `stepplan config`


def test_config_command_prints_what_config_reads_back(tmp_path, capsys):
    file = tmp_path / "base.toml"
    file.write_text('name = "base"\n[scheduler]\nmax_num_seqs = 8\nnum_spec_tokens = 2\n')
    argv = ["config", "--config", str(file), "--set", "scheduler.max_num_seqs=16"]
    argv += ["--num-spec-tokens", "1", "--graph-sizes", "1,2,4", "--acceptance", "eagle3"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("# stepplan ")
    printed = tmp_path / "printed.toml"
    printed.write_text(text)
    config = load_config(printed)
    assert config.name == "base" and config.scheduler.max_num_seqs == 16  # --set over file
    assert config.scheduler.num_spec_tokens == 1 and config.planner.graph_sizes == (1, 2, 4)
    assert config.acceptance.probs == (0.74,)
    assert "# slot_capacity: not set" in text  # None: left out, read back as None
    assert config.scheduler.slot_capacity is None
    # the printed file, read back, prints the same text again
    assert cli.main(["config", "--config", str(printed)]) == 0
    assert capsys.readouterr().out == text


def test_config_toml_refuses_none_where_the_default_is_not_none():
    with pytest.raises(ConfigError, match="name: None cannot be written"):
        config_toml(attrs.evolve(SimConfig(), name=None))


#: Settings drawn for the round trip: the choices of every text setting that has them,
#: and a range each numeric validator accepts.
_CHOICES = {
    "planner.graph_mode": GRAPH_MODES,
    "cost.host_cost": HOST_COSTS,
    "acceptance.model": ACCEPTANCE_MODELS,
    "live.device": LIVE_DEVICES,
    "live.time": LIVE_TIMES,
    "scheduler.policy": POLICY_NAMES,
}
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_INTS = st.integers(1, 2**40)
_FLOATS = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)
_SPECIAL = {
    "planner.graph_sizes": st.none() | st.lists(st.integers(1, 4096), min_size=1, max_size=6),
    "acceptance.probs": st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    "workload.start_s": st.none() | st.floats(allow_nan=False),
    "workload.end_s": st.none() | st.floats(allow_nan=False),
    "live.enabled": st.booleans(),
    "live.seed": st.integers(-(2**40), 2**40),
}
_OPTIONAL_KINDS = {
    "scheduler.slot_capacity": _INTS,
    "scheduler.policy_age_limit_s": _FLOATS,
    "cost.kernel_profile": _TEXT,
    "acceptance.trace": _TEXT,
    "workload.limit": _INTS,
    "workload.rate": _FLOATS,
    "cost.profile": _TEXT,
    "live.backend": st.sampled_from(LIVE_BACKENDS),
    "live.dtype": st.sampled_from(LIVE_DTYPES),
    "live.attention": st.sampled_from(LIVE_ATTENTION),
    "live.max_len": _INTS,
    "gpu.memory_gb": _FLOATS,
    "gpu.memory_bw_bytes_s": _FLOATS,
    "gpu.peak_flops": _FLOATS,
    "gpu.link_bw_bytes_s": _FLOATS,
    "gpu.link_latency_us": _FLOATS,
    "gpu.price_per_hour": _FLOATS,
    "memory.kv_cache_gib": _FLOATS,
    **{f"model.{name}": _FLOATS for name in ("params", "kv_bytes_per_token")},
    **{
        f"model.{name}": _INTS
        for name in ("layers", "hidden_size", "conv_layers", "dtype_bytes", "conv_channels")
    },
    **{f"model.{name}": _INTS for name in ("conv_kernel_size", "conv_dilation", "max_model_len")},
    **{f"model.{name}": _INTS for name in ("num_heads", "num_kv_heads")},
}
_SPECIAL["gpu.name"] = st.sampled_from(["H100", "H200", "B200", "A100", "L40S"])
_SPECIAL["model.name"] = st.sampled_from(["hybrid-8b", "hybrid-1b", "tiny"])
_SPECIAL["memory.gpu_memory_utilization"] = st.floats(0.05, 1.0)
_SPECIAL["parallel.tensor"] = st.integers(1, 8)
_SPECIAL["disaggregation.prefill_replicas"] = st.integers(0, 4)
_SPECIAL["disaggregation.prefill_gpu"] = st.none() | _SPECIAL["gpu.name"]
_SPECIAL["disaggregation.prefill_tensor"] = st.none() | st.integers(1, 8)
_SPECIAL["disaggregation.link"] = st.sampled_from(KV_LINK_NAMES)


def _strategy(key: str, default: object) -> st.SearchStrategy:
    if key in _SPECIAL:
        return _SPECIAL[key]
    if key in _CHOICES:
        return st.sampled_from(_CHOICES[key])
    if key in _OPTIONAL_KINDS:
        return st.none() | _OPTIONAL_KINDS[key]
    kinds = {str: _TEXT, int: _INTS, float: _FLOATS, bool: st.booleans()}
    return kinds[type(default)]


_KEYS = {
    f"{name}.{field.name}": _strategy(f"{name}.{field.name}", field.default)
    for name, section in SECTIONS.items()
    for field in attrs.fields(section)
}
_KEYS |= {"name": _TEXT, "seed": st.integers(-(2**40), 2**40)}


@st.composite
def configs(draw: st.DrawFn) -> SimConfig:
    keys = draw(st.lists(st.sampled_from(sorted(_KEYS)), unique=True, max_size=20))
    chosen = {key: draw(_KEYS[key]) for key in keys}
    try:
        return with_settings(SimConfig(), chosen)
    except ConfigError:  # e.g. conv_layers > layers, replay without a trace
        return draw(st.nothing())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(configs())
def test_config_toml_round_trips(config):
    assert read_back(config_toml(config)) == config


def test_every_setting_is_drawn_by_the_round_trip():
    assert {f"{n}.{f.name}" for n, s in SECTIONS.items() for f in attrs.fields(s)} <= set(_KEYS)


# ------------------------------------------------------------------ provenance


def test_provenance_of_a_trace_file(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    shutil.copyfile(EMBEDDED, trace)
    out = tmp_path / "run"
    argv = ["simulate", str(trace), "--limit", "20", "--out", str(out), "--name", "it's"]
    assert cli.main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == (
        f"model hybrid-8b, GPU H200, Q = 4, graph mode full, trace {trace} (20 requests)"
    )
    document = summary(out)
    record = document["provenance"]
    assert record["argv"] == ["stepplan", *argv]
    assert shlex.split(record["command"]) == record["argv"]
    assert "cwd" not in record  # equal commands give equal files wherever they run
    assert record["stepplan_version"] == metadata.version("stepplan")
    data = trace.read_bytes()
    assert record["trace"] == {
        "source": "file",
        "path": str(trace.resolve()),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert json.loads(json.dumps(read_back(record["config_toml"]).to_dict())) == document["config"]


def test_provenance_of_the_embedded_and_synthetic_traces(tmp_path, capsys):
    assert cli.main(["simulate", "--limit", "10", "--out", str(tmp_path / "e")]) == 0
    assert "trace azure_llm_2023_code.csv (embedded, 10 requests)" in capsys.readouterr().out
    trace = summary(tmp_path / "e")["provenance"]["trace"]
    assert trace["source"] == "embedded" and Path(trace["path"]) == EMBEDDED.resolve()
    assert trace["sha256"] == hashlib.sha256(EMBEDDED.read_bytes()).hexdigest()
    assert cli.main(["simulate", SYNTHETIC, "--quiet", "--out", str(tmp_path / "s")]) == 0
    trace = summary(tmp_path / "s")["provenance"]["trace"]
    assert trace == {"source": "synthetic", "spec": SYNTHETIC}


def _git(*arguments: str) -> str | None:
    folder = Path(cli.__file__).parent
    try:
        done = subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True)
    except OSError:
        return None
    return done.stdout.decode().strip() if done.returncode == 0 else None


def test_git_state_is_the_checkout_of_the_package_files(tmp_path, monkeypatch):
    state = git_state()
    package = Path(cli.__file__).resolve().parents[1] / "__init__.py"
    if _git("ls-files", "--error-unmatch", str(package)) is None:
        assert state is None  # an installed copy or no git: left out, never an error
    else:
        assert state is not None and state["commit"] == _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        assert state["dirty"] is dirty
    loose = tmp_path / "loose.py"
    loose.write_text("")
    assert git_state(loose) is None  # not in any checkout
    monkeypatch.setenv("PATH", str(tmp_path))  # no git program at all
    assert git_state() is None


# ------------------------------------------------------------------ compare and report


@pytest.fixture(scope="module")
def compare_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp") / "cmp"
    argv = ["compare", SYNTHETIC, "--out", str(out), "--quiet", "--b-host-cost", "seed"]
    argv += ["--a-label", "stepplan", "--b-label", "seed builder"]
    assert cli.main(argv) == 0
    return out


def test_compare_saves_its_table_with_differences(compare_folder):
    a, b = summary(compare_folder / "a"), summary(compare_folder / "b")
    with (compare_folder / "compare.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == [
        "metric",
        "stepplan",
        "seed builder",
        "seed builder - stepplan",
        "(seed builder - stepplan) / stepplan",
    ]
    by_metric = {row[0]: row[1:] for row in rows[1:]}
    host_a, host_b = a["time_s"]["host"], b["time_s"]["host"]
    assert [float(v) for v in by_metric["time host s"]] == pytest.approx(
        [host_a, host_b, host_b - host_a, (host_b - host_a) / host_a]
    )
    assert by_metric["live"] == ["off", "off", "", ""]
    document = json.loads((compare_folder / "compare.json").read_text())
    assert document["a"] == {"label": "stepplan", "folder": "a"}
    assert document["b"] == {"label": "seed builder", "folder": "b"}
    steps = next(row for row in document["rows"] if row["metric"] == "steps")
    count_a, count_b = a["steps"]["count"], b["steps"]["count"]
    assert steps["diff"] == count_b - count_a and steps["a"] == count_a


def test_compare_prints_the_header_and_the_table(tmp_path, capsys):
    argv = ["compare", SYNTHETIC, "--out", str(tmp_path / "c"), "--b-graph-mode", "mixed"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "A: model hybrid-8b, GPU H200, Q = 4, graph mode full, " + (
        f"trace {SYNTHETIC} (30 requests)"
    )
    assert lines[1].startswith("B: ") and "graph mode mixed" in lines[1]
    # The columns are titled by what differs between the runs.
    titles = ["A:", "graph_mode=full", "B:", "graph_mode=mixed"]
    assert lines[2].split() == [*titles, "B", "-", "A", "(B", "-", "A)", "/", "A"]
    assert any(re.match(r"steps\s+\d+\s+\d+\s+[+-]\d+\s+[+-]\d+\.\d%$", x) for x in lines)


def test_report_of_a_compare_folder_shows_both_runs(compare_folder, capsys):
    assert cli.main(["report", str(compare_folder)]) == 0
    page = (compare_folder / "report.html").read_text()
    assert "stepplan report: stepplan vs seed builder" in page
    assert "Run A (stepplan) against run B (seed builder)" in page
    assert "<th>seed builder - stepplan</th>" in page and "Provenance" in page


@pytest.mark.parametrize("make", ["empty", "missing"])
def test_report_of_a_folder_that_is_not_results_says_what_it_expects(tmp_path, capsys, make):
    folder = tmp_path / "nothing"
    if make == "empty":
        folder.mkdir()
    assert cli.main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stepplan: error: {folder}: ") and "\n" not in err
    assert "results folder (summary.json, steps.csv and requests.csv" in err
    assert "compare folder (a/ and b/" in err
    assert not (folder / "report.html").exists()


def test_metric_paths_hold_the_numbers_the_summary_table_prints(compare_folder):
    document = read_results(compare_folder / "a").summary  # measured.json joined in
    for label, text in summary_rows(document):
        if label not in METRIC_PATHS:
            assert not re.fullmatch(r"[-+\d.,]+", text) or text == "-", label
            continue
        value = document
        for key in METRIC_PATHS[label]:
            value = value[key]
        digits = len(text.partition(".")[2])
        assert f"{value:,.{digits}f}" == text, label
