"""Agreement of stepplan's scheduler with the installed vLLM's, and the vLLM path's speed.

Each case runs one trace under both schedulers (``sim/scheduler_diff.py``) and records
the share of identical steps, the first divergence and the side-by-side figures; the
speed case times ``run_steps`` on the vLLM path, its scheduler's construction (vLLM's
configs) apart. Writes ``bench/results/scheduler_vllm-<UTC time>.json``.

    python bench/scheduler_vllm_bench.py
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from importlib import resources
from pathlib import Path

from results_bench import commit, device

from stepplan.sim.config import SimConfig, with_settings
from stepplan.sim.outcome import MemoryStore
from stepplan.sim.run import prepare_requests, run_steps
from stepplan.sim.scheduler import vllm_engine_scheduler
from stepplan.sim.scheduler_diff import compare_schedulers
from stepplan.sim.traces import load_trace

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv"))
MOONCAKE = "/work/shared/traces/mooncake_synthetic.jsonl"
PREEMPTING = {
    "memory.kv_cache_gib": 0.6,
    "scheduler.max_num_seqs": 32,
    "scheduler.max_num_batched_tokens": 2048,
    "workload.rate_scale": 4.0,
}
CASES = {
    "embedded-1000-spec3": (EMBEDDED, 1000, {}),
    "embedded-1000-nospec-budget512": (
        EMBEDDED,
        1000,
        {"scheduler.num_spec_tokens": 0, "scheduler.max_num_batched_tokens": 512},
    ),
    "embedded-1000-small-cache": (EMBEDDED, 1000, PREEMPTING),
    "mooncake-400-prefix": (MOONCAKE, 400, {}),
}


def _table(path: str, limit: int, config: SimConfig):
    return prepare_requests(load_trace(path).limit(limit), config)


def agreement(path: str, limit: int, settings: dict) -> dict:
    config = with_settings(SimConfig(), settings)
    table = _table(path, limit, config)
    vllm = with_settings(config, {"scheduler.implementation": "vllm"})
    diff = compare_schedulers(table, config, vllm, ("stepplan", "vllm"))
    return diff.to_dict()


def speed(limit: int) -> dict:
    import vllm.v1.core.sched.scheduler  # noqa: F401  the import (seconds) is not stepping

    config = with_settings(SimConfig(), {"scheduler.implementation": "vllm"})
    table = _table(EMBEDDED, limit, config)
    built = vllm_engine_scheduler._engine
    setup = []

    def timed(*args):
        start = time.perf_counter()
        engine = built(*args)
        setup.append(time.perf_counter() - start)
        return engine

    vllm_engine_scheduler._engine = timed
    try:
        start = time.perf_counter()
        end = run_steps(table, config, MemoryStore())
        wall = time.perf_counter() - start
    finally:
        vllm_engine_scheduler._engine = built
    steps = end.summary["steps"]["count"]
    stepping = wall - setup[0]
    return {
        "requests": limit,
        "steps": steps,
        "wall_s": wall,
        "setup_s": setup[0],
        "steps_per_s": steps / stepping,
    }


def main() -> None:
    figures: dict = {"speed": speed(1000)}
    for name, (path, limit, settings) in CASES.items():
        if Path(path).exists():
            figures[name] = agreement(path, limit, settings)
            print(name, figures[name]["agreement"], figures[name]["first_divergence"], flush=True)
    print(json.dumps(figures["speed"]))
    now = dt.datetime.now(dt.timezone.utc)
    record = {
        "benchmark": "scheduler_vllm",
        "date": now.date().isoformat(),
        "device": device(),
        "command": "python " + " ".join(["bench/scheduler_vllm_bench.py", *sys.argv[1:]]),
        **commit(),
        "vllm": vllm_engine_scheduler.vllm_version(),
        "figures": figures,
    }
    out = ROOT / "bench" / "results" / f"scheduler_vllm-{now:%Y-%m-%dT%H%M%S}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
