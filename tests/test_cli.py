"""The ``stepplan`` command line: simulate, compare, settings and errors."""

from __future__ import annotations

import json

import pytest

from stepplan.sim import cli


def summary(folder):
    return json.loads((folder / "summary.json").read_text())


def test_simulate_embedded_trace(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["simulate", "--limit", "80", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "azure_llm_2023_code" in printed and "TTFT p50 ms" in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "measured.json",
        "measured_steps.csv",
        "requests.csv",
        "stepplan-manifest.json",
        "steps.csv",
        "summary.json",
    ]
    document = summary(out)
    assert document["requests"] == 80 and document["trace"]["format"] == "azure"


def test_default_run_keeps_the_first_thousand_requests(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["simulate", "--quiet", "--out", str(out), "--end-s", "60"]) == 0
    document = summary(out)
    assert document["trace"]["path"].endswith("azure_llm_2023_code.csv")
    assert 0 < document["requests"] < 1000  # the window applies before the default limit


def test_default_out_folder_is_results_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["simulate", "--limit", "10", "--quiet", "--name", "tiny"]) == 0
    assert (tmp_path / "results" / "tiny" / "summary.json").exists()


def test_settings_precedence(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        'name = "from-file"\n[scheduler]\nmax_num_seqs = 8\nnum_spec_tokens = 2\n'
        '[planner]\ngraph_mode = "mixed"\n'
    )
    out = tmp_path / "run"
    argv = ["simulate", "--limit", "30", "--out", str(out), "--quiet", "--config", str(config)]
    argv += ["--set", "scheduler.max_num_seqs=4", "--num-spec-tokens", "1"]
    argv += ["--acceptance", "eagle3", "--graph-sizes", "1,2,4,8,16"]
    assert cli.main(argv) == 0
    settings = summary(out)["config"]
    assert settings["name"] == "from-file"
    assert settings["scheduler"]["max_num_seqs"] == 4  # --set over the file
    assert settings["scheduler"]["num_spec_tokens"] == 1  # flag over the file
    assert settings["planner"]["graph_mode"] == "mixed"
    assert settings["planner"]["graph_sizes"] == [1, 2, 4, 8, 16]
    assert settings["acceptance"]["probs"] == [0.74]


def test_synthetic_trace_argument(tmp_path):
    out = tmp_path / "syn"
    spec = "synthetic:n=40,rate=10,prompt=fixed:64,output=fixed:8"
    assert cli.main(["simulate", spec, "--out", str(out), "--quiet"]) == 0
    document = summary(out)
    assert document["trace"]["format"] == "synthetic" and document["requests"] == 40


def test_compare_side_by_side(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--limit", "60", "--out", str(out), "--b-host-cost", "seed"]
    argv += ["--a-label", "stepplan", "--b-label", "seed"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[1]  # below the line naming what ran
    assert "stepplan" in header and "seed" in header
    a, b = summary(out / "a"), summary(out / "b")
    assert a["config"]["cost"]["host_cost"] == "model"
    assert b["config"]["cost"]["host_cost"] == "seed"
    assert b["time_s"]["host"] > a["time_s"]["host"]


def test_compare_two_bucket_sets(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", "--limit", "40", "--out", str(out), "--quiet"]
    argv += ["--a-graph-sizes", "1,2,4,8", "--b-graph-sizes", "1,2,4,8,16,32,64,128"]
    argv += ["--b-graph-mode", "mixed"]
    assert cli.main(argv) == 0
    a, b = summary(out / "a")["config"]["planner"], summary(out / "b")["config"]["planner"]
    assert a["graph_sizes"] == [1, 2, 4, 8] and b["graph_sizes"][-1] == 128
    assert a["graph_mode"] == "full" and b["graph_mode"] == "mixed"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["simulate", "--set", "scheduler.speed=3"], "scheduler.speed: unknown setting"),
        (["simulate", "--set", "nonsense"], "expected section.key=value"),
        (["simulate", "--max-num-seqs", "0"], "max_num_seqs: must be positive"),
        (["simulate", "missing.csv"], "missing.csv: cannot open"),
        (["simulate", "synthetic:prompt=bad:1"], "unknown length kind"),
        (["simulate", "--num-spec-tokens", "9"], "scheduler.num_spec_tokens: must be in 0..7"),
        (["simulate", "--graph-sizes", "0,4"], "planner.graph_sizes: must be positive"),
    ],
)
def test_user_errors_exit_2_with_one_line(argv, message, capsys):
    assert cli.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepplan: error:") and message in err and "\n" not in err


def test_malformed_trace_line_is_reported(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,five,5\n")
    assert cli.main(["simulate", str(trace), "--quiet", "--out", str(tmp_path / "o")]) == 2
    assert "t.csv:3: num_prefill_tokens" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_subcommands_are_registered_one_per_function():
    parser = cli.build_parser()
    needs = {"simulate": [], "compare": [], "buckets": ["DIR"], "report": ["DIR"], "config": []}
    needs |= {"profile": ["--out", "p.json"], "fidelity": [], "sweep": ["s.toml"], "capacity": []}
    needs |= {"scheduler-diff": []}
    needs |= {"results": ["list"]}
    assert len(cli.SUBCOMMANDS) == len(needs)
    for name, rest in needs.items():  # each registered function set its own handler
        assert callable(parser.parse_args([name, *rest]).handler), name
    args = parser.parse_args(["compare", "--b-host-cost", "seed"])
    assert args.handler is cli.run_compare
    with pytest.raises(SystemExit):
        parser.parse_args([])
