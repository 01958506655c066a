"""stepplan's scheduler against the installed vLLM's over a grid of traces and settings.

Every case runs a few hundred requests of one trace under both schedulers
(``sim/scheduler_diff.py``) and records the share of identical steps, the first
divergence with its context, and both sides' preemptions and prefix-cache tokens. The
grid crosses trace formats (the embedded Azure code trace, Mooncake JSON Lines with
hashed prefixes, synthetic workloads of several length distributions and rates) with
speculation depth, token budget, sequence limit, a cache small enough to preempt, and
the model's layout (hybrid without prefix caching, attention only, several attention
groups), a hybrid model caching prefixes included (vLLM's align mode, its conv states
blocks of the one pool). Writes
``bench/results/scheduler_vllm_sweep-<UTC time>.json``.

    python bench/scheduler_vllm_sweep.py [--only SUBSTRING] [--no-record]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np
from bench_record import record_run

from stepplan.sim.run import prepare_requests
from stepplan.sim.scheduler import vllm_engine_scheduler
from stepplan.sim.scheduler_diff import compare_schedulers
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.traces import RequestTable, load_trace
from stepplan.sim.traces.writing import write_trace
from stepplan.sim.workloads import SYNTHETIC_PREFIX, parse_synthetic

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv"))
MOONCAKE = "/work/shared/traces/mooncake_synthetic.jsonl"
MOONCAKE_SLICE = str(ROOT / "tests/data/mooncake_slice.jsonl")
#: Traces this script writes (``write_trace``) before the cases run: ``{WRITTEN}/name``.
WRITTEN = "{written}"

#: name -> (trace path or synthetic spec, requests, whether it carries prefix hashes)
TRACES = {
    "embedded": (EMBEDDED, 300, False),
    "mooncake": (MOONCAKE, 200, True),
    "slice": (MOONCAKE_SLICE, 150, True),
    # many requests sharing a few system prompts of 1-8 hashed blocks (Mooncake format)
    "shared-prefix": (f"{WRITTEN}/shared_prefix.jsonl", 300, True),
    # long prompts, short outputs, arriving fast: chunked prefill dominates
    "syn-long-prompts": (
        "synthetic:n=200,rate=20,prompt=uniform:512:6000,output=uniform:1:64",
        200,
        False,
    ),
    # one-token and tiny prompts, long outputs: decode and padded drafts dominate
    "syn-tiny-prompts": (
        "synthetic:n=300,rate=30,prompt=uniform:1:24,output=zipf:1.1:600",
        300,
        False,
    ),
    # bursty arrivals, heavy-tailed prompts, one output token each
    "syn-bursty-one-output": (
        "synthetic:n=300,rate=50,cv2=8,prompt=zipf:1.05:8000,output=fixed:1",
        300,
        False,
    ),
    # prompts of whole blocks, outputs of whole blocks
    "syn-block-aligned": ("synthetic:n=300,rate=40,prompt=fixed:64,output=fixed:48", 300, False),
    # BurstGPT CSV of a bursty synthetic workload
    "burstgpt": (f"{WRITTEN}/bursty.burstgpt.csv", 300, False),
    # lengths alone (no arrival column): every request arrives at 0
    "lengths-at-once": (f"{WRITTEN}/at_once.lengths.csv", 200, False),
    # LLMServingSim JSON Lines (nanosecond clock)
    "llmservingsim": (f"{WRITTEN}/llmservingsim.jsonl", 300, False),
}

#: Written traces: file name -> (synthetic spec or ``shared-prefix``, format).
WRITTEN_TRACES = {
    "shared_prefix.jsonl": ("shared-prefix", "mooncake"),
    "bursty.burstgpt.csv": (
        "synthetic:n=300,rate=15,cv2=6,prompt=zipf:1.1:6000,output=zipf:1.2:800",
        "burstgpt",
    ),
    "at_once.lengths.csv": (
        "synthetic:n=200,rate=1,prompt=uniform:16:3000,output=uniform:1:300",
        "lengths",
    ),
    "llmservingsim.jsonl": (
        "synthetic:n=300,rate=12,prompt=uniform:100:2500,output=uniform:50:700",
        "llmservingsim",
    ),
}

HYBRID = {"memory.prefix_caching": False}
ATTENTION_ONLY = {"model.conv_layers": 0}
#: 24 attention and 8 conv layers: vLLM groups them by 8, three attention groups.
GROUPS = {
    "model.layers": 32,
    "model.conv_layers": 8,
    "model.kv_bytes_per_token": 24 * 2 * 8 * 128 * 2,
    "memory.prefix_caching": False,
}
#: Hashed traces only, at the default cache: vLLM's align mode on a hybrid model.
HYBRID_PREFIX = {"memory.prefix_caching": True}
GROUPS_PREFIX = GROUPS | HYBRID_PREFIX
MODELS = {
    "hybrid": HYBRID,
    "attn": ATTENTION_ONLY,
    "groups": GROUPS,
    "hybrid-prefix": HYBRID_PREFIX,
    "groups-prefix": GROUPS_PREFIX,
}

#: name -> scheduler settings
SCHEDULING = {
    "spec0-b2048": {"scheduler.num_spec_tokens": 0, "scheduler.max_num_batched_tokens": 2048},
    "spec1-b512-s16": {
        "scheduler.num_spec_tokens": 1,
        "scheduler.max_num_batched_tokens": 512,
        "scheduler.max_num_seqs": 16,
    },
    "spec2-b256-s4": {
        "scheduler.num_spec_tokens": 2,
        "scheduler.max_num_batched_tokens": 256,
        "scheduler.max_num_seqs": 4,
    },
    "spec3-b8192": {"scheduler.num_spec_tokens": 3},
    "spec4-b2048-s16": {
        "scheduler.num_spec_tokens": 4,
        "scheduler.max_num_batched_tokens": 2048,
        "scheduler.max_num_seqs": 16,
    },
}

#: name -> cache settings by model; the small ones preempt on most traces (a case whose
#: longest request does not fit is skipped and listed).
SMALL_CACHES = {
    "small": {"memory.kv_cache_gib": 0.5, "workload.rate_scale": 4.0},
    "tiny": {"memory.kv_cache_gib": 0.25, "workload.rate_scale": 4.0},
}
GROUPS_CACHES = {
    "small": {"memory.kv_cache_gib": 1.2, "workload.rate_scale": 4.0},
    "tiny": {"memory.kv_cache_gib": 0.6, "workload.rate_scale": 4.0},
}
#: Mooncake prompts average 13,600 tokens: its caches are larger.
MOONCAKE_CACHES = {"small": {"memory.kv_cache_gib": 6.0, "workload.rate_scale": 4.0}}


def _caches(trace: str, model: str) -> dict[str, dict]:
    """The caches a model runs at on a trace: the default, and smaller ones."""
    if trace in ("mooncake", "slice"):
        return {"default": {}, **MOONCAKE_CACHES}
    groups = model.startswith("groups")
    return {"default": {}, **(GROUPS_CACHES if groups else SMALL_CACHES)}


def cases() -> dict[str, tuple[str, int, dict]]:
    """Every case's trace, request count and settings, by name."""
    grid: dict[str, tuple[str, int, dict]] = {}
    for trace, (source, limit, hashed) in TRACES.items():
        for model, model_settings in MODELS.items():
            if model.endswith("-prefix") and not hashed:
                continue  # nothing to cache: the same runs as without
            for scheduling, scheduling_settings in SCHEDULING.items():
                for cache, cache_settings in _caches(trace, model).items():
                    settings = model_settings | scheduling_settings | cache_settings
                    grid[f"{trace}/{model}/{scheduling}/{cache}"] = (source, limit, settings)
    return grid


