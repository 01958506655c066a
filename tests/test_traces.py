"""Trace loaders (round trips, detection, error lines) and synthetic workloads."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.traces import FORMATS, RequestTable, TraceError, detect_format, load_trace
from stepplan.sim.traces import write_trace as write
from stepplan.sim.workloads import (
    WorkloadError,
    arrival_times,
    parse_length,
    parse_synthetic,
)

SHARED = Path("/work/shared/traces")
# arrival resolution each format stores (Azure: microseconds; JSON: its unit)
RESOLUTION = {"azure": 1e-6, "mooncake": 1e-3, "llmservingsim": 1e-9, "burstgpt": 0, "vidur": 0}


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


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip(tmp_path_factory, fmt, data):
    table = drawn_table(data, fmt)
    suffix = "jsonl" if fmt in ("mooncake", "llmservingsim") else "csv"
    path = tmp_path_factory.mktemp("trace") / f"t.{suffix}"
    write(table, path, fmt)
    assert detect_format(path) == fmt
    back = load_trace(path)
    assert back.format == fmt and back.skipped == 0
    np.testing.assert_allclose(back.arrival_s, table.arrival_s, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(back.prompt_tokens, table.prompt_tokens)
    np.testing.assert_array_equal(back.output_tokens, table.output_tokens)
    if fmt == "mooncake":
        np.testing.assert_array_equal(back.prefix_offsets, table.prefix_offsets)
        np.testing.assert_array_equal(back.prefix_blocks, table.prefix_blocks)


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
