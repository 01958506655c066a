"""Graph sizes on the live engine: the optimizer's predicted gain against the measured one.

1. **Profile.** ``stepplan profile`` times the live engine (``--model``'s preset on
   ``--live-device``) over its grid, its graph sizes the union of vLLM's and SGLang's
   default lists; on CUDA it first captures each graph in ascending order and records
   the device memory each capture takes in the profile's ``graph_memory``
   (``docs/profile_format.md``). Without CUDA there are no graphs to measure: one line
   says so and the lists are compared by graph count alone.
2. **Choose.** The trace slice (``--start-s``, ``--requests``) is simulated with the
   profile's step times, and ``stepplan buckets``' search picks the fastest list with
   vLLM's graph count and no more graph memory than vLLM's default list.
3. **Serve.** The slice is served twice by the live engine with measured step times
   (``--live --live-time measured``): with vLLM's default sizes and with the chosen ones.
4. **Compare.** Each live run's steps are predicted under its own list from the profile;
   the measured difference of total step time (chosen minus vLLM's) is set against the
   predicted one, the gap as a share of vLLM's measured total. A JSON record goes to
   ``--record`` (``bench/results/``).

On a machine without a GPU, ``--live-device cpu`` runs the whole path in a tiny setting
(``--model tiny``, a few requests): the check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_TRACE = ROOT / "sim" / "data" / "azure_llm_2023_code.csv"


def device_record(live_device: str) -> dict[str, Any]:
    """The machine, as bench records hold it (the GPU's name when there is one)."""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.machine()
    )  # fmt: skip
    memory = next(
        line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )  # fmt: skip
    machine = "CPU only"
    if live_device == "cuda":
        import torch

        machine = torch.cuda.get_device_name(0)
    return {
        "machine": machine,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "python": platform.python_version(),
    }


def commit_record() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "dirty": bool(git("status", "--porcelain", "-uno").strip()),
    }


def setting_args(args: argparse.Namespace) -> list[str]:
    """The settings every command of the benchmark shares (model, planner, scheduler)."""
    return [
        "--set", f"model.name={args.model}",
        "--num-spec-tokens", str(args.num_spec_tokens),
        "--max-num-seqs", str(args.max_num_seqs),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens),
        "--graph-mode", "full",
        "--live-device", args.live_device,
        "--seed", str(args.seed),
    ]  # fmt: skip


def slice_args(args: argparse.Namespace) -> list[str]:
    """The trace slice: ``--requests`` requests from ``--start-s`` on."""
    return [str(args.trace), "--start-s", str(args.start_s), "--limit", str(args.requests)]


def cli(argv: list[str]) -> None:
    """One ``stepplan`` command in this process; a refusal ends the benchmark."""
    from stepplan.sim.cli import main

    code = main(argv)
    gc.collect()  # a live command's engine, before the next one builds its own
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if code != 0:
        raise SystemExit(f"graph_sizes_live: `stepplan {' '.join(argv)}` exited {code}")


def costs_of(folder: Path, profile: Path, largest: int) -> tuple[Any, Any]:
    """A run's step demand and its step costs from ``profile``."""
    from stepplan.sim.cli.buckets import run_config, run_costs, run_demand
    from stepplan.sim.results.sim_result import read_step_shapes

    results = read_step_shapes(folder)
    config = run_config(results)
    demand = run_demand(results, config)
    costs, _ = run_costs(demand, config, SimpleNamespace(profile=str(profile), largest=largest))
    return demand, costs


