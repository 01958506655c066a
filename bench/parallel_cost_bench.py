"""Predicted latency, throughput and dollars at tensor parallelism 1, 2 and 4 on the
bundled Azure code trace, for the H100 and H200 presets (the simulator's roofline: these
are the model's predictions, not measurements of GPUs).

    python bench/parallel_cost_bench.py [--rate-scales 1 8] [--limit N]

Each case is ``stepplan simulate sim/data/azure_llm_2023_code.csv --set gpu.name=G --set
parallel.tensor=T --set workload.rate_scale=S`` run in this process; the table (Markdown)
goes to standard output and the record (date, device, command, commit, figures) to
``bench/results/parallel_cost_bench-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench_record import record_run

from stepplan.sim import cli
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import check_config

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "sim" / "data" / "azure_llm_2023_code.csv"


def case(gpu: str, tensor: int, rate_scale: float, limit: int | None) -> dict:
    """One simulation's figures."""
    argv = ["simulate", str(TRACE), *(["--limit", str(limit)] if limit else [])]
    args = cli.build_parser().parse_args(argv)
    settings = {"gpu.name": gpu, "parallel.tensor": tensor, "workload.rate_scale": rate_scale}
    config = check_config(cli.with_settings(cli.build_config(args), settings))
    started = time.perf_counter()
    summary = simulate(cli.load_requests(args, config), config).summary
    latency, dollars, times = summary["latency_ms"], summary["dollars"], summary["time_s"]
    return {
        "gpu": gpu,
        "tensor": tensor,
        "rate_scale": rate_scale,
        "requests": summary["finished_requests"],
        "ttft_mean_ms": latency["ttft"]["mean"],
        "ttft_p99_ms": latency["ttft"]["p99"],
        "tpot_mean_ms": latency["tpot"]["mean"],
        "tpot_p99_ms": latency["tpot"]["p99"],
        "output_tok_s": summary["throughput"]["output_tokens_per_s"],
        "goodput_share": summary["goodput"]["share"],
        "busy_s": times["busy"],
        "allreduce_s": times["allreduce"],
        "kv_capacity_blocks": summary["memory"]["capacity_blocks"],
        "usd_per_hour": dollars["per_hour"],
        "usd_per_m_output_tokens": dollars["per_million_output_tokens"],
        "good_requests_per_usd": dollars["good_requests_per_dollar"],
        "wall_s": time.perf_counter() - started,
    }


COLUMNS = (
    ("GPU", "gpu", "{}"),
    ("TP", "tensor", "{}"),
    ("rate x", "rate_scale", "{:g}"),
    ("TTFT mean ms", "ttft_mean_ms", "{:,.1f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:,.1f}"),
    ("TPOT mean ms", "tpot_mean_ms", "{:,.2f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:,.2f}"),
    ("output tok/s", "output_tok_s", "{:,.1f}"),
    ("goodput", "goodput_share", "{:.3f}"),
    ("all-reduce / busy", "allreduce_share", "{:.3f}"),
    ("$/h", "usd_per_hour", "{:,.2f}"),
    ("$/M output tok", "usd_per_m_output_tokens", "{:,.2f}"),
    ("good req/$", "good_requests_per_usd", "{:,.1f}"),
)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        row = {**row, "allreduce_share": row["allreduce_s"] / row["busy_s"]}
        lines.append("| " + " | ".join(f.format(row[key]) for _, key, f in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", nargs="+", default=["H100", "H200"])
    parser.add_argument("--tensor", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--rate-scales", nargs="+", type=float, default=[1.0, 8.0])
    parser.add_argument("--limit", type=int, help="the trace's first N requests (default all)")
    parser.add_argument("--record", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    rows = [
        case(gpu, tensor, scale, args.limit)
        for scale in args.rate_scales
        for gpu in args.gpus
        for tensor in args.tensor
    ]
    print(table(rows))
    record_run(
        "parallel_cost_bench",
        {"cases": rows},
        folder=args.record,
        trace=str(TRACE.relative_to(ROOT)),
    )


if __name__ == "__main__":
    main()
