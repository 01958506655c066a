"""``bench/vllm_builder_bench.py`` on the CPU at tiny size (``--smoke``): it runs, times
every mode it can here and checks every field against the host oracle (no timing claims);
``bench/vllm_builder_parts.py``'s copy of the build path gives a real build's metadata."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vllm_builder_bench as bench
import vllm_builder_parts as parts


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
    if importlib.util.find_spec("vllm") is not None:  # stepplan's builder in vLLM, alone
        assert "| in vLLM   idle" in out and "| vLLM 0.33" not in out


def test_the_parts_bench_replays_what_a_build_makes(capsys):
    parts.main(["--smoke"])
    out = capsys.readouterr().out
    assert "the replayed path's metadata equal a real build's" in out
    assert all(piece in out for piece in parts.PIECES)


def test_the_parts_bench_notices_a_path_that_differs():
    config = parts.PlannerConfig(num_spec_tokens=bench.SPEC_TOKENS, graph_mode="full")
    case = bench.Case(config, "cpu", bench.SMOKE_BATCHES["mixed 8"], 0, True, False)
    metadata, kwargs = case.engine.step(case.steps(1)[0])
    real = case.builders[0].build(0, metadata[0], **kwargs)
    case.share.new_step()
    replayed, timings = parts.replayed_build(case.builders[0], metadata[0], kwargs)
    assert len(timings) == len(parts.PIECES)
    assert parts.same_metadata(real, replayed)
    assert not parts.same_metadata(real, replayed._replace(num_reqs=real.num_reqs + 1))
    other = replayed._replace(spec_query_start_loc=real.spec_query_start_loc.clone())
    assert not parts.same_metadata(real, other)
