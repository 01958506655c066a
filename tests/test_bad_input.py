"""Every bad input is one line on stderr, exit code 2, no traceback, nothing written.

One table: each case is the files it makes, the command line, and a fragment the
error line must hold. Files are made in a fresh folder that is also the working
directory, so "nothing written" means the folder holds exactly those files after the
run, each with the checksum it had before (no results folder, no partial file, no
figure, and no file of the user's replaced: the data-loss rows put decoys where a
command would write).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import os

import numpy as np
import pytest
from synthetic_results import write_synthetic_results

from stepplan.plots.report import GENERATOR
from stepplan.sim import cli
from stepplan.sim.cli.outputs import SIZES_HEADER

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,48,10\n"
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,6,4\n"
MOONCAKE = '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
PROFILE_GEOMETRY = '"geometry": {"channels": 8, "kernel_size": 4, "dilation": 3, "dtype_bytes": 2}'
#: Decoys: the user's own files where a command would write, and files stepplan wrote.
THESIS = "My thesis, chapter 1. Do not lose this; no backup exists.\n"
USER_PAGE = "<!DOCTYPE html>\n<html><head><title>my page</title></head><body>mine</body></html>\n"
USER_TOML = "[scheduler]\nmax_num_seqs = 8  # my own settings\n"
USER_PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)
USER_JSON = '{"format": "my-summary", "runs": 3}\n'
OUR_PAGE = f"<!DOCTYPE html>\n<html><head>{GENERATOR}</head><body></body></html>\n"
OUR_TOML = f"{SIZES_HEADER}\n[planner]\ngraph_sizes = [1, 2]\n"
OUR_PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x11tEXtSoftware\x00stepplan" + bytes(16)


class Link(str):
    """A symbolic link to this target (in a case's files)."""


class Fifo(str):
    """A named pipe (in a case's files)."""


#: (case id, files to make, command line, fragment of the error line)
CASES: list[tuple[str, dict[str, str | bytes], list[str], str]] = [
    # --- trace bytes and text
    ("gzip-truncated", {"t.csv.gz": gzip.compress(AZURE.encode())[:18]}, ["t.csv.gz"],
     "t.csv.gz: cannot read it as gzip"),
    ("bzip2-corrupt", {"t.csv": bz2.compress(AZURE.encode())[:30] + b"junk"}, ["t.csv"],
     "t.csv: cannot read it as bzip2"),
    ("latin-1", {"t.csv": AZURE.encode() + b"2023-11-16 18:17:04.0,\xe9,3\n"}, ["t.csv"],
     "t.csv:3: not UTF-8 text (byte 0xe9 at column 23)"),
    ("gzip-latin-1", {"t.gz": gzip.compress(VIDUR.encode() + b"\xff,1,1\n")}, ["t.gz"],
     "t.gz:4: not UTF-8 text (byte 0xff"),
    ("nul-bytes", {"t.bin": b"abc\x00def\n"}, ["t.bin"], "t.bin:1: a NUL byte: a binary file"),
    ("png", {"t.png": b"\x89PNG\r\n\x1a\n" + bytes(40)}, ["t.png"], "t.png:1: not UTF-8 text"),
    ("zip", {"t.zip": b"PK\x03\x04" + bytes(40)}, ["t.zip"], "t.zip: is a zip archive"),
    ("zstd", {"t.zst": b"\x28\xb5\x2f\xfd" + bytes(40)}, ["t.zst"], "t.zst: is zstd-compressed"),
    ("parquet", {"t.parquet": b"PAR1" + bytes(40)}, ["t.parquet"], "is a Parquet file"),
    ("git-lfs-pointer",
     {"t.csv": "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 12345\n"},
     ["t.csv"], "t.csv: is a Git LFS pointer, not the trace: run git lfs pull"),
    ("json-array", {"t.json": f"[{MOONCAKE.strip()}]\n"}, ["t.json"], "t.json:1: a JSON array"),
    ("html-page", {"t.csv": "<!DOCTYPE html>\n<html></html>\n"}, ["t.csv"], "an HTML or XML page"),
    ("empty", {"t.csv": "\n\n"}, ["t.csv"], "t.csv: the trace is empty"),
    ("header-only", {"t.csv": VIDUR.splitlines()[0] + "\n"}, ["t.csv"], "has no requests"),
    ("only-zero-rows", {"t.csv": VIDUR.splitlines()[0] + "\n0,0,5\n1,4,0\n"}, ["t.csv"],
     "t.csv: all 2 rows have zero prompt or output tokens"),
    ("missing-file", {}, ["missing.csv"], "missing.csv: cannot open"),
    ("directory", {"d/x": ""}, ["d"], "d: cannot open"),
    # --- trace structure and values
    ("unknown-header", {"t.csv": "a,b,c\n1,2,3\n"}, ["t.csv"], "t.csv:1: unknown trace header"),
    ("unknown-json-keys", {"t.jsonl": '{"when": 1, "size": 3}\n'}, ["t.jsonl"],
     "t.jsonl:1: unknown JSON trace keys ['when', 'size']"),
    ("short-row", {"t.csv": VIDUR + "2,5\n"}, ["t.csv"], "t.csv:4: expected 3 columns"),
    ("long-row", {"t.csv": VIDUR + "2,5,5,9\n"}, ["t.csv"], "t.csv:4: expected 3 columns"),
    ("unclosed-quote", {"t.csv": VIDUR + '2,"5,5\n'}, ["t.csv"], "t.csv:4: expected 3 columns"),
    ("text-count", {"t.csv": VIDUR + "2,five,5\n"}, ["t.csv"],
     "t.csv:4: num_prefill_tokens: 'five' is not a non-negative integer"),
    ("negative-count", {"t.csv": VIDUR + "2,-5,5\n"}, ["t.csv"],
     "t.csv:4: num_prefill_tokens: '-5' is not a non-negative integer"),
    ("fractional-count", {"t.csv": VIDUR + "2,5.5,5\n"}, ["t.csv"], "'5.5' is not a non-negative"),
    ("nan-time", {"t.csv": VIDUR + "nan,5,5\n"}, ["t.csv"], "t.csv:4: arrived_at: 'nan' is not"),
    ("bad-wall-clock", {"t.csv": AZURE + "yesterday,4,8\n"}, ["t.csv"],
     "t.csv:3: TIMESTAMP: 'yesterday' is not a date and time"),
    ("bad-json-line", {"t.jsonl": MOONCAKE + '{"timestamp": 3,\n'}, ["t.jsonl"],
     "t.jsonl:2: not valid JSON"),
    ("json-not-object", {"t.jsonl": MOONCAKE + "[1, 2]\n"}, ["t.jsonl"],
     "t.jsonl:2: each line must be a JSON object"),
    ("json-missing-key", {"t.jsonl": MOONCAKE + '{"timestamp": 3, "input_length": 5}\n'},
     ["t.jsonl"], "t.jsonl:2: missing key 'output_length'"),
    ("json-bool-count",
     {"t.jsonl": '{"timestamp": 0, "input_length": true, "output_length": 2}\n'}, ["t.jsonl"],
     "t.jsonl:1: input_length: True is not a non-negative integer"),
    ("hash-ids-not-list",
     {"t.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": 7}\n'},
     ["t.jsonl"], "t.jsonl:1: hash_ids: 7 must be a list of integers"),
    ("format-mismatch", {"t.csv": AZURE}, ["t.csv", "--format", "vidur"],
     "t.csv:1: vidur trace needs columns"),
    # --- numbers beyond what a trace can mean (int64 and beyond)
    ("count-beyond-int64", {"t.csv": VIDUR + "2,99999999999999999999,5\n"}, ["t.csv"],
     "t.csv:4: num_prefill_tokens: '99999999999999999999' is too large (at most"),
    ("count-1e30-csv", {"t.csv": AZURE + "2023-11-16 18:17:04.0,4,1e30\n"}, ["t.csv"],
     "t.csv:3: GeneratedTokens: '1e30' is too large"),
    ("count-beyond-int64-jsonl",
     {"t.jsonl": MOONCAKE + '{"timestamp": 1, "input_length": 99999999999999999999, '
      '"output_length": 2}\n'}, ["t.jsonl"], "t.jsonl:2: input_length: 99999999999999999999 is"),
    ("count-1e30-jsonl",
     {"t.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 1e30}\n'}, ["t.jsonl"],
     "t.jsonl:1: output_length: 1e+30 is too large"),
    ("block-id-beyond-int64",
     {"t.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 2, '
      '"hash_ids": [1, 18446744073709551616]}\n'}, ["t.jsonl"], "t.jsonl:1: hash_ids:"),
    ("time-beyond-int64", {"t.jsonl": MOONCAKE + '{"timestamp": 99999999999999999999999999, '
                           '"input_length": 5, "output_length": 2}\n'}, ["t.jsonl"],
     "t.jsonl:2: timestamp: 99999999999999999999999999 is too far from any date"),
    ("synthetic-count-beyond-int64", {}, ["synthetic:n=99999999999999999999"],
     "n: must be 1 to 100,000,000 requests"),
    ("synthetic-length-1e30", {}, ["synthetic:n=5,prompt=fixed:1e30"],
     "prompt: 'fixed:1e30' gives lengths above"),
    ("synthetic-zipf-table", {}, ["synthetic:n=5,output=zipf:1.1:1e12"],
     "output: 'zipf:1.1:1e12' gives lengths above 10,000,000"),
    ("synthetic-nan-rate", {}, ["synthetic:n=5,rate=nan"], "rate and cv2 must be positive"),
    # --- spans of arrivals no workload has (a run may span at most 30 days)
    ("arrival-1e30", {"t.csv": VIDUR + "1e30,5,5\n"}, ["t.csv"],
     "t.csv:4: arrives 3.17e+22 years after most of the trace"),
    ("azure-row-of-1970", {"t.csv": AZURE + "2023-11-16 18:17:05.0,4,8\n1970-01-01 00:00:01,4,8\n"
                           "2023-11-16 18:17:06.0,4,8\n"}, ["t.csv"],
     "t.csv:4: arrives 53.9 years before most of the trace"),
    ("mooncake-seconds-as-ms", {"t.jsonl": MOONCAKE + '{"timestamp": 1e13, "input_length": 5, '
                                '"output_length": 2}\n'}, ["t.jsonl"],
     "t.jsonl:2: arrives 317 years after most of the trace"),
    ("rate-scale-1e-300", {"t.csv": VIDUR}, ["t.csv", "--rate-scale", "1e-300"],
     "t.csv:3: workload.rate_scale = 1e-300 stretches 1 s of arrivals to"),
    ("rate-scale-tiny-by-set", {}, ["--set", "workload.rate_scale=1e-9"],
     "workload.rate_scale = 1e-09 stretches 522 s of arrivals to 1.65e+04 years"),
    ("poisson-rate-tiny", {"t.csv": "input_tokens,output_tokens\n5,5\n6,2\n"},
     ["t.csv", "--rate", "1e-12"], "t.csv:3: arrives"),
    ("synthetic-rate-tiny", {}, ["synthetic:n=10,rate=1e-300"],
     "request 9 arrives 1.7e+293 years after most of the trace"),
    # --- what part of the trace runs
    ("window-empty", {"t.csv": VIDUR}, ["t.csv", "--start-s", "50"],
     "t.csv: no requests arrive in the window [50.0, inf) s: they arrive from 0 to 1 s"),
    ("window-inverted", {"t.csv": VIDUR}, ["t.csv", "--start-s", "5", "--end-s", "1"],
     "workload.start_s: 5.0 is not before workload.end_s = 1.0"),
    ("all-too-long", {"t.csv": VIDUR}, ["t.csv", "--max-model-len", "8"],
     "t.csv: all 2 requests exceed model.max_model_len = 8 tokens"),
    ("max-model-len-zero", {}, ["--set", "model.max_model_len=0"],
     "--set: model.max_model_len: must be positive, got 0"),
    # --- bounds that keep a run finite
    ("graph-sizes-above-budget", {}, ["--graph-sizes", "1,2,1000000000"],
     "planner.graph_sizes: 1000000000 exceeds scheduler.max_num_batched_tokens = 8192"),
    ("graph-sizes-above-set-budget", {},
     ["--graph-sizes", "1,2,64", "--set", "scheduler.max_num_batched_tokens=32",
      "--max-num-seqs", "16"],
     "planner.graph_sizes: 64 exceeds scheduler.max_num_batched_tokens = 32"),
    ("max-num-seqs-above-budget", {}, ["--max-num-seqs", "1000000000"],
     "scheduler.max_num_seqs: 1000000000 exceeds scheduler.max_num_batched_tokens = 8192"),
    ("budget-below-q", {}, ["--max-num-batched-tokens", "2", "--max-num-seqs", "1"],
     "scheduler.max_num_batched_tokens = 2 is less than Q = scheduler.num_spec_tokens + 1 = 4"),
    ("budget-below-an-aligned-block",
     {"t.jsonl": '{"timestamp": 0, "input_length": 900, "output_length": 2, '
      '"hash_ids": [1, 2]}\n'},
     ["t.jsonl", "--max-num-batched-tokens", "40", "--max-num-seqs", "1"],
     "scheduler.max_num_batched_tokens = 40 is less than the 48-token blocks"),
    ("acceptance-length-above-q", {}, ["--acceptance", "fixed", "--acceptance-length", "9"],
     "acceptance.length: 9.0 exceeds Q = scheduler.num_spec_tokens + 1 = 4"),
    ("acceptance-length-below-one", {}, ["--acceptance-length", "0.5"],
     "acceptance.length: must be >= 1 (accepted drafts + 1), got 0.5"),
    # --- settings: numbers are checked as the flags check them
    ("toml-float-for-int", {"c.toml": "[scheduler]\nmax_num_seqs = 64.5\n"},
     ["--config", "c.toml"], "c.toml: scheduler.max_num_seqs: must be an integer, got 64.5"),
    ("toml-bool-for-int", {"c.toml": "[scheduler]\nmax_num_seqs = true\n"},
     ["--config", "c.toml"], "c.toml: scheduler.max_num_seqs: must be an integer, got True"),
    ("toml-float-graph-size", {"c.toml": "[planner]\ngraph_sizes = [1, 2.5]\n"},
     ["--config", "c.toml"], "c.toml: planner.graph_sizes: entries must be integers, got 2.5"),
    ("toml-text-for-float", {"c.toml": '[workload]\nrate_scale = "fast"\n'},
     ["--config", "c.toml"], "c.toml: workload.rate_scale: must be a finite number, got 'fast'"),
    ("toml-number-for-text", {"c.toml": "name = 5\n"}, ["--config", "c.toml"],
     "c.toml: name: must be text, got 5"),
    ("toml-unknown-key", {"c.toml": "[scheduler]\nmax_num_seq = 4\n"}, ["--config", "c.toml"],
     "c.toml: scheduler.max_num_seq: unknown setting"),
    ("toml-syntax", {"c.toml": "[scheduler\n"}, ["--config", "c.toml"], "c.toml: Expected ']'"),
    ("toml-not-utf8", {"c.toml": b"# \xff\n"}, ["--config", "c.toml"],
     "c.toml:1: not UTF-8 text (byte 0xff)"),
    ("toml-gzip", {"c.toml": gzip.compress(b"[scheduler]\n")}, ["--config", "c.toml"],
     "c.toml: is gzip-compressed"),
    ("set-float-for-int", {}, ["--set", "scheduler.max_num_seqs=64.5"],
     "--set: scheduler.max_num_seqs: must be an integer, got 64.5"),
    ("set-bool-for-int", {}, ["--set", "scheduler.num_spec_tokens=true"],
     "--set: scheduler.num_spec_tokens: must be an integer, got True"),
    ("set-word-for-float", {}, ["--set", "slo.ttft_ms=soon"],
     "--set: slo.ttft_ms: must be a finite number, got 'soon'"),
    ("set-bad-prob", {}, ["--set", "acceptance.probs=[0.9, true]"],
     "--set: acceptance.probs: entries must be finite numbers, got True"),
    ("set-empty-sizes", {}, ["--set", "planner.graph_sizes=[]"],
     "--set: planner.graph_sizes: must be a non-empty list"),
    ("flag-graph-size-word", {}, ["--graph-sizes", "1,x"],
     "planner.graph_sizes: entries must be integers, got 'x'"),
    ("flag-nan", {}, ["--rate-scale", "nan"], "workload.rate_scale: must be a finite number"),
    ("flag-negative-seed", {}, ["--seed", "-1"], "seed: must be >= 0, got -1"),
    # --- a run's name is one folder name under results/, never a path
    ("name-escapes", {}, ["--name", "../../escape"],
     "name: '../../escape' is not a plain name"),
    ("name-absolute", {}, ["--name", "/abs/path"], "name: '/abs/path' is not a plain name"),
    ("name-dot-dot", {}, ["--name", ".."], "name: '..' is not a plain name"),
    ("name-in-toml", {"c.toml": 'name = "a/b"\n'}, ["--config", "c.toml"],
     "c.toml: name: 'a/b' is not a plain name"),
    # --- a command line argparse refuses: one line, with where --help is
    ("flag-limit-fraction", {}, ["--limit", "1.5"],
     "argument --limit: invalid int value: '1.5' (`stepplan simulate --help` lists"),
    ("flag-unknown", {}, ["--limt", "5"],
     "unrecognized arguments: --limt (`stepplan simulate --help`"),
    ("flag-bad-choice", {}, ["--graph-mode", "some"], "argument --graph-mode: invalid choice"),
    ("flag-missing-value", {}, ["--seed"], "argument --seed: expected one argument"),
    ("buckets-no-folder", {}, ["buckets"], "the following arguments are required: results"),
    ("report-bad-int", {}, ["report", "run", "--max-graphs", "x"],
     "argument --max-graphs: invalid int value: 'x' (`stepplan report --help`"),
    # --- files the settings name
    ("profile-not-utf8", {"p.json": b"{\n\xff}"}, ["--kernel-profile", "p.json"],
     "p.json:2: not UTF-8 text"),
    ("profile-gzip", {"p.json.gz": gzip.compress(b"{}")}, ["--kernel-profile", "p.json.gz"],
     "p.json.gz: is gzip-compressed"),
    ("profile-git-lfs-pointer", {"p.json": "version https://git-lfs.github.com/spec/v1\n"},
     ["--kernel-profile", "p.json"], "p.json: is a Git LFS pointer, not the file: run git lfs"),
    ("profile-not-object", {"p.json": "[1, 2]"}, ["--kernel-profile", "p.json"],
     "p.json: must be a JSON object with 'geometry' and an 'entries' list"),
    ("profile-geometry", {"p.json": '{"geometry": {"channels": 8}, "entries": []}'},
     ["--kernel-profile", "p.json"], "p.json: geometry: needs positive integers"),
    ("profile-entry", {"p.json": f'{{{PROFILE_GEOMETRY}, "entries": [{{"kind": "decode"}}]}}'},
     ["--kernel-profile", "p.json"], "p.json: entries[0]: bad entry"),
    ("acceptance-trace-not-utf8", {"a.jsonl": b'{"accepted": [1]}\n\xfe\n'},
     ["--acceptance", "replay", "--acceptance-trace", "a.jsonl"], "a.jsonl:2: not UTF-8 text"),
    ("acceptance-trace-bad-line", {"a.jsonl": '{"accepted": [1]}\n{"accepted": [1.5]}\n'},
     ["--acceptance", "replay", "--acceptance-trace", "a.jsonl"], "a.jsonl:2: expected"),
    # --- compare refuses either side before running the other
    ("compare-bad-b-side", {"t.csv": VIDUR},
     ["compare", "t.csv", "--b-graph-sizes", "1,2,1000000000"],
     "planner.graph_sizes: 1000000000 exceeds"),
    ("compare-bad-b-config", {"t.csv": VIDUR, "b.toml": "[scheduler]\nnum_groups = 1.5\n"},
     ["compare", "t.csv", "--b-config", "b.toml"], "b.toml: scheduler.num_groups: must be an"),
    # --- buckets checks its output files before computing
    ("buckets-write-json", {}, ["buckets", "run", "--write", "sizes.json"],
     "sizes.json: --write takes a .toml file (what --config reads)"),
    ("buckets-figure-suffix", {}, ["buckets", "run", "--figure", "f.jpg"],
     "--figure: f.jpg: figure files must end in .png, .svg, .pdf"),
    ("buckets-not-results", {"x/y": ""}, ["buckets", "x", "--write", "s.toml"],
     "x: not a results folder (expected summary.json"),
    # --- data loss: a file of the user's where a command would write stays as it is
    ("report-out-user-text", {"user/thesis.txt": THESIS},
     ["report", "run", "--out", "user/thesis.txt"],
     "user/thesis.txt: exists and is not an HTML report stepplan wrote"),
    ("report-out-user-text-overwrite", {"user/thesis.txt": THESIS},
     ["report", "run", "--out", "user/thesis.txt", "--overwrite"],
     "user/thesis.txt: exists and is not an HTML report stepplan wrote"),
    ("report-out-user-page", {"user/mypage.html": USER_PAGE},
     ["report", "run", "--out", "user/mypage.html", "--overwrite"],
     "user/mypage.html: exists and is not an HTML report"),
    ("report-users-page-in-run", {"run/report.html": USER_PAGE}, ["report", "run"],
     "run/report.html: exists and is not an HTML report"),
    ("report-users-page-in-run-overwrite", {"run/report.html": USER_PAGE},
     ["report", "run", "--overwrite"], "run/report.html: exists and is not an HTML report"),
    ("report-earlier-needs-overwrite", {"r.html": OUR_PAGE}, ["report", "run", "--out", "r.html"],
     "r.html: exists (an HTML report stepplan wrote earlier); --overwrite replaces it"),
    ("report-over-a-results-file", {}, ["report", "run", "--out", "run/steps.csv", "--overwrite"],
     "run/steps.csv: exists and is not an HTML report"),
    ("report-out-folder", {"d/x": ""}, ["report", "run", "--out", "d"],
     "d: is a folder; an HTML report is one file"),
    ("report-out-link", {"mine.txt": THESIS, "r.html": Link("mine.txt")},
     ["report", "run", "--out", "r.html", "--overwrite"], "r.html: is a symbolic link"),
    ("report-out-fifo", {"r.html": Fifo()}, ["report", "run", "--out", "r.html", "--overwrite"],
     "r.html: is not a regular file"),
    ("report-out-through-a-file", {"f": THESIS}, ["report", "run", "--out", "f/r.html"],
     "f/r.html: f is a file, not a folder"),
    ("simulate-report-user-page", {"user/mypage.html": USER_PAGE},
     ["--report", "user/mypage.html", "--overwrite"], "user/mypage.html: exists and is not"),
    ("simulate-report-in-out", {"out/report.html": USER_PAGE}, ["--report"],
     "out: holds files stepplan did not write"),
    ("buckets-write-user-toml", {"user/my.toml": USER_TOML},
     ["buckets", "run", "--write", "user/my.toml", "--overwrite"],
     "user/my.toml: exists and is not a graph-size file stepplan wrote"),
    ("buckets-write-earlier", {"s.toml": OUR_TOML}, ["buckets", "run", "--write", "s.toml"],
     "s.toml: exists (a graph-size file stepplan wrote earlier); --overwrite replaces it"),
    ("buckets-figure-user-png", {"user/fig.png": USER_PNG},
     ["buckets", "run", "--figure", "user/fig.png", "--overwrite"],
     "user/fig.png: exists and is not a figure stepplan wrote"),
    ("buckets-figure-earlier", {"f.png": OUR_PNG}, ["buckets", "run", "--figure", "f.png"],
     "f.png: exists (a figure stepplan wrote earlier); --overwrite replaces it"),
    ("buckets-figure-checked-first", {"s.toml": USER_TOML, "f.png": USER_PNG},
     ["buckets", "run", "--write", "new.toml", "--figure", "f.png", "--overwrite"],
     "f.png: exists and is not a figure"),
    ("profile-out-user-json", {"user/summary.json": USER_JSON},
     ["profile", "--out", "user/summary.json", "--overwrite"],
     "user/summary.json: exists and is not an engine profile stepplan wrote"),
]  # fmt: skip


@pytest.mark.parametrize(("files", "argv", "fragment"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path, monkeypatch, capsys, files, argv, fragment
):
    monkeypatch.chdir(tmp_path)
    if argv[0] in ("buckets", "report"):
        write_synthetic_results(tmp_path / "run")
    make_files(tmp_path, files)
    before = checksums(tmp_path)
    command = argv if argv[0] in RUN_ELSEWHERE else ["simulate", *argv]
    if command[0] in ("simulate", "compare"):
        command = [*command, "--quiet", "--out", "out"]
    assert cli.main(command) == 2  # any other exception fails the test with its traceback
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("stepplan: error: ") and fragment in lines[0], lines[0]
    assert captured.out == ""
    assert checksums(tmp_path) == before, "the run wrote, removed or changed something"
    assert not os.path.exists(tmp_path / "results")


#: Subcommands a case names itself (the others are ``simulate`` options).
RUN_ELSEWHERE = ("compare", "buckets", "report", "profile")


def make_files(folder, files):
    """The case's files: text, bytes, :class:`Link` or :class:`Fifo`."""
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(content)
        elif isinstance(content, Fifo):
            os.mkfifo(path)
        else:
            path.write_bytes(content.encode() if isinstance(content, str) else content)


def checksums(folder):
    """Every path under ``folder`` with what it is: a link's target, a FIFO, a folder, or
    a file's sha256."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            found[name] = f"link to {os.readlink(path)}"
        elif path.is_fifo():
            found[name] = "fifo"
        elif path.is_dir():
            found[name] = "folder"
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


# ----------------------------------------------------------------------------- notes


def run_notes(tmp_path, capsys, text: str, *flags: str) -> tuple[list[str], dict]:
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    out = tmp_path / "out"  # reused by the next call of a test: --overwrite
    argv = ["simulate", str(trace), "--quiet", "--out", str(out), "--overwrite", *flags]
    assert cli.main(argv) == 0
    notes = capsys.readouterr().err.splitlines()
    assert all(line.startswith("stepplan: note: ") for line in notes)
    return notes, json.loads((out / "summary.json").read_text())


def test_trace_notes_dropped_rejected_and_no_arrival_times(tmp_path, capsys):
    text = "input_tokens,output_tokens\n5,5\n0,3\n7,0\n100,100\n6,2\n"
    notes, summary = run_notes(tmp_path, capsys, text, "--max-model-len", "150")
    assert summary["requests"] == 2 and summary["trace"]["skipped"] == 2
    assert summary["trace"]["rejected_max_model_len"] == 1
    assert summary["config"]["model"]["max_model_len"] == 150
    assert any("dropped 2 rows with zero prompt or output tokens" in n for n in notes)
    assert any("rejected 1 request(s) longer than model.max_model_len = 150" in n for n in notes)
    assert any("no arrival times: all requests arrive at t = 0 (--rate R" in n for n in notes)
    notes, _ = run_notes(tmp_path, capsys, text, "--rate", "4")
    assert any("no arrival times: Poisson arrivals at 4 req/s (seed 0)" in n for n in notes)


def test_trace_notes_out_of_order_and_ignored_rate(tmp_path, capsys):
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n2,5,5\n1,5,5\n"
    notes, summary = run_notes(tmp_path, capsys, text, "--rate", "3")
    assert summary["requests"] == 3 and summary["trace"]["rejected_max_model_len"] == 0
    assert any("t.csv:4: arrives before the row above it; requests sorted" in n for n in notes)
    assert any("has arrival times, so --rate is ignored" in n for n in notes)
    notes, _ = run_notes(
        tmp_path, capsys, "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n"
    )
    assert notes == []


def test_gzipped_trace_and_utf8_bom_are_read(tmp_path, capsys):
    text = "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.97,48,10\r\n\r\n"
    trace = tmp_path / "azure.csv"  # gzip inside, whatever the suffix says
    trace.write_bytes(gzip.compress(text.encode()))
    out = tmp_path / "out"
    assert cli.main(["simulate", str(trace), "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"]["format"] == "azure" and summary["requests"] == 1


def test_integer_settings_accept_integers_and_integer_text():
    from stepplan.sim.settings.config import SchedulerConfig, SimConfig, with_settings

    config = with_settings(SimConfig(), {"scheduler.max_num_seqs": "64", "planner.graph_sizes": 8})
    assert config.scheduler.max_num_seqs == 64 and config.planner.graph_sizes == (8,)
    assert SchedulerConfig(max_num_seqs=np.int64(4)).max_num_seqs == 4
    assert with_settings(SimConfig(), {"workload.rate_scale": 2}).workload.rate_scale == 2.0


@pytest.mark.parametrize(
    "engines",
    [[], ["--set", "deployment.replicas=2"], ["--set", "disaggregation.prefill_replicas=1"]],
    ids=["one-engine", "replicas", "disaggregated"],
)
def test_a_run_that_cannot_admit_is_one_line_exit_2(tmp_path, monkeypatch, capsys, engines):
    # no setting that passes check_config stalls a run (they are refused before it starts),
    # so a scheduler that admits nothing stands in for one the settings left too small
    from stepplan.sim.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "schedule_rows", lambda self, now_s: None)
    monkeypatch.chdir(tmp_path)
    make_files(tmp_path, {"t.csv": VIDUR})
    before = checksums(tmp_path)
    assert cli.main(["simulate", "t.csv", *engines, "--quiet", "--out", "out"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("stepplan: error: run stalled"), lines[0]
    assert (
        "request 0 (prompt 5 + output 5 tokens) cannot be admitted while nothing runs: the "
        "scheduler admits nothing (scheduler.max_num_batched_tokens = 8,192" in lines[0]
    )
    assert checksums(tmp_path) == before
