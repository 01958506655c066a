"""``bench/model_bench.py``'s code on the CPU at tiny size: the steps it builds, its
timing and agreement rows, and its command line (the GPU run is the bench itself)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from stepplan.executor.model import HybridModelRunner, ModelShape
from stepplan.planner import DECODE, PREFILL, SPEC
from stepplan.sim.settings.presets import MODEL_PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import model_bench as bench

TINY = ModelShape(**MODEL_PRESETS["tiny"])


def test_steps_are_the_representative_ones():
    steps = bench.make_steps(np.random.default_rng(0), rows=8, max_len=4096, prefill=2048, vocab=64)
    spec, decode, prefill, mixed = (s.batch for s in steps)
    assert spec.kind_counts == (8, 0, 0, 0) and spec.num_tokens == 32
    assert decode.kind_counts == (0, 8, 0, 0)
    assert spec.num_computed_tokens.min() >= 1000 and spec.num_computed_tokens.max() < 4000
    assert prefill.num_tokens == 2048 and prefill.num_computed_tokens.tolist() == [2048]
    assert mixed.kind_counts == (4, 3, 1, 0) and mixed.num_tokens == 16 + 3 + 512
    kinds = mixed.kinds.tolist()
    assert kinds != sorted(kinds)  # interleaved, as an engine hands rows over
    assert {SPEC, DECODE, PREFILL} == set(kinds)


def test_bench_rows_on_the_cpu():
    runner = HybridModelRunner(
        TINY, bench.planner_config(4), num_slots=5, max_len=64, backend="reference"
    )
    steps = bench.make_steps(np.random.default_rng(1), rows=4, max_len=64, prefill=2048, vocab=64)
    results = bench.run_bench(runner, steps, repeats=2)
    assert [r["step"] for r in results] == [s.name for s in steps]
    for row in results:
        assert row["bucket"] != "eager"  # every step has a graph bucket
        assert row["agree_same_plan"] == row["agree_eager_plan"] == 1.0  # fp32
        assert row["graph"]["wall_ms"] > 0 and np.isnan(row["graph"]["gpu_ms"])


def test_command_line(capsys):
    argv = ["--preset", "tiny", "--device", "cpu", "--slots", "5", "--max-len", "64", "--no-record"]
    assert bench.main([*argv, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "tiny: 43,808 parameters" in out and "decode 4" in out
    assert bench.main([*argv, "--rows", "5"]) == 2
    assert "--rows 5 needs --slots > 5" in capsys.readouterr().err
    assert bench.main([*argv, "--max-len", "9999"]) == 2
    assert "max_len: must be in 1..max_model_len = 512" in capsys.readouterr().err