def shared_prefix_table(count: int, seed: int, block_tokens: int = 512) -> RequestTable:
    """``count`` requests, each a system prompt of 1-8 hashed blocks (one of six) and
    1-5 blocks of its own, the last partly filled; Poisson arrivals at 20/s."""
    rng = np.random.default_rng(seed)
    systems = [
        list(range(1000 * s, 1000 * s + int(n))) for s, n in enumerate(rng.integers(1, 9, 6))
    ]
    offsets, blocks, prompts, own = [0], [], [], 10**6
    for _ in range(count):
        mine = int(rng.integers(1, 6))
        ids = systems[int(rng.integers(len(systems)))] + list(range(own, own + mine))
        own += mine
        prompts.append((len(ids) - 1) * block_tokens + int(rng.integers(1, block_tokens + 1)))
        blocks.extend(ids)
        offsets.append(len(blocks))
    arrivals = np.cumsum(rng.exponential(1 / 20, count))
    return RequestTable(
        arrival_s=arrivals - arrivals[0],
        prompt_tokens=prompts,
        output_tokens=rng.integers(1, 300, count),
        prefix_offsets=np.array(offsets, np.int64),
        prefix_blocks=np.array(blocks, np.int64),
    )


def write_traces(folder: Path) -> None:
    """Write :data:`WRITTEN_TRACES` into ``folder`` (new files)."""
    for name, (spec, fmt) in WRITTEN_TRACES.items():
        table = shared_prefix_table(300, 1) if spec == "shared-prefix" else parse_synthetic(spec)
        write_trace(table, folder / name, fmt)


