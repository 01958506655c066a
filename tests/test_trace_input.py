"""Where a trace comes from: standard input (``-``), ``/dev/stdin``, a process
substitution, a named pipe, each read once in one pass, format by content, with the same
results as the file; ``--limit`` stops reading after the rows it keeps."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from stepplan.sim import cli
from stepplan.sim.traces import load_trace
from stepplan.sim.workloads import parse_synthetic

STEPPLAN = f"{sys.executable} -c 'import sys; from stepplan.sim.cli import main; sys.exit(main())'"
ROWS = "".join(f"{t * 0.5},{16 + t % 7},{2 + t % 5}\n" for t in range(40))
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + ROWS
MOONCAKE = "".join(
    json.dumps({"timestamp": t * 300, "input_length": 20 + t, "output_length": 3}) + "\n"
    for t in range(25)
)


def bash(command, cwd, data=None):
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, input=data, capture_output=True, timeout=120
    )


def results(folder):
    return {name: (folder / name).read_bytes() for name in ("steps.csv", "requests.csv")}


@pytest.mark.parametrize("text", [VIDUR, MOONCAKE], ids=["csv", "jsonl"])
@pytest.mark.parametrize("how", ["dash", "dev-stdin", "substitution", "fifo", "gzip-dash"])
def test_a_trace_from_a_pipe_gives_the_files_results(tmp_path, text, how):
    trace = tmp_path / "t.trace"  # no telling suffix: the format is read from the content
    trace.write_text(text)
    run = f"{STEPPLAN} simulate {{}} --quiet --out {{}}"
    assert bash(run.format("t.trace", "file"), tmp_path).returncode == 0
    data, source = trace.read_bytes(), "-"
    if how == "dev-stdin":
        source = "/dev/stdin"
    elif how == "substitution":
        source, data = "<(cat t.trace)", None
    elif how == "gzip-dash":
        data = gzip.compress(data)
    elif how == "fifo":
        os.mkfifo(tmp_path / "pipe")
        writer = threading.Thread(target=(tmp_path / "pipe").write_bytes, args=(data,))
        writer.start()
        source, data = "pipe", None
    done = bash(run.format(source, "piped"), tmp_path, data)
    if how == "fifo":
        writer.join(timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert results(tmp_path / "piped") == results(tmp_path / "file")
    trace_id = json.loads((tmp_path / "piped" / "summary.json").read_text())["provenance"]
    read = data if how == "gzip-dash" else trace.read_bytes()
    assert trace_id["trace"]["sha256"] == hashlib.sha256(read).hexdigest()
    assert trace_id["trace"]["bytes"] == len(read)


def test_compare_reads_standard_input_once(tmp_path):
    command = f"{STEPPLAN} compare - --b-host-cost seed --quiet --out both"
    done = bash(command, tmp_path, VIDUR.encode())
    assert done.returncode == 0, done.stderr.decode()
    for side in ("a", "b"):
        summary = json.loads((tmp_path / "both" / side / "summary.json").read_text())
        assert summary["requests"] == 40 and summary["provenance"]["trace"]["path"] == "<stdin>"


def test_a_pipe_needed_twice_with_other_settings_is_one_line(tmp_path):
    command = f"{STEPPLAN} compare - --a-set workload.limit=5 --quiet --out both"
    done = bash(command, tmp_path, VIDUR.encode())
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and "\n" not in err, err
    assert err.startswith("stepplan: error: <stdin>: is read once (a pipe or standard input)")
    assert not (tmp_path / "both").exists()


def test_limit_stops_reading_but_the_whole_file_is_hashed(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    # rows after the limit are never parsed: a broken one there does not matter
    trace.write_text(VIDUR + "oops,this,is not a row\n" + ROWS)
    out = tmp_path / "r"
    assert cli.main(["simulate", str(trace), "--limit", "40", "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["requests"] == 40
    argv = ["simulate", str(trace), "--limit", "41", "--quiet", "--out", str(tmp_path / "s")]
    assert cli.main(argv) == 2
    assert "t.csv:42: arrived_at: 'oops' is not" in capsys.readouterr().err
    table = load_trace(trace, limit=10)
    assert table.num_requests == 10 and table.read_to_line == 11
    assert table.sha256 == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert table.size_bytes == trace.stat().st_size


def test_limit_counts_requests_and_its_notes_say_what_was_read(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    rows = "0,5,5\n2,0,4\n3,5,5\n1,6,3\n4,5,5\n"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    out = tmp_path / "r"
    assert cli.main(["simulate", str(trace), "--limit", "3", "--quiet", "--out", str(out)]) == 0
    notes = capsys.readouterr().err.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 3 and summary["trace"]["skipped"] == 1  # the zero row
    assert any(":5: arrives before the row above it" in n for n in notes)
    assert all("(of the rows read: --limit stopped reading at line 5)" in n for n in notes)
    assert len(notes) == 2  # the dropped row and the sorting


def test_a_read_limit_equals_a_whole_read_cut_on_sorted_traces(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(MOONCAKE)
    whole, first = load_trace(trace), load_trace(trace, limit=7)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(whole.limit(7), name), getattr(first, name))
    spec = "synthetic:n=500,rate=3,cv2=4,prompt=zipf:1.1:8192,output=uniform:16:512"
    whole, first = parse_synthetic(spec, seed=2), parse_synthetic(spec, seed=2, limit=60)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(whole.limit(60), name), getattr(first, name))
