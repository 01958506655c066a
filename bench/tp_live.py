"""The live engine at tensor parallelism 1 and N on a slice of a real trace: wall time,
steps and tokens, and whether every rank generated the single-rank engine's tokens.

    python bench/tp_live.py                       # tiny model, CPU, gloo, TP 1 and 2
    python bench/tp_live.py --device cuda --preset hybrid-1b --backend triton --tensor 2

The first ``--requests`` requests of ``--trace`` (Azure's code trace by default) give the
prompt and output lengths, each capped (``--max-prompt``, ``--max-new``) to what the model
serves in a benchmark's time; prompt tokens are seeded random ids. Each degree runs in its
own processes (:func:`stepplan.executor.engine.launch_ranks`: gloo between CPU processes,
NCCL between GPUs; ``--threads`` torch threads per rank, one by default: the tiny
model's steps are too small for intra-op threads to pay, and on a shared host they make
a rank wait on a descheduled thread), serves the slice
once to warm up (Triton compiles, graphs are captured), then ``--repeats`` times timed:
median wall time (the slowest rank's) and the process's CPU time per rank. The record
(date, device, command, commit, figures) goes to ``bench/results/tp_live-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_record import command_line, record_run

from stepplan.executor.engine import Engine, EngineConfig, launch_ranks
from stepplan.executor.model import HybridModelRunner, ModelShape
from stepplan.planner import PlannerConfig
from stepplan.sim.settings.presets import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "sim" / "data" / "azure_llm_2023_code.csv"
SPEC_TOKENS = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE, help="a CSV of Azure's columns")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=48, help="prompt tokens at most")
    parser.add_argument("--max-new", type=int, default=16, help="generated tokens at most")
    parser.add_argument("--preset", default="tiny", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default="reference", choices=("reference", "triton"))
    parser.add_argument("--tensor", type=int, default=2, help="the degree to compare with 1")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (the median)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per rank, at either degree"
    )
    parser.add_argument("--record", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def trace_slice(path: Path, requests: int, max_prompt: int, max_new: int) -> list[tuple[int, int]]:
    """``(prompt tokens, new tokens)`` of the first ``requests`` rows, each capped."""
    with path.open(newline="") as handle:
        rows = csv.DictReader(handle)
        lengths = []
        for row in rows:
            if len(lengths) == requests:
                break
            prompt, new = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            lengths.append((max(1, min(prompt, max_prompt)), max(1, min(new, max_new))))
    return lengths


def prompts_of(shape: ModelShape, lengths: list[tuple[int, int]]) -> list[list[int]]:
    """Seeded random prompt ids of the slice's prompt lengths (the same on every rank)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, shape.vocab_size, n).tolist() for n, _ in lengths]


def serve(rank: int, tensor: int, args: argparse.Namespace, lengths: list) -> dict:
    """One rank: build the engine at ``tensor`` ranks, serve the slice twice, time the second."""
    shape = ModelShape(**MODEL_PRESETS[args.preset], seed=0)
    prompts, new = prompts_of(shape, lengths), [n for _, n in lengths]
    device = f"cuda:{rank}" if args.device == "cuda" else "cpu"
    planner = PlannerConfig(num_spec_tokens=SPEC_TOKENS, graph_mode="mixed", max_num_seqs=8)
    runner = HybridModelRunner(
        shape,
        planner,
        num_slots=len(lengths) + 1,
        max_len=args.max_prompt + args.max_new,
        device=device,
        backend=args.backend,
        tensor_parallel=tensor,
    )
    config = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        prefill_chunk_tokens=32,
        num_spec_tokens=SPEC_TOKENS,
    )
    engine = Engine(runner, config)
    engine.generate(prompts, new)  # warm-up: compiles, captures, fills the caches
    walls, cpus = [], []
    for _ in range(args.repeats):
        start, cpu = time.perf_counter(), time.process_time()
        tokens = engine.generate(prompts, new)
        if args.device == "cuda":
            torch.cuda.synchronize(device)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return {
        "tokens": tokens,
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "steps": engine.stats.steps,
    }


def shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.tensor < 2:
        print(f"tp_live: --tensor must be at least 2, got {args.tensor}", file=sys.stderr)
        raise SystemExit(2)
    if args.backend == "triton" and args.device == "cpu" and not os.environ.get("TRITON_INTERPRET"):
        print("tp_live: --backend triton on the CPU needs TRITON_INTERPRET=1", file=sys.stderr)
        raise SystemExit(2)
    lengths = trace_slice(args.trace, args.requests, args.max_prompt, args.max_new)
    runs = {
        t: launch_ranks(t, serve, (t, args, lengths), args.device, args.threads)
        for t in (1, args.tensor)
    }
    single = runs[1][0]
    ranks = runs[args.tensor]
    mismatched = sum(
        a != b for rank in ranks for a, b in zip(rank["tokens"], single["tokens"], strict=True)
    )
    generated = sum(len(t) for t in single["tokens"])
    figures = {
        "requests": len(lengths),
        "prompt_tokens": sum(n for n, _ in lengths),
        "generated_tokens": generated,
        "steps": single["steps"],
        "tp1_wall_s": single["wall_s"],
        f"tp{args.tensor}_wall_s": max(rank["wall_s"] for rank in ranks),
        "tp1_cpu_s": single["cpu_s"],
        f"tp{args.tensor}_cpu_s_per_rank": max(rank["cpu_s"] for rank in ranks),
        "tp1_generated_tokens_per_s": generated / single["wall_s"],
        f"tp{args.tensor}_generated_tokens_per_s": generated / max(r["wall_s"] for r in ranks),
        "mismatched_requests": mismatched,
        # Two row-parallel projections a layer (the mixer's, the MLP's): one sum each.
        "all_reduces_per_step": 2 * len(MODEL_PRESETS[args.preset]["layer_kinds"]),
    }
    interpreted = ["TRITON_INTERPRET=1"] if os.environ.get("TRITON_INTERPRET") else []
    # The ranks span several GPUs: the machine names how many.
    machine = None
    if args.device == "cuda":
        machine = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    print(json.dumps(figures, indent=1))
    record_run(
        "tp_live",
        figures,
        machine=machine,
        folder=args.record,
        # The interpreter's switch is part of what ran: it overrides the writer's command.
        command=" ".join([*interpreted, command_line(argv)]),
        settings={
            "preset": args.preset,
            "backend": args.backend,
            "device": args.device,
            "trace": shown(args.trace),
            "max_prompt": args.max_prompt,
            "max_new": args.max_new,
            "process_group": "nccl" if args.device == "cuda" else "gloo",
            "threads_per_rank": args.threads,
            "repeats": args.repeats,
        },
    )


if __name__ == "__main__":
    main()