def _table(source: str, limit: int, config: SimConfig):
    if source.startswith(SYNTHETIC_PREFIX):
        raw = parse_synthetic(source, seed=config.seed, limit=limit)
    else:
        raw = load_trace(source).limit(limit)
    return prepare_requests(raw, config)


def agreement(source: str, limit: int, settings: dict) -> dict:
    """One case compared: :meth:`SchedulerDiff.to_dict` and its CPU seconds."""
    start = time.process_time()
    config = with_settings(SimConfig(), settings)
    table = _table(source, limit, config)
    vllm = with_settings(config, {"scheduler.implementation": "vllm"})
    diff = compare_schedulers(table, config, vllm, ("stepplan", "vllm")).to_dict()
    diff["settings"] = settings
    diff["cpu_s"] = time.process_time() - start
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the cases whose name holds this")
    parser.add_argument("--no-record", action="store_true", help="print, write no record")
    args = parser.parse_args()
    figures: dict = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        write_traces(Path(folder))
        for name, (source, limit, settings) in cases().items():
            source = source.format(written=folder)
            if args.only not in name:
                continue
            if not (source.startswith(SYNTHETIC_PREFIX) or Path(source).exists()):
                continue
            try:
                figures[name] = result = agreement(source, limit, settings)
            except ConfigError as exc:  # a cache too small for the trace's longest request
                skipped.append(name)
                print(f"{name:52s} skipped: {exc}", flush=True)
                continue
            sides = list(result["sides"].values())
            print(
                f"{name:52s} {result['agreement']:8.2%} steps {result['steps']} "
                f"first {result['first_divergence']} "
                f"preempted {[side['preemptions'] for side in sides]} "
                f"cached {[side['prefix_cached_tokens'] for side in sides]} "
                f"({result['cpu_s']:.1f} s)",
                flush=True,
            )
    shares = {name: case["agreement"] for name, case in figures.items()}
    below = {name: share for name, share in shares.items() if share < 1.0}
    summary = {
        "cases": len(shares),
        "cases_skipped": len(skipped),
        "cases_below_100pct": len(below),
        "cases_below_99pct": sum(share < 0.99 for share in shares.values()),
        "lowest_agreement": min(shares.values(), default=1.0),
    }
    print(summary)
    for name, share in below.items():
        print(f"  {name}: {share:.4%}")
    if not args.no_record:
        record_run(
            "scheduler_vllm_sweep",
            {"summary": summary, **by_trace_and_model(figures)},
            title="stepplan's scheduler against vLLM 0.33's over traces and settings",
            vllm=vllm_engine_scheduler.vllm_version(),
            notes=f"skipped (longest request above the cache): {', '.join(skipped) or 'none'}",
            cases=figures,
        )


def by_trace_and_model(figures: dict[str, dict]) -> dict[str, dict]:
    """Per ``trace/model``: its cases, the lowest share of agreeing steps and the steps
    run by stepplan's scheduler (every case's own figures go under the record's
    ``cases``)."""
    groups: dict[str, dict] = {}
    for name, case in figures.items():
        trace, model, *_ = name.split("/")
        group = groups.setdefault(
            f"{trace}/{model}", {"cases": 0, "lowest_agreement": 1.0, "steps": 0}
        )
        group["cases"] += 1
        group["lowest_agreement"] = min(group["lowest_agreement"], case["agreement"])
        group["steps"] += case["steps"][0]
    return groups


if __name__ == "__main__":
    main()
