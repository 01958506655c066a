"""``bench/tp_live.py``'s code on the CPU: the trace slice it serves, the run of one rank
(no process group at TP 1), and the settings it refuses before launching any rank."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from engine_cases import dense_greedy

from stepplan.executor.model import ModelShape, make_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import tp_live as bench


def test_the_slice_is_the_traces_first_rows_capped(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9,4808,10\n2023-11-16 18:17:04.0,7,0\n2023-11-16 18:17:04.1,9,99\n"
    )
    assert bench.trace_slice(trace, 2, 48, 16) == [(48, 10), (7, 1)]
    assert bench.trace_slice(trace, 5, 8, 16) == [(8, 10), (7, 1), (8, 16)]


def test_one_rank_serves_the_dense_models_tokens():
    args = bench.parse_args(["--requests", "3", "--max-prompt", "6", "--max-new", "4"])
    lengths = bench.trace_slice(args.trace, args.requests, args.max_prompt, args.max_new)
    served = bench.serve(0, 1, args, lengths)
    shape = ModelShape(**bench.MODEL_PRESETS["tiny"], seed=0)
    prompts = bench.prompts_of(shape, lengths)
    expected = [
        dense_greedy(make_weights(shape, "cpu"), shape, [p], n)[0][0]
        for p, (_, n) in zip(prompts, lengths, strict=True)
    ]
    assert served["tokens"] == expected and served["steps"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tensor", "1"], "tp_live: --tensor must be at least 2, got 1"),
        (["--backend", "triton"], "tp_live: --backend triton on the CPU needs TRITON_INTERPRET=1"),
    ],
)
def test_settings_that_cannot_run_exit_2(argv, message, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == message