def measured_total_s(folder: Path) -> tuple[float, int]:
    """Total step time (s) of a run's steps and their count (``steps.csv``)."""
    from stepplan.sim.results.sim_result import iter_steps

    total, steps = 0.0, 0
    for chunk in iter_steps(folder, ["duration_s"]):
        column = np.asarray(chunk.column("duration_s"), dtype=np.float64)
        total, steps = total + float(column.sum()), steps + column.size
    return total, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--model", help="model preset (default: hybrid-8b on cuda, tiny on cpu)")
    parser.add_argument("--trace", type=Path, default=BUNDLED_TRACE)
    parser.add_argument("--start-s", type=float, default=1800.0, help="slice start (trace time)")
    parser.add_argument("--requests", type=int, default=120, help="requests in the slice")
    parser.add_argument("--num-spec-tokens", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3, help="profile repeats per shape")
    parser.add_argument("--profile", type=Path, help="an engine profile to use (no profiling)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/graph_sizes_live"))
    parser.add_argument("--record", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    args.model = args.model or ("hybrid-8b" if args.live_device == "cuda" else "tiny")
    import torch

    if args.live_device == "cuda" and not torch.cuda.is_available():
        print("graph_sizes_live: --live-device cuda, but torch sees no CUDA device "
              "(use --live-device cpu for the tiny end-to-end check)")  # fmt: skip
        return 2
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    from stepplan.planner import default_graph_sizes
    from stepplan.sim.buckets.demand import sglang_default_graph_sizes
    from stepplan.sim.timing.engine_profile import read_engine_profile

    vllm = [s for s in default_graph_sizes(args.max_num_seqs, args.num_spec_tokens)
            if s <= args.max_num_seqs]  # fmt: skip
    # 1. The profile, with graph memory where there are graphs.
    profile = args.profile
    if profile is None:
        profile = args.out / "profile.json"
        sglang = sglang_default_graph_sizes(args.max_num_seqs, args.num_spec_tokens > 0)
        sizes = ",".join(map(str, sorted({*vllm, *sglang})))
        cli(["profile", "--out", str(profile), "--overwrite", "--quiet", "--repeats",
             str(args.repeats), "--graph-sizes", sizes, *setting_args(args)])  # fmt: skip
    profile_s = time.perf_counter() - started
    if args.live_device != "cuda":
        print("graph memory: no CUDA graphs on the cpu device; lists compared by graph count")
    elif not read_engine_profile(profile).graph_mib:
        print(f"graph memory: {profile} has no graph_memory figures; lists compared by count")
    # 2. The slice simulated with the profile's times; the optimizer's list.
    from stepplan.sim.buckets.bucket_table import compare_times

    chosen_run = args.out / "predicted"
    cli(["simulate", *slice_args(args), *setting_args(args), "--profile", str(profile),
         "--out", str(chosen_run), "--overwrite", "--quiet"])  # fmt: skip
    demand, costs = costs_of(chosen_run, profile, args.max_num_seqs)
    vllm_row = compare_times(demand, costs, max_graphs=len(vllm)).rows[0]
    comparison = compare_times(demand, costs, max_graphs=len(vllm), memory_mib=vllm_row.memory_mib)
    chosen = list(comparison.rows[len(comparison.references)].score.sizes)
    # 3. Both lists served by the live engine, step times measured.
    runs: dict[str, dict[str, Any]] = {}
    for name, sizes in (("vllm_default", vllm), ("optimizer", chosen)):
        folder = args.out / name
        serve_start = time.perf_counter()
        cli(["simulate", *slice_args(args), *setting_args(args), "--profile", str(profile),
             "--graph-sizes", ",".join(map(str, sizes)), "--live", "--live-time", "measured",
             "--out", str(folder), "--overwrite", "--quiet"])  # fmt: skip
        measured_s, steps = measured_total_s(folder)
        run_demand, run_costs = costs_of(folder, profile, args.max_num_seqs)
        from stepplan.sim.buckets.bucket_time import predict

        prediction = predict(run_demand, run_costs, sizes)
        runs[name] = {
            "graph_sizes": sizes,
            "steps": steps,
            "measured_total_s": measured_s,
            "predicted_total_s": prediction.total_s,
            "graph_memory_mib": prediction.memory_mib,
            "serve_wall_s": time.perf_counter() - serve_start,
        }
    # 4. The comparison.
    base, mine = runs["vllm_default"], runs["optimizer"]
    measured_gain = mine["measured_total_s"] - base["measured_total_s"]
    predicted_gain = mine["predicted_total_s"] - base["predicted_total_s"]
    figures = {
        "measured_difference_s": measured_gain,
        "predicted_difference_s": predicted_gain,
        "gap_share_of_total": abs(measured_gain - predicted_gain) / base["measured_total_s"],
        "within_5_percent": abs(measured_gain - predicted_gain) <= 0.05 * base["measured_total_s"],
        "predicted_difference_on_the_simulated_slice_s": (
            comparison.rows[len(comparison.references)].total_s - vllm_row.total_s
        ),
        "profile_wall_s": profile_s,
        "total_wall_s": time.perf_counter() - started,
    }
    record = {
        "benchmark": "graph_sizes_live",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_record(args.live_device),
        "command": " ".join(["python", "bench/graph_sizes_live.py", *sys.argv[1:]]),
        **commit_record(),
        "setup": {
            "model": args.model,
            "trace": str(args.trace),
            "start_s": args.start_s,
            "requests": args.requests,
            "num_spec_tokens": args.num_spec_tokens,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "profile": str(profile),
            "graph_memory_measured": bool(read_engine_profile(profile).graph_mib),
        },
        "runs": runs,
        "figures": figures,
    }
    args.record.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H%M%S")
    path = args.record / f"graph_sizes_live-{stamp}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    for name, run in runs.items():
        sizes, measured_s = len(run["graph_sizes"]), run["measured_total_s"]
        print(f"{name:>13}: {sizes} sizes, measured {measured_s:.3f} s, predicted "
              f"{run['predicted_total_s']:.3f} s over {run['steps']:,} steps")  # fmt: skip
    print(f"difference (optimizer - vLLM): measured {measured_gain:+.4f} s, predicted "
          f"{predicted_gain:+.4f} s; gap {figures['gap_share_of_total']:.2%} of the total "
          f"({'within' if figures['within_5_percent'] else 'over'} 5%)")  # fmt: skip
    print(f"record: {path} ({figures['total_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
