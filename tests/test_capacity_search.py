"""``stepplan capacity``: the search on predicates whose threshold is known, and the
command on a trace whose capacity can be worked out by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim import cli
from stepplan.sim.results.schema import CAPACITY
from stepplan.sim.results.table import read_csv
from stepplan.sim.run import prepare_requests, simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.sweep.search import SearchError, between, capacity_search, rounded
from stepplan.sim.traces import load_trace

# ------------------------------------------------------------------ the search


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.floats(0.3, 7.0),
    tol=st.sampled_from([0.001, 0.01, 0.05, 0.3]),
    per_round=st.integers(1, 6),
)
def test_the_search_brackets_the_threshold_within_tol(threshold, tol, per_round):
    asked: list[list[float]] = []

    def evaluate(scales, round_):
        assert round_ == len(asked)
        asked.append(list(scales))
        most = max(2, per_round) if round_ == 0 else per_round
        assert len(scales) == most if round_ == 0 else 0 < len(scales) <= most
        return [scale <= threshold for scale in scales]

    result = capacity_search(evaluate, 0.25, 8.0, tol, per_round)
    assert result.status == "found"
    low, high = result.bracket
    assert result.answer == low <= threshold < high
    assert high / low <= 1 + tol or not between(low, high, per_round)
    # each round shrinks the bracket (per_round + 1)-fold in log scale
    rounds = math.ceil(math.log(math.log(32) / math.log(1 + tol)) / math.log(per_round + 1))
    assert result.rounds <= rounds + 2
    every = [s for scales in asked for s in scales]
    assert len(every) == len(set(every)) == len(result.probes)  # no scale runs twice


def test_the_search_says_when_the_bounds_do_not_bracket():
    below = capacity_search(lambda scales, _: [False] * len(scales), 0.5, 4.0, 0.1)
    assert below.status == "below-lo" and below.answer is None
    above = capacity_search(lambda scales, _: [True] * len(scales), 0.5, 4.0, 0.1)
    assert above.status == "above-hi" and above.answer == 4.0 and above.rounds == 1
    bumpy = capacity_search(
        lambda scales, _: [s < 1 or 1.9 < s < 2.1 for s in scales], 0.5, 4.0, 0.1, 4
    )
    assert bumpy.status == "found" and bumpy.answer < 1 and bumpy.notes
    for lo, hi, tol, message in [(0, 1, 0.1, "--lo"), (2, 1, 0.1, "--lo"), (1, 2, 0, "--tol")]:
        with pytest.raises(SearchError, match=message):
            capacity_search(lambda scales, _: [], lo, hi, tol)


def test_scales_are_rounded_so_equal_searches_probe_equal_scales():
    assert rounded(1 / 3) == 0.333333
    assert between(1.0, 8.0, 2) == [2.0, 4.0]


# ------------------------------------------------------------------ a known capacity

#: Identical requests (256 prompt tokens, 32 output tokens) arriving every second.
N, GAP_S, PROMPT, OUTPUT = 40, 1.0, 256, 32
#: One request at a time, no drafts: each request is served alone, in the same steps.
ALONE = {"scheduler.max_num_seqs": 1, "scheduler.num_spec_tokens": 0}


@pytest.fixture(scope="module")
def regular_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "regular.csv"
    rows = [f"{i * GAP_S},{PROMPT},{OUTPUT}" for i in range(N)]
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    return path


def test_capacity_of_a_queue_served_one_request_at_a_time(regular_trace, tmp_path, capsys):
    """With one request running at a time and every request alike, each takes the same
    service time S (its prefill step, t_p, then its decode steps) and the run is a D/D/1
    queue: at a rate scale s the gap is g = GAP_S / s, and request i waits i * (S - g)
    when g < S, none otherwise. Its TTFT is t_p plus that wait, so the p99 over N
    requests (numpy's linear interpolation over an arithmetic sequence) is t_p + 0.99 *
    (N - 1) * max(0, S - g). An SLO of TTFT p99 <= t_p + 0.99 * (N - 1) * S / 4 then
    holds exactly while g >= 3 S / 4: the capacity is s* = GAP_S / (0.75 S). S and t_p
    are measured on one request alone (the cost model's figures; no formula is
    assumed), and the search must bracket s* within its tolerance."""
    config = with_settings(SimConfig(), ALONE)
    one = simulate(prepare_requests(load_trace(regular_trace).limit(1), config), config)
    service_s, prefill_s = float(one.requests["e2e_s"][0]), float(one.requests["ttft_s"][0])
    limit_ms = (prefill_s + 0.99 * (N - 1) * service_s / 4) * 1e3
    expected = GAP_S / (0.75 * service_s)
    out = tmp_path / "cap"
    argv = ["capacity", str(regular_trace), "--max-num-seqs", "1", "--num-spec-tokens", "0"]
    argv += ["--slo", f"ttft_p99_ms={limit_ms!r},tpot_p99_ms=1000", "--lo", "0.5", "--hi", "50"]
    argv += ["--tol", "0.01", "--workers", "1", "--per-round", "3", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    document = json.loads((out / "capacity.json").read_text())
    low, high = document["bracket"]
    assert document["status"] == "found" and document["answer"] == low
    assert low <= expected < high and high / low <= 1.01
    assert f"capacity: rate scale {low:g}" in printed
    curve = read_csv(out / "capacity.csv", CAPACITY)
    assert curve["met"].tolist() == (curve["scale"] <= expected).astype(int).tolist()
    assert np.all(np.diff(curve["scale"]) > 0)
    assert (out / "capacity.png").stat().st_size > 10_000
    # The same search again finds every scale's record: nothing runs.
    assert cli.main([*argv, "--quiet"]) == 0
    assert json.loads((out / "capacity.json").read_text()) == document


@pytest.mark.parametrize(
    ("slo", "said"),
    [
        ("ttft_p99=5", "--slo 'ttft_p99=5': 'ttft_p99' is not a metric"),
        ("ttft_p99_ms=fast", "the limit must be a finite number, got 'fast'"),
        (",", "expected metric=limit"),
    ],
)
def test_a_bad_slo_is_one_line(tmp_path, capsys, slo, said):
    out = tmp_path / "cap"
    assert cli.main(["capacity", "--slo", slo, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepplan: error: ") and said in err and "\n" not in err
    assert not out.exists()


def test_bad_bounds_are_one_line(tmp_path, capsys):
    assert cli.main(["capacity", "--lo", "2", "--hi", "1", "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.strip() == "stepplan: error: --lo: 2.0 must be below --hi 1.0"
