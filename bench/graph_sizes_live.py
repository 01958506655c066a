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
import gc
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from bench_record import record_run

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_TRACE = ROOT / "sim" / "data" / "azure_llm_2023_code.csv"


def given_commit(commit: str | None) -> dict[str, Any]:
    """The record's commit keys where ``--commit`` gives one (they stand over git's: a
    device's copy of the checkout reported an old commit); none otherwise."""
    if not commit:
        return {}
    return {"commit": commit, "commit_source": "--commit", "dirty": None}


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


#: Step kinds the comparison splits the totals by.
STEP_KINDS = ("uniform_graph", "uniform_eager", "prefill", "mixed", "empty")


def _step_kinds(spec: np.ndarray, decode: np.ndarray, prefill: np.ndarray, graph: np.ndarray):
    """``[S]`` index into :data:`STEP_KINDS` of steps with these live rows per kind and
    whether each replays a graph (``[S]`` each)."""
    uniform = np.where(graph, 0, 1)
    kind = np.where(prefill > 0, np.where(spec + decode > 0, 3, 2), uniform)
    return np.where(spec + decode + prefill == 0, 4, kind)


def kind_split(folder: Path, demand: Any, step_us: np.ndarray, sizes: list[int]) -> dict:
    """Measured (``steps.csv``) and predicted total step time and steps per step kind."""
    from stepplan.sim.results.sim_result import iter_steps

    names = ["duration_s", "num_spec_rows", "num_decode_rows", "num_prefill_rows", "graph_hit"]
    measured, measured_steps = np.zeros(len(STEP_KINDS)), np.zeros(len(STEP_KINDS))
    for chunk in iter_steps(folder, names):
        spec, decode, prefill, hit = (np.asarray(chunk.column(n)) for n in names[1:])
        kind = _step_kinds(spec, decode, prefill, hit > 0)
        duration = np.asarray(chunk.column("duration_s"), np.float64)
        measured += np.bincount(kind, weights=duration, minlength=len(STEP_KINDS))
        measured_steps += np.bincount(kind, minlength=len(STEP_KINDS))
    rows = [s for s in sizes if s <= demand.max_num_seqs]
    graph = demand.uniform & (demand.need <= max(rows, default=0))
    kind = _step_kinds(*demand.kind_rows, graph)
    counts = demand.counts.astype(np.float64)
    predicted = np.bincount(kind, weights=step_us * counts * 1e-6, minlength=len(STEP_KINDS))
    predicted_steps = np.bincount(kind, weights=counts, minlength=len(STEP_KINDS))
    split = {}
    for i, name in enumerate(STEP_KINDS):
        split[name] = {
            "measured_steps": int(measured_steps[i]),
            "measured_s": float(measured[i]),
            "predicted_steps": int(predicted_steps[i]),
            "predicted_s": float(predicted[i]),
        }
    return split


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
    parser.add_argument("--commit", help="the commit to record (where git's metadata is stale)")
    parser.add_argument(
        "--acceptance-length",
        type=float,
        help="mean acceptance length the list is chosen for (the live model's: a model of "
        "random weights accepts about no drafts, 1.0); default: the simulator's",
    )
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
    # The live model's acceptance, where given: its choice is for the steps it will serve.
    accepted = []
    if args.acceptance_length is not None:
        length = f"acceptance.length={args.acceptance_length}"
        accepted = ["--set", "acceptance.model=fixed", "--set", length]
    cli(["simulate", *slice_args(args), *setting_args(args), "--profile", str(profile),
         *accepted, "--out", str(chosen_run), "--overwrite", "--quiet"])  # fmt: skip
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
            "row_context_tokens": run_demand.row_context,
            "by_step_kind": kind_split(folder, run_demand, prediction.step_us, sizes),
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
    extra: dict[str, Any] = {
        "setup": {
            "model": args.model,
            "trace": str(args.trace),
            "start_s": args.start_s,
            "requests": args.requests,
            "num_spec_tokens": args.num_spec_tokens,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "profile": str(profile),
            "acceptance_length": args.acceptance_length,
            "graph_memory_measured": bool(read_engine_profile(profile).graph_mib),
        },
        "runs": runs,
        **given_commit(args.commit),
    }
    path = record_run("graph_sizes_live", figures, folder=args.record, **extra)
    for name, run in runs.items():
        sizes, measured_s = len(run["graph_sizes"]), run["measured_total_s"]
        print(f"{name:>13}: {sizes} sizes, measured {measured_s:.3f} s, predicted "
              f"{run['predicted_total_s']:.3f} s over {run['steps']:,} steps")  # fmt: skip
        for kind, part in run["by_step_kind"].items():
            if part["measured_steps"] or part["predicted_steps"]:
                print(f"{kind:>27}: measured {part['measured_s']:.3f} s over "
                      f"{part['measured_steps']:,} steps, predicted {part['predicted_s']:.3f} s "
                      f"over {part['predicted_steps']:,}")  # fmt: skip
    print(f"difference (optimizer - vLLM): measured {measured_gain:+.4f} s, predicted "
          f"{predicted_gain:+.4f} s; gap {figures['gap_share_of_total']:.2%} of the total "
          f"({'within' if figures['within_5_percent'] else 'over'} 5%)")  # fmt: skip
    print(f"record: {path} ({figures['total_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
