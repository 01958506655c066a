"""Memory pressure on a long-context trace: the Mooncake synthetic trace (3,993 requests,
15.3k-token prompts on average) under the default H200 cache and smaller ones.

Prints, per setting: throughput, TTFT, running rows per step, KV usage, preemptions,
recomputed tokens, the prefix-cache hit rate, the longest queue and the wall time; the
record goes to ``bench/results/`` (``bench/bench_record.py``).

    python bench/memory_bench.py [--trace PATH] [--rate-scale 1.0] [--set KEY=VALUE ...]

The trace is not shipped (``/work/shared/traces`` on the development machine).
"""

from __future__ import annotations

import argparse
import time

from bench_record import record_run

from stepplan.sim.run import prepare_requests, simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.traces import load_trace

MOONCAKE = "/work/shared/traces/mooncake_synthetic.jsonl"
#: The settings compared: the default cache (memory never binds), then 16 GiB with
#: and without prefix caching.
CASES = {
    "H200 default": {},
    "16 GiB": {"memory.kv_cache_gib": 16},
    "16 GiB, no prefix cache": {"memory.kv_cache_gib": 16, "memory.prefix_caching": False},
}


def measure(trace: str, settings: dict) -> dict[str, float]:
    """One setting's figures, named with their units."""
    config = with_settings(SimConfig(), settings)
    requests = prepare_requests(load_trace(trace), config)
    start = time.perf_counter()
    result = simulate(requests, config)
    wall = time.perf_counter() - start
    summary, steps, memory = result.summary, result.steps, result.summary["memory"]
    ttft = summary["latency_ms"]["ttft"]
    return {
        "requests_per_s": summary["throughput"]["requests_per_s"],
        "total_tokens_per_s": summary["throughput"]["total_tokens_per_s"],
        "ttft_p50_s": ttft["p50"] / 1e3,
        "ttft_p99_s": ttft["p99"] / 1e3,
        "rows_per_step": float(steps["num_rows"].mean()),
        "decode_rows_per_step": float((steps["num_spec_rows"] + steps["num_decode_rows"]).mean()),
        "kv_blocks": int(memory["capacity_blocks"]),
        "kv_peak_share": memory["peak_usage"],
        "kv_mean_share": memory["mean_usage"],
        "steps_share_at_95pct_kv": float((steps["kv_usage"] >= 0.95).mean()),
        "preemptions": int(memory["preemptions"]),
        "preempted_requests": int(memory["preempted_requests"]),
        "recomputed_tokens": int(memory["recomputed_tokens"]),
        "prefix_hit_rate": memory["prefix_cache_hit_rate"],
        "max_waiting": int(steps["num_waiting"].max()),
        "steps": int(steps["step"].size),
        "wall_s": wall,
    }


def shown(figures: dict[str, float]) -> dict[str, str]:
    """The printed table's rows."""
    f = figures
    return {
        "req/s": f"{f['requests_per_s']:.3f}",
        "total tok/s": f"{f['total_tokens_per_s']:,.0f}",
        "TTFT p50 / p99 s": f"{f['ttft_p50_s']:.1f} / {f['ttft_p99_s']:.1f}",
        "rows / step": f"{f['rows_per_step']:.1f}",
        "decode rows / step": f"{f['decode_rows_per_step']:.1f}",
        "KV blocks": f"{f['kv_blocks']:,}",
        "KV peak / mean": f"{f['kv_peak_share']:.2f} / {f['kv_mean_share']:.2f}",
        "steps >= 95% KV": f"{f['steps_share_at_95pct_kv']:.2f}",
        "preemptions": f"{f['preemptions']:,} ({f['preempted_requests']:,} req)",
        "recomputed tokens": f"{f['recomputed_tokens']:,}",
        "prefix hit rate": f"{f['prefix_hit_rate']:.3f}",
        "max waiting": f"{f['max_waiting']:,}",
        "steps": f"{f['steps']:,}",
        "wall s": f"{f['wall_s']:.1f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=MOONCAKE)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    common = {"workload.rate_scale": args.rate_scale}
    common.update(item.split("=", 1) for item in args.set)
    figures = {name: measure(args.trace, {**common, **case}) for name, case in CASES.items()}
    columns = {name: shown(case) for name, case in figures.items()}
    labels = list(next(iter(columns.values())))
    width = max(len(label) for label in labels)
    widths = {
        name: max(len(name), *(len(v) for v in col.values())) for name, col in columns.items()
    }
    print(" " * width, *(name.rjust(widths[name]) for name in columns), sep="  ")
    for label in labels:
        cells = (columns[name][label].rjust(widths[name]) for name in columns)
        print(label.ljust(width), *cells, sep="  ")
    headline = [f"{case}.{key}" for case in CASES for key in ("requests_per_s", "preemptions")]
    record_run("memory_bench", figures, trace=args.trace, settings=common, headline=headline)


if __name__ == "__main__":
    main()
