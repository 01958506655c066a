"""Trace loaders (round trips, detection, error lines) and synthetic workloads."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.traces import FORMATS, RequestTable, TraceError, detect_format, load_trace
from stepplan.sim.traces import write_trace as write
from stepplan.sim.traces.formats import BY_NAME
from stepplan.sim.traces.writing import trace_text
from stepplan.sim.workloads import (
    WorkloadError,
    arrival_times,
    parse_length,
    parse_synthetic,
)

SHARED = Path("/work/shared/traces")
# arrival resolution each format stores (Azure: microseconds; JSON: its unit)
RESOLUTION = {
    "azure": 1e-6,
    "mooncake": 1e-3,
    "llmservingsim": 1e-9,
    "llmservingsim-tsv": 1e-9,
    "burstgpt": 0,
    "vidur": 0,
}


def drawn_table(data, fmt: str) -> RequestTable:
    n = data.draw(st.integers(1, 12))
    step = RESOLUTION.get(fmt) or 1e-6
    ticks = sorted(data.draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n)))
    arrival = np.asarray(ticks, np.float64) * step if fmt != "lengths" else np.zeros(n)
    arrival -= arrival[0]
    lengths = st.lists(st.integers(1, 100_000), min_size=n, max_size=n)
    blocks = None
    offsets = None
    if fmt == "mooncake":
        per = data.draw(
            st.lists(st.lists(st.integers(0, 10**6), max_size=4), min_size=n, max_size=n)
        )
        offsets = np.cumsum([0] + [len(b) for b in per]).astype(np.int64)
        blocks = np.asarray([b for bs in per for b in bs], np.int64)
    return RequestTable(
        arrival_s=arrival,
        prompt_tokens=data.draw(lengths),
        output_tokens=data.draw(lengths),
        prefix_offsets=offsets,
        prefix_blocks=blocks,
    )


def assert_same_requests(back: RequestTable, table: RequestTable, fmt: str) -> None:
    assert back.format == fmt and back.skipped == 0 and back.unsorted_line is None
    np.testing.assert_allclose(back.arrival_s, table.arrival_s, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(back.prompt_tokens, table.prompt_tokens)
    np.testing.assert_array_equal(back.output_tokens, table.output_tokens)
    if fmt == "mooncake":
        np.testing.assert_array_equal(back.prefix_offsets, table.prefix_offsets)
        np.testing.assert_array_equal(back.prefix_blocks, table.prefix_blocks)


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_round_trip(tmp_path_factory, fmt, suffix, data):
    table = drawn_table(data, fmt)
    path = tmp_path_factory.mktemp("trace") / f"t.{BY_NAME[fmt].layout}{suffix}"
    write(table, path, fmt)
    assert detect_format(path) == fmt
    back = load_trace(path)
    assert back.arrivals == ("none" if fmt == "lengths" else "trace")
    assert_same_requests(back, table, fmt)


def mangled(text: str, entry, data) -> bytes:
    """``text`` (a trace ``entry`` wrote) as other tools lay the same trace out: columns
    reordered and renamed in another case, one more column, another delimiter, CRLF
    line endings, a byte-order mark, blank lines at the end, compressed."""
    newline = data.draw(st.sampled_from(["\n", "\r\n"]))
    case = data.draw(st.sampled_from([str, str.upper, str.lower]))
    if entry.layout == "jsonl":
        records = [json.loads(line) for line in text.splitlines()]
        keys = data.draw(st.permutations([*records[0], "note"]))
        lines = [json.dumps({case(k): {**r, "note": "x, y"}[k] for k in keys}) for r in records]
    else:
        rows = list(csv.reader(io.StringIO(text), delimiter="\t" if entry.layout == "tsv" else ","))
        order = data.draw(st.permutations(range(len(rows[0]) + 1)))
        rows = [
            [[*row, "note" if i == 0 else "x, y"][c] for c in order] for i, row in enumerate(rows)
        ]
        rows[0] = [case(name) for name in rows[0]]
        buffer = io.StringIO()
        delimiter = data.draw(st.sampled_from([",", "\t", ";"]))
        csv.writer(buffer, delimiter=delimiter, lineterminator=newline).writerows(rows)
        lines = buffer.getvalue().splitlines()
    raw = ("\ufeff" * data.draw(st.booleans()) + newline.join(lines) + newline).encode()
    raw += newline.encode() * data.draw(st.integers(0, 3))
    compress = data.draw(st.sampled_from([bytes, gzip.compress, bz2.compress, lzma.compress]))
    return bytes(compress(raw))


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_other_layouts_of_the_same_trace_read_the_same(tmp_path_factory, fmt, data):
    table = drawn_table(data, fmt)
    path = tmp_path_factory.mktemp("trace") / "trace.txt"  # the suffix says nothing
    path.write_bytes(mangled(trace_text(table, BY_NAME[fmt]), BY_NAME[fmt], data))
    assert_same_requests(load_trace(path), table, fmt)


BAD_LINES = {
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:17:03.9799600,48,10\n2023-11-16 18:17:04.1,x,8\n", 3, "ContextTokens"),
    "azure-time": ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:17:03.9799600,48,10\nyesterday,4,8\n", 3, "TIMESTAMP"),
    "burstgpt": ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                 "Total tokens,Log Type\n5,,1,ChatGPT,10,20,30,Conversation log\n"
                 "6,,1,ChatGPT,-3,20,17,Conversation log\n", 3, "Request tokens"),
    "vidur": ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,2\n0.7,10\n", 3, "columns"),
    "lengths": ("input_tokens,output_tokens\n5,6\n7,2.5\n", 3, "output_tokens"),
    "mooncake": ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
                 '{"timestamp": 3, "input_length": 5}\n', 2, "output_length"),
    "mooncake-json": ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 3,\n',
                      2, "JSON"),
    "llmservingsim": ('{"arrival_time_ns": 0, "input_toks": 5, "output_toks": 2}\n\n'
                      '{"arrival_time_ns": "soon", "input_toks": 5, "output_toks": 2}\n',
                      3, "arrival_time_ns"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_malformed_line_names_file_and_line(tmp_path, case):
    text, line, field = BAD_LINES[case]
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"bad\.txt:{line}: .*{field}") as info:
        load_trace(path)
    assert info.value.line == line


def test_unknown_header_and_empty_file(tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match=r"odd\.csv:1: unknown trace header"):
        load_trace(path)
    path.write_text("")
    with pytest.raises(TraceError, match="empty"):
        load_trace(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,4,8\n")
    with pytest.raises(TraceError, match=r"odd\.csv:1: vidur trace needs columns"):
        load_trace(path, "vidur")


#: Headers and rows in the shapes public traces ship in: (file text, format, prompts in
#: arrival order, arrival times).
SHAPES = {
    "burstgpt-v1-no-session": (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,API log\n"
        "46,GPT-4,30,8,38,API log\n",
        "burstgpt", [472, 30], [0.0, 41.0],
    ),
    "azure-conversation-extra-column": (
        "TIMESTAMP,ContextTokens,GeneratedTokens,Deployment\r\n"
        "2023-11-16 18:15:46.6805900,374,44,a\r\n2023-11-16 18:15:50.9951690,396,109,b\r\n",
        "azure", [374, 396], [0.0, 4.314579],
    ),
    "azure-across-midnight": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.5,4,4\n"
        "2023-11-17 00:00:00.25,5,5\n",
        "azure", [4, 5], [0.0, 0.75],
    ),
    "azure-2024-utc-offsets": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 02:00:00.5+02:00,4,4\n"
        "2024-05-10T00:00:01.25Z,5,5\n2024-05-09 19:00:02-0500,6,6\n",
        "azure", [4, 5, 6], [0.0, 0.75, 1.5],
    ),
    "azure-numeric-seconds": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n10.5,4,4\n12,5,5\n",
        "azure", [4, 5], [0.0, 1.5],
    ),
    "mooncake-date-strings": (
        '{"timestamp": "2024-01-01T10:00:00", "input_length": 3, "output_length": 1}\n'
        '{"timestamp": "2024-01-01T10:00:02.5", "input_length": 4, "output_length": 1}\n',
        "mooncake", [3, 4], [0.0, 2.5],
    ),
    "llmservingsim-tsv": (
        "input_toks\toutput_toks\tarrival_time_ns\n12\t4\t0\n30\t7\t2500000000\n",
        "llmservingsim-tsv", [12, 30], [0.0, 2.5],
    ),
    "llmservingsim-epoch-ns": (
        '{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 1700000000000000001}\n'
        '{"input_toks": 4, "output_toks": 2, "arrival_time_ns": 1700000000000000251}\n',
        "llmservingsim", [3, 4], [0.0, 250e-9],
    ),
    "vidur-reordered-extra-columns": (
        "num_decode_tokens,pd_ratio,arrived_at,num_prefill_tokens\n"
        "8,2.0,0.25,16\n9,1.0,0.5,9\n",
        "vidur", [16, 9], [0.0, 0.25],
    ),
    "mooncake-without-hash-ids": (
        '{"timestamp": 27, "input_length": 100, "output_length": 1}\n'
        '{"timestamp": 1027, "input_length": 200, "output_length": 2, "hash_ids": [4]}\n',
        "mooncake", [100, 200], [0.0, 1.0],
    ),
    "lengths-as-json-lines": (
        '{"prompt_tokens": 7, "completion_tokens": 3}\n'
        '{"prompt_tokens": 9, "completion_tokens": 1}\n',
        "lengths", [7, 9], [0.0, 0.0],
    ),
    "lengths-semicolons-float-counts": (
        "input_tokens;output_tokens\n5.0;6\n\n7;2\n\n\n", "lengths", [5, 7], [0.0, 0.0],
    ),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_public_trace_shapes(tmp_path, shape):
    text, fmt, prompts, arrivals = SHAPES[shape]
    path = tmp_path / "trace"
    path.write_text(text, newline="")
    table = load_trace(path)
    assert table.format == fmt and table.prompt_tokens.tolist() == prompts
    np.testing.assert_allclose(table.arrival_s, arrivals, rtol=0, atol=1e-9)


def test_out_of_order_rows_are_sorted_and_the_first_is_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n3,1,1\n\n5,2,1\n4,3,1\n1,4,1\n"
    )
    table = load_trace(path)
    assert table.prompt_tokens.tolist() == [4, 1, 3, 2]
    assert table.arrival_s.tolist() == [0, 2, 3, 4]
    assert table.unsorted_line == 5  # "4,3,1" arrives before "5,2,1"; the blank line counts


def test_requests_longer_than_the_model_are_rejected_and_counted():
    table = RequestTable(arrival_s=[0, 1, 2], prompt_tokens=[5, 90, 6], output_tokens=[5, 20, 4])
    fits = table.within_model_len(100)
    assert fits.prompt_tokens.tolist() == [5, 6] and fits.rejected == 1
    assert table.within_model_len(110) is table
    assert fits.within_model_len(10).rejected == 1  # prompt + output = 10 fits


def test_zero_lengths_are_skipped_and_counted(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
        "Log Type\n3,,1,GPT-4,10,0,10,API log\n1,,1,GPT-4,7,5,12,API log\n"
    )
    table = load_trace(path)
    assert table.num_requests == 1 and table.skipped == 1
    assert table.prompt_tokens.tolist() == [7] and table.arrival_s.tolist() == [0.0]


def test_lengths_trace_gets_poisson_arrivals(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "5,6\n" * 2000)
    assert (load_trace(path).arrival_s == 0).all()
    table = load_trace(path, rate=10.0, seed=4)
    assert table.arrival_s[0] == 0
    assert 0.09 < np.diff(table.arrival_s).mean() < 0.11
    np.testing.assert_array_equal(load_trace(path, rate=10.0, seed=4).arrival_s, table.arrival_s)


def test_embedded_trace_is_the_whole_azure_code_trace():
    path = resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv")
    with resources.as_file(path) as real:
        table = load_trace(real)
    assert table.num_requests == 8819 and table.format == "azure"
    assert 3400 < table.span_s < 3450
    assert 500 < table.limit(1000).span_s < 560


@pytest.mark.skipif(not SHARED.exists(), reason="shared traces not on this machine")
def test_shared_traces_load():
    azure = load_trace(SHARED / "azure_llm_2023_code.csv")
    assert azure.num_requests == 8819 and 3400 < azure.span_s < 3450
    mooncake = load_trace(SHARED / "mooncake_synthetic.jsonl")
    assert mooncake.num_requests == 3993 and mooncake.prefix_offsets[-1] > 0


def test_window_limit_and_rate_scale():
    table = RequestTable(arrival_s=[0, 1, 2, 3, 4], prompt_tokens=[1] * 5, output_tokens=[1] * 5)
    window = table.window(1.0, 3.0)
    assert window.arrival_s.tolist() == [0.0, 1.0]
    assert table.limit(2).num_requests == 2 and table.limit(99).num_requests == 5
    assert table.scale_rate(2.0).arrival_s.tolist() == [0, 0.5, 1, 1.5, 2]
    with pytest.raises(ValueError):
        table.scale_rate(0)


def test_take_keeps_prefix_blocks():
    table = RequestTable(
        arrival_s=[0, 1, 2],
        prompt_tokens=[1, 2, 3],
        output_tokens=[1, 1, 1],
        prefix_offsets=np.array([0, 2, 3, 5]),
        prefix_blocks=np.array([7, 8, 9, 10, 11]),
    )
    taken = table.take(np.array([0, 2]))  # request 1's block 9 must go
    assert taken.prefix_offsets.tolist() == [0, 2, 4]
    assert taken.prefix_blocks.tolist() == [7, 8, 10, 11]
    assert taken.prompt_tokens.tolist() == [1, 3]
    last = table.take(np.array([1]))
    assert last.prefix_offsets.tolist() == [0, 1] and last.prefix_blocks.tolist() == [9]


# ----------------------------------------------------------------------------- workloads


@pytest.mark.parametrize("cv2", [0.25, 1.0, 4.0])
def test_arrival_burstiness(cv2):
    times = arrival_times(40_000, 5.0, cv2, np.random.default_rng(0))
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(cv2, rel=0.12)


def test_length_distributions():
    rng = np.random.default_rng(1)
    assert (parse_length("fixed:7", "prompt").sample(5, rng) == 7).all()
    uniform = parse_length("uniform:3:5", "prompt").sample(3000, rng)
    assert set(uniform.tolist()) == {3, 4, 5}
    zipf = parse_length("zipf:1.5:50", "output").sample(20_000, rng)
    assert zipf.min() >= 1 and zipf.max() <= 50
    weights = np.arange(1, 51) ** -1.5
    assert (zipf == 1).mean() == pytest.approx(weights[0] / weights.sum(), abs=0.02)


def test_empirical_length_resamples_a_trace(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("input_tokens,output_tokens\n3,9\n4,11\n")
    dist = parse_length(f"empirical:{path}", "output")
    assert set(dist.sample(200, np.random.default_rng(0)).tolist()) == {9, 11}


def test_synthetic_spec_is_seeded():
    spec = "synthetic:n=300,rate=20,cv2=2,prompt=zipf:1.1:4096,output=fixed:9"
    a, b = parse_synthetic(spec, seed=3), parse_synthetic(spec, seed=3)
    assert a.num_requests == 300 and (a.output_tokens == 9).all()
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_s, parse_synthetic(spec, seed=4).arrival_s)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("synthetic:n=0", "n"),
        ("synthetic:speed=3", "speed"),
        ("synthetic:prompt=normal:3", "prompt"),
        ("synthetic:output=uniform:9:3", "output"),
        ("synthetic:prompt=fixed:a", "prompt"),
        ("synthetic:rate=x", "rate"),
    ],
)
def test_synthetic_spec_errors(spec, match):
    with pytest.raises(WorkloadError, match=match):
        parse_synthetic(spec)
