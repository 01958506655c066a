"""Agreement of stepplan's scheduler with the installed vLLM's, and the vLLM path's speed.

Each case runs one trace under both schedulers (``sim/scheduler_diff.py``) and records
the share of identical steps, the first divergence and the side-by-side figures; the
speed case times ``run_steps`` on the vLLM path five times (the run of median speed is
kept, every run's figure listed), its scheduler's construction (vLLM's
configs) apart. Writes ``bench/results/scheduler_vllm-<UTC time>.json``.

    python bench/scheduler_vllm_bench.py
    python bench/scheduler_vllm_bench.py --cases mooncake-400-prefix-8gib,... [--python-speed]

``--cases`` runs only the named agreement cases (no speed case) into
``bench/results/scheduler_vllm_cases-<UTC time>.json``; ``--python-speed`` adds, for
each, stepplan's scheduler in Python: steps per CPU second, best of three.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from importlib import resources
from pathlib import Path

from bench_record import record_run

from stepplan.sim.results.outcome import MemoryStore
from stepplan.sim.run import prepare_requests, run_steps
from stepplan.sim.scheduler import vllm_engine_scheduler
from stepplan.sim.scheduler_diff import compare_schedulers
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.traces import load_trace

EMBEDDED = str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv"))
MOONCAKE = "/work/shared/traces/mooncake_synthetic.jsonl"
PREEMPTING = {
    "memory.kv_cache_gib": 0.6,
    "scheduler.max_num_seqs": 32,
    "scheduler.max_num_batched_tokens": 2048,
    "workload.rate_scale": 4.0,
}
#: The model without its conv layers: vLLM's cache then splits memory as stepplan's does.
ATTENTION_ONLY = {"model.conv_layers": 0}
CASES = {
    "embedded-1000-spec3": (EMBEDDED, 1000, {}),
    "embedded-1000-nospec-budget512": (
        EMBEDDED,
        1000,
        {"scheduler.num_spec_tokens": 0, "scheduler.max_num_batched_tokens": 512},
    ),
    "embedded-1000-small-cache": (EMBEDDED, 1000, PREEMPTING),
    "embedded-1000-small-cache-attention-only": (EMBEDDED, 1000, PREEMPTING | ATTENTION_ONLY),
    "mooncake-400-prefix": (MOONCAKE, 400, {}),
    "mooncake-400-prefix-attention-only": (MOONCAKE, 400, ATTENTION_ONLY),
    # caches smaller than the working set: entries evicted, requests preempted
    "mooncake-400-prefix-attention-only-8gib": (
        MOONCAKE,
        400,
        ATTENTION_ONLY | {"memory.kv_cache_gib": 8.0},
    ),
    "mooncake-400-prefix-attention-only-20gib": (
        MOONCAKE,
        400,
        ATTENTION_ONLY | {"memory.kv_cache_gib": 20.0},
    ),
    "mooncake-400-prefix-50gib": (MOONCAKE, 400, {"memory.kv_cache_gib": 50.0}),
}
#: Conv states as slots reserved apart (``memory.align_state_blocks`` off), where they
#: are blocks of vLLM's one pool by default.
SLOTS_APART = {"memory.align_state_blocks": False}
#: The hybrid model caching prefixes in caches that bind, conv states as blocks of the
#: pool (the default) and as slots apart.
for _gib in (8, 20, 50, 100):
    _size = {"memory.kv_cache_gib": float(_gib)}
    CASES.setdefault(f"mooncake-400-prefix-{_gib}gib", (MOONCAKE, 400, _size))
    CASES[f"mooncake-400-prefix-{_gib}gib-slots-apart"] = (MOONCAKE, 400, _size | SLOTS_APART)


#: The figures the results page shows of a full run.
HEADLINE = [
    "mooncake-400-prefix-8gib.agreement",
    "mooncake-400-prefix-50gib.agreement",
    "mooncake-400-prefix-attention-only-8gib.agreement",
    "speed_hybrid.steps_per_s_cpu",
    "stepplan_speed_mooncake_hybrid_50gib.compiled_steps_per_s_cpu",
]


def _table(path: str, limit: int, config: SimConfig):
    return prepare_requests(load_trace(path).limit(limit), config)


def agreement(path: str, limit: int, settings: dict) -> dict:
    config = with_settings(SimConfig(), settings)
    table = _table(path, limit, config)
    vllm = with_settings(config, {"scheduler.implementation": "vllm"})
    diff = compare_schedulers(table, config, vllm, ("stepplan", "vllm"))
    return diff.to_dict()


def _timed_engine(built, spent: dict):
    """``_engine`` whose construction and vLLM calls add their CPU seconds to ``spent``."""

    def build(*args):
        start = time.process_time()
        engine, *rest = built(*args)
        spent["setup_cpu_s"] += time.process_time() - start
        for name in ("schedule", "update_from_output", "update_draft_token_ids"):
            call = getattr(engine, name)

            def timed(*inputs, call=call):
                begin = time.process_time()
                out = call(*inputs)
                spent["vllm_calls_cpu_s"] += time.process_time() - begin
                return out

            setattr(engine, name, timed)
        return (engine, *rest)

    return build


#: Runs of each speed case: the machine is shared, so one run's figure is noisy.
SPEED_RUNS = 5


def speed(limit: int, settings: dict) -> dict:
    """The run of median speed among :data:`SPEED_RUNS` (:func:`speed_once`), with
    every run's steps per CPU second."""
    runs = sorted((speed_once(limit, settings) for _ in range(SPEED_RUNS)), key=_per_cpu_s)
    median = runs[len(runs) // 2]
    return {
        **median,
        "runs": len(runs),
        "steps_per_s_cpu_each": [_per_cpu_s(run) for run in runs],
        "vllm_calls_steps_per_s_cpu_each": [run["vllm_calls_steps_per_s_cpu"] for run in runs],
    }


def _per_cpu_s(run: dict) -> float:
    return run["steps_per_s_cpu"]


def speed_once(limit: int, settings: dict) -> dict:
    """Steps per second of the whole loop on the vLLM path (CPU time, which the other
    processes on the machine do not inflate, and wall time), vLLM's calls apart."""
    import vllm.v1.core.sched.scheduler  # noqa: F401  the import (seconds) is not stepping

    config = with_settings(SimConfig(), {"scheduler.implementation": "vllm", **settings})
    table = _table(EMBEDDED, limit, config)
    built = vllm_engine_scheduler._engine
    spent = {"setup_cpu_s": 0.0, "vllm_calls_cpu_s": 0.0}
    vllm_engine_scheduler._engine = _timed_engine(built, spent)
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        end = run_steps(table, config, MemoryStore())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        vllm_engine_scheduler._engine = built
    steps = end.summary["steps"]["count"]
    stepping = cpu - spent["setup_cpu_s"]
    return {
        "requests": limit,
        "steps": steps,
        "wall_s": wall,
        "cpu_s": cpu,
        **spent,
        "steps_per_s_cpu": steps / stepping,
        "vllm_calls_steps_per_s_cpu": steps / spent["vllm_calls_cpu_s"],
        "load_average_1min": os.getloadavg()[0],
    }


def stepplan_speed(path: str, limit: int, settings: dict) -> dict:
    """stepplan's own scheduler on the compiled stepper and in Python (its
    specification): steps per CPU second of the whole loop, the faster of three runs."""
    config = with_settings(SimConfig(), settings)
    table = _table(path, limit, config)
    figures: dict = {"requests": limit}
    for name, native in (("compiled", True), ("python", False)):
        best = 0.0
        for _ in range(3):
            cpu = time.process_time()
            end = run_steps(table, config, MemoryStore(), native=native)
            steps = end.summary["steps"]["count"]
            best = max(best, steps / (time.process_time() - cpu))
        figures[f"{name}_steps_per_s_cpu"] = best
        figures["steps"] = steps
    figures["speedup"] = figures["compiled_steps_per_s_cpu"] / figures["python_steps_per_s_cpu"]
    return figures


def python_speed(path: str, limit: int, settings: dict) -> dict:
    """stepplan's scheduler in Python on ``settings``: steps per CPU second of the
    whole loop, the best of three runs."""
    config = with_settings(SimConfig(), settings)
    table = _table(path, limit, config)
    best, steps = 0.0, 0
    for _ in range(3):
        cpu = time.process_time()
        end = run_steps(table, config, MemoryStore(), native=False)
        steps = end.summary["steps"]["count"]
        best = max(best, steps / (time.process_time() - cpu))
    return {"steps": steps, "python_steps_per_s_cpu": best}


def run_cases(names: list[str], with_speed: bool) -> None:
    """The agreement cases ``names`` only (and stepplan's Python speed on each)."""
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"--cases: no case {', '.join(unknown)} (cases: {', '.join(CASES)})")
    figures: dict = {}
    for name in names:
        path, limit, settings = CASES[name]
        figures[name] = agreement(path, limit, settings)
        if with_speed:
            figures[name]["stepplan_python"] = python_speed(path, limit, settings)
        print(name, figures[name]["agreement"], figures[name]["first_divergence"], flush=True)
    # a record of its own: the full run's record (speed included) stays the newest
    # of "scheduler_vllm"
    record_run(
        "scheduler_vllm_cases",
        figures,
        vllm=vllm_engine_scheduler.vllm_version(),
        title="scheduler_vllm, selected agreement cases",
        headline=[f"{name}.agreement" for name in names],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated agreement cases to run alone")
    parser.add_argument("--python-speed", action="store_true", help="with --cases")
    args = parser.parse_args()
    if args.cases:
        run_cases(args.cases.split(","), args.python_speed)
        return
    figures: dict = {
        "speed_hybrid": speed(1000, {}),
        "speed_attention_only": speed(1000, ATTENTION_ONLY),
        # vLLM's align mode (a hybrid model caching prefixes) on the compiled stepper
        "stepplan_speed_mooncake_hybrid": stepplan_speed(MOONCAKE, 400, {}),
        "stepplan_speed_mooncake_hybrid_slots_apart": stepplan_speed(MOONCAKE, 400, SLOTS_APART),
        "stepplan_speed_mooncake_hybrid_50gib": stepplan_speed(
            MOONCAKE, 400, {"memory.kv_cache_gib": 50.0}
        ),
        "stepplan_speed_mooncake_attention_only": stepplan_speed(MOONCAKE, 400, ATTENTION_ONLY),
    }
    for name, (path, limit, settings) in CASES.items():
        if Path(path).exists():
            figures[name] = agreement(path, limit, settings)
            print(name, figures[name]["agreement"], figures[name]["first_divergence"], flush=True)
    print(json.dumps({k: v for k, v in figures.items() if "speed" in k}))
    record_run(
        "scheduler_vllm",
        figures,
        vllm=vllm_engine_scheduler.vllm_version(),
        headline=HEADLINE,
    )


if __name__ == "__main__":
    main()
