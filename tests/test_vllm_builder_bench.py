"""``bench/vllm_builder_bench.py`` on the CPU at tiny size (``--smoke``): it runs, times
every mode it can here and checks every field against the host oracle (no timing claims)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vllm_builder_bench as bench


def test_the_bench_smoke_runs_on_the_cpu(capsys):
    bench.main(["--smoke"])
    out = capsys.readouterr().out
    assert "quiet rounds" in out
    for batch in bench.SMOKE_BATCHES:
        rows = [line for line in out.splitlines() if line.startswith(f"{batch} ")]
        for mode in ("idle", "4 groups", "further"):
            assert any(f" {mode} " in row for row in rows), (batch, mode)
        assert any(row.startswith(f"{batch} +tables") for row in rows)
    assert out.count("every field of every group equals the host oracle") == 2 * len(
        bench.SMOKE_BATCHES
    )


def test_the_host_only_smoke_leaves_the_device_half_out(capsys):
    bench.main(["--smoke", "--host-only"])
    out = capsys.readouterr().out
    assert "host only" in out and "host oracle" not in out
