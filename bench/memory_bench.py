"""Memory pressure on a long-context trace: the Mooncake synthetic trace (3,993 requests,
15.3k-token prompts on average) under the default H200 cache and smaller ones.

Prints, per setting: throughput, TTFT, running rows per step, KV usage, preemptions,
recomputed tokens, the prefix-cache hit rate, the longest queue and the wall time.

    python bench/memory_bench.py [--trace PATH] [--rate-scale 1.0] [--set KEY=VALUE ...]

The trace is not shipped (``/work/shared/traces`` on the development machine).
"""

from __future__ import annotations

import argparse
import time

from stepplan.sim.config import SimConfig, with_settings
from stepplan.sim.run import prepare_requests, simulate
from stepplan.sim.traces import load_trace

MOONCAKE = "/work/shared/traces/mooncake_synthetic.jsonl"
#: The settings compared: the default cache (memory never binds), then 16 GiB with
#: and without prefix caching.
CASES = {
    "H200 default": {},
    "16 GiB": {"memory.kv_cache_gib": 16},
    "16 GiB, no prefix cache": {"memory.kv_cache_gib": 16, "memory.prefix_caching": False},
}


def measure(trace: str, settings: dict) -> dict[str, str]:
    config = with_settings(SimConfig(), settings)
    requests = prepare_requests(load_trace(trace), config)
    start = time.perf_counter()
    result = simulate(requests, config)
    wall = time.perf_counter() - start
    summary, steps, memory = result.summary, result.steps, result.summary["memory"]
    ttft = summary["latency_ms"]["ttft"]
    return {
        "req/s": f"{summary['throughput']['requests_per_s']:.3f}",
        "total tok/s": f"{summary['throughput']['total_tokens_per_s']:,.0f}",
        "TTFT p50 / p99 s": f"{ttft['p50'] / 1e3:.1f} / {ttft['p99'] / 1e3:.1f}",
        "rows / step": f"{steps['num_rows'].mean():.1f}",
        "decode rows / step": f"{(steps['num_spec_rows'] + steps['num_decode_rows']).mean():.1f}",
        "KV blocks": f"{memory['capacity_blocks']:,}",
        "KV peak / mean": f"{memory['peak_usage']:.2f} / {memory['mean_usage']:.2f}",
        "steps >= 95% KV": f"{(steps['kv_usage'] >= 0.95).mean():.2f}",
        "preemptions": f"{memory['preemptions']:,} ({memory['preempted_requests']:,} req)",
        "recomputed tokens": f"{memory['recomputed_tokens']:,}",
        "prefix hit rate": f"{memory['prefix_cache_hit_rate']:.3f}",
        "max waiting": f"{steps['num_waiting'].max():,}",
        "steps": f"{steps['step'].size:,}",
        "wall s": f"{wall:.1f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=MOONCAKE)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    common = {"workload.rate_scale": args.rate_scale}
    common.update(item.split("=", 1) for item in args.set)
    columns = {name: measure(args.trace, {**common, **case}) for name, case in CASES.items()}
    labels = list(next(iter(columns.values())))
    width = max(len(label) for label in labels)
    widths = {
        name: max(len(name), *(len(v) for v in col.values())) for name, col in columns.items()
    }
    print(" " * width, *(name.rjust(widths[name]) for name in columns), sep="  ")
    for label in labels:
        cells = (columns[name][label].rjust(widths[name]) for name in columns)
        print(label.ljust(width), *cells, sep="  ")


if __name__ == "__main__":
    main()
