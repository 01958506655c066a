"""``stepplan profile`` -> ``stepplan fidelity`` end to end at the tiny preset, on the CPU
(the reference backend), and every refusal as one line."""

from __future__ import annotations

import csv
import json
import re

import pytest

from stepplan.sim import cli
from stepplan.sim.cli.fidelity import shape_of_row
from stepplan.sim.timing.engine_profile import read_engine_profile

SETUP = ["--set", "model.name=tiny", "--max-num-seqs", "4", "--max-num-batched-tokens", "64"]
SETUP += ["--num-spec-tokens", "3", "--max-model-len", "512"]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "tiny.json"
    assert cli.main(["profile", "--out", str(path), "--repeats", "1", "--quiet", *SETUP]) == 0
    return path


def one_error(capsys, *fragments):
    err = capsys.readouterr().err
    assert err.startswith("stepplan: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def test_profile_document(profile):
    document = json.loads(profile.read_text())
    assert document["format"] == "stepplan-engine-profile"
    assert document["preset"]["name"] == "tiny"
    assert document["planner"]["num_spec_tokens"] == 3
    graphs = {tuple(p["graph"]) for p in document["points"] if p["graph"]}
    assert {key[2] for key in graphs} == {1, 2, 4}  # every row bucket up to max_num_seqs
    assert all(p["wall_us"] > 0 and p["host_us"] > 0 for p in document["points"])


def test_fidelity_end_to_end(profile, tmp_path, capsys):
    out = tmp_path / "fid"
    argv = ["fidelity", "--limit", "8", "--profile", str(profile), "--out", str(out), *SETUP]
    assert cli.main(argv) == 0
    document = json.loads((out / "fidelity.json").read_text())
    assert document["replay_check"]["identical_batches"] is True
    for kind, row in document["steps"].items():
        assert kind in ("decode", "spec", "prefill", "mixed")
        assert row["n"] > 0 and row["mape"] >= 0
    for metric in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
        assert set(document["end_to_end"][metric]) == {"live", "sim", "error"}
    assert (out / "fidelity.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "live" / "summary.json").is_file() and (out / "sim" / "summary.json").is_file()
    sim = json.loads((out / "sim" / "summary.json").read_text())
    assert sim["cost"]["source"] == "profile"
    assert (
        sim["cost"]["steps_from_profile"] + sim["cost"]["steps_from_roofline"]
        == (sim["steps"]["count"])
    )
    live = json.loads((out / "live" / "summary.json").read_text())
    assert live["cost"]["source"] == "measured" and live["live_run"]["model"] == "tiny"
    # what --acceptance replay reads back
    lines = (out / "acceptance.jsonl").read_text().splitlines()
    assert len(lines) == document["requests"]
    assert "replayed batches identical: True" in capsys.readouterr().out
    rescored(profile, out / "fidelity_steps.csv")


def rescored(profile, steps_csv):
    """Each line of ``fidelity_steps.csv`` holds its step's whole shape: the profile's fit
    predicts from the rebuilt shape what the line records, and the clocks run forward."""
    fit = read_engine_profile(profile).fit
    lines = list(csv.DictReader(steps_csv.read_text().splitlines()))
    assert lines
    for line in lines:
        shape = shape_of_row(line)
        assert shape.num_tokens == int(line["tokens"]) and shape.num_rows == int(line["rows"])
        guess = fit.predict_us(shape)
        assert (guess is None) == (line["predicted_us"] == "")
        if guess is not None:
            assert guess == float(line["predicted_us"])
    starts = [float(line["start_s"]) for line in lines]
    stamps = [float(line["unix_s"]) for line in lines]
    assert starts == sorted(starts) and stamps == sorted(stamps)


def test_fidelity_on_a_trace_with_block_hashes(profile, tmp_path):
    """The live engine keeps no prefix cache, so neither does the simulation scored
    against it: the replay rebuilds the live run's batches though the trace shares blocks."""
    trace = tmp_path / "shared.jsonl"
    rows = [
        {"timestamp": 40 * i, "input_length": 40, "output_length": 6, "hash_ids": [0, 1, i + 2]}
        for i in range(8)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "fid"
    argv = ["fidelity", str(trace), "--profile", str(profile), "--out", str(out), "--quiet"]
    assert cli.main([*argv, *SETUP, "--set", "memory.prefix_block_tokens=16"]) == 0
    document = json.loads((out / "fidelity.json").read_text())
    assert document["replay_check"]["identical_batches"] is True
    sim = json.loads((out / "sim" / "summary.json").read_text())
    assert sim["memory"]["prefix_caching"] is False


def test_simulate_with_a_profile_counts_its_sources(profile, tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", "--limit", "20", "--profile", str(profile), "--quiet", "--out", str(out)]
    assert cli.main([*argv, *SETUP]) == 0
    cost = json.loads((out / "summary.json").read_text())["cost"]
    assert cost["source"] == "profile" and cost["steps_from_profile"] > 0


def test_refusals(profile, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    argv = ["simulate", "--limit", "5", "--out", str(tmp_path / "x"), *SETUP]
    assert cli.main([*argv, "--profile", str(bad)]) == 2
    one_error(capsys, "bad.json: not JSON")
    other = [*argv[:-4], "--set", "model.name=hybrid-1b", "--profile", str(profile)]
    assert cli.main(other) == 2
    one_error(capsys, "measured with preset name = 'tiny'")
    assert cli.main(["fidelity", "--limit", "3", "--out", str(tmp_path / "f"), *SETUP]) == 2
    one_error(capsys, "fidelity: needs --profile FILE")
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    assert cli.main(["profile", "--out", str(notes), "--overwrite", *SETUP]) == 2
    one_error(capsys, "is not an engine profile")
    assert notes.read_text() == '{"mine": 1}'
    assert cli.main(["profile", "--out", str(profile), *SETUP]) == 2
    one_error(capsys, "exists (an engine profile stepplan wrote earlier); --overwrite replaces")
    assert cli.main(["profile", "--out", str(tmp_path / "p.json"), "--repeats", "0", *SETUP]) == 2
    one_error(capsys, "--repeats: must be at least 1")
    assert not (tmp_path / "x").exists() and not (tmp_path / "f").exists()


def test_the_live_engine_has_the_profiled_engines_kv_positions(profile, tmp_path):
    """A profile of the model's whole length: the live engine is built with its KV
    positions (attention's graphs are captured for that many keys), not with the few the
    slice's longest request needs."""
    assert json.loads(profile.read_text())["runner"]["max_len"] == 512  # tiny's whole length
    trace = tmp_path / "short.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:46.{i:06d},{20 + i},{5 + i}\n" for i in range(4)
    ))  # fmt: skip
    out = tmp_path / "fid"
    argv = ["fidelity", str(trace), "--profile", str(profile), "--out", str(out), *SETUP]
    assert cli.main(argv) == 0
    live = json.loads((out / "live" / "summary.json").read_text())
    assert live["live_run"]["max_len"] == 512  # the slice alone needs 256


def test_the_live_run_shows_progress_off_a_terminal_and_nothing_when_quiet(
    profile, tmp_path, capsys
):
    argv = ["fidelity", "--limit", "6", "--profile", str(profile), *SETUP]
    assert cli.main([*argv, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^stepplan: live run: simulating \d+ requests$", err, re.MULTILINE), err
    assert cli.main([*argv, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "live run" not in capsys.readouterr().err  # the trace's notes stay
