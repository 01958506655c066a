"""Hybrid model engine benchmark (CUDA GPU): the full-size model's step time, eager and graphed.

Builds a preset (default ``hybrid-8b``, bf16, about 8.4e9 parameters) at full size with
seeded random weights and a KV cache of ``--slots`` x ``--max-len`` positions, captures
the CUDA graphs of every step's bucket, then times representative steps:

- ``spec``: ``--rows`` requests x 4 tokens (3 drafts) at contexts of about 1-4k;
- ``decode``: ``--rows`` requests at contexts of about 1-4k;
- ``prefill``: one chunk of ``--prefill`` tokens after a first chunk as long;
- ``mixed``: half the rows spec, the rest decodes, one of them a 512-token prefill.

Each step runs ``--repeats`` times eagerly (a plan of graph mode ``none``: exactly the live
tokens) and graphed (the planner's bucket, one replay), through ``timed_run``: CUDA-event
GPU time, host wall time with the device synchronized at both ends, and host launch
time, medians of the repeats. The KV cache and conv state hold zeros at the fake
contexts; the work is the same. Before timing, each step runs from one saved conv state
three ways: replayed, its graph plan eagerly (same shapes), and its eager plan; the
shares of greedy tokens that agree with the replay are printed (bf16: shapes that
differ may round differently). Peak GPU memory closes the table.

Run: ``python3 bench/model_bench.py`` (``--preset hybrid-1b`` for a quicker run;
``--preset tiny --device cpu --slots 5 --max-len 64`` runs the same code on the CPU).
The default 257 slots x 4096 positions hold 256 rows at 4k contexts in the same 64 GiB
of KV cache as 129 x 8192 would.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import attrs
import numpy as np
import torch
from bench_record import record_run

from stepplan.executor.model import HybridModelRunner, ModelShape, sample_positions
from stepplan.planner import ExecutionPlan, Planner, PlannerConfig, StepBatch, default_graph_sizes
from stepplan.sim.settings.presets import MODEL_PRESETS

SPEC_TOKENS = 3
Q = SPEC_TOKENS + 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="hybrid-8b", choices=sorted(MODEL_PRESETS))
    parser.add_argument("--no-record", action="store_true", help="write no record")
    parser.add_argument("--slots", type=int, default=257, help="KV/conv slots, 0 (NULL) included")
    parser.add_argument("--max-len", type=int, default=4096, help="KV positions per slot")
    parser.add_argument("--rows", type=int, default=None, help="rows per step (min(256, slots-1))")
    parser.add_argument("--prefill", type=int, default=2048, help="tokens of the prefill chunk")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    return parser.parse_args(argv)


def planner_config(rows: int) -> PlannerConfig:
    """Mixed graphs; vLLM's default sizes plus 1024 and 2048 tokens, so the prefill and
    mixed steps replay a graph too."""
    sizes = (*default_graph_sizes(rows, SPEC_TOKENS), 1024, 2048)
    return PlannerConfig(
        num_spec_tokens=SPEC_TOKENS, graph_mode="mixed", graph_sizes=sizes, max_num_seqs=rows
    )


@attrs.frozen(eq=False)
class BenchStep:
    name: str
    batch: StepBatch
    token_ids: np.ndarray  # [tokens] int64
    sample_index: np.ndarray  # [samples] int64


def _step(rng, name, q, computed, drafts, vocab) -> BenchStep:
    q, computed, drafts = (np.asarray(a, np.int32) for a in (q, computed, drafts))
    order = rng.permutation(len(q))  # kinds interleaved, as an engine hands them over
    q, computed, drafts = q[order], computed[order], drafts[order]
    batch = StepBatch(
        query_lens=q,
        num_computed_tokens=computed,
        slots=np.arange(1, len(q) + 1, dtype=np.int32),
        num_draft_tokens=drafts,
        num_accepted_tokens=np.where(drafts >= 0, rng.integers(1, Q + 1, len(q)), 1).astype(
            np.int32
        ),
    )
    ids = rng.integers(0, vocab, batch.num_tokens, dtype=np.int64)
    return BenchStep(name, batch, ids, sample_positions(batch))


def make_steps(rng: np.random.Generator, *, rows: int, max_len: int, prefill: int, vocab: int):
    """The four representative steps, slots ``1..rows``."""
    low, high = min(1000, max_len // 4), min(4000, max_len - Q)
    contexts = rng.integers(low, high, rows)
    chunk = min(prefill, max_len // 2)
    spec, decode = rows // 2, rows - rows // 2 - 1
    mixed_prefill = min(512, max_len)
    return [
        _step(rng, f"spec {rows}x{Q}", [Q] * rows, contexts, [SPEC_TOKENS] * rows, vocab),
        _step(rng, f"decode {rows}", [1] * rows, contexts, [-1] * rows, vocab),
        _step(rng, f"prefill {chunk}", [chunk], [chunk], [-1], vocab),
        _step(
            rng,
            f"mixed {spec}x{Q}+{decode}+{mixed_prefill}",
            [Q] * spec + [1] * decode + [mixed_prefill],
            [*contexts[:spec], *contexts[spec : spec + decode], 0],
            [SPEC_TOKENS] * spec + [-1] * (decode + 1),
            vocab,
        ),
    ]


def _median_times(runner: HybridModelRunner, plan: ExecutionPlan, step: BenchStep, repeats: int):
    timings = [runner.timed_run(plan, step.token_ids, step.sample_index)[1] for _ in range(repeats)]
    gpu = [t.gpu_s for t in timings if t.gpu_s is not None]
    return {
        "wall_ms": 1e3 * statistics.median(t.wall_s for t in timings),
        "host_ms": 1e3 * statistics.median(t.host_s for t in timings),
        "gpu_ms": 1e3 * statistics.median(gpu) if gpu else float("nan"),
    }


def agreement(runner: HybridModelRunner, graph_plan, eager_plan, step: BenchStep):
    """Shares of greedy tokens equal to the graph plan's run (replayed where graphs are
    on): for the graph plan run eagerly and for the eager plan, each from the same state."""
    saved = runner.conv_state_memory.clone()

    def from_saved(run):
        runner.conv_state_memory.copy_(saved)
        return run()

    ids, samples = step.token_ids, step.sample_index
    graphed = from_saved(lambda: runner.run_plan(graph_plan, ids, samples))
    same = from_saved(lambda: runner.logits(graph_plan, ids, samples).argmax(-1).cpu().numpy())
    eager = from_saved(lambda: runner.run_plan(eager_plan, ids, samples))
    runner.conv_state_memory.copy_(saved)
    return float(np.mean(graphed == same)), float(np.mean(graphed == eager))


def run_bench(runner: HybridModelRunner, steps: list[BenchStep], repeats: int) -> list[dict]:
    """One row per step: sizes, bucket, eager and graphed medians, greedy agreement."""
    eager_planner = Planner(attrs.evolve(runner.planner.config, graph_mode="none"))
    plans = [(runner.planner.compile(s.batch), eager_planner.compile(s.batch)) for s in steps]
    runner.warm_up([graph for graph, _ in plans])
    results = []
    for step, (graph_plan, eager_plan) in zip(steps, plans, strict=True):
        runner.run_plan(eager_plan, step.token_ids, step.sample_index)  # compiles its kernels
        same, eager_share = agreement(runner, graph_plan, eager_plan, step)
        results.append(
            {
                "step": step.name,
                "tokens": step.batch.num_tokens,
                "bucket": str(graph_plan.graph) if graph_plan.graph else "eager",
                "eager": _median_times(runner, eager_plan, step, repeats),
                "graph": _median_times(runner, graph_plan, step, repeats),
                "agree_same_plan": same,
                "agree_eager_plan": eager_share,
            }
        )
    return results


def print_table(results: list[dict]) -> None:
    head = (
        f"{'step':<24} {'tokens':>6} {'eager gpu':>9} {'eager wall':>10} {'graph gpu':>9} "
        f"{'graph wall':>10} {'graph host':>10} {'agree same':>10} {'agree eager':>11}  bucket"
    )
    print(head)
    for r in results:
        e, g = r["eager"], r["graph"]
        print(
            f"{r['step']:<24} {r['tokens']:>6} {e['gpu_ms']:>9.3f} {e['wall_ms']:>10.3f} "
            f"{g['gpu_ms']:>9.3f} {g['wall_ms']:>10.3f} {g['host_ms']:>10.3f} "
            f"{r['agree_same_plan']:>10.1%} {r['agree_eager_plan']:>11.1%}  {r['bucket']}"
        )
    print("(times in ms, medians; agree: share of greedy tokens equal to the graph replay's)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("model_bench: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    rows = args.rows or min(256, args.slots - 1)
    if not 1 <= rows < args.slots:
        print(f"model_bench: --rows {rows} needs --slots > {rows}", file=sys.stderr)
        return 2
    shape = ModelShape(**MODEL_PRESETS[args.preset], seed=args.seed)
    start = time.perf_counter()
    try:
        runner = HybridModelRunner(
            shape,
            planner_config(rows),
            num_slots=args.slots,
            max_len=args.max_len,
            device=device,
            backend="triton" if device.type == "cuda" else "reference",
        )
    except ValueError as error:
        print(f"model_bench: {error}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    built = time.perf_counter() - start
    print(
        f"{args.preset}: {shape.num_params:,} parameters, {args.slots} slots x "
        f"{args.max_len} positions, built in {built:.1f} s on {device}"
    )
    steps = make_steps(
        np.random.default_rng(args.seed),
        rows=rows,
        max_len=args.max_len,
        prefill=args.prefill,
        vocab=shape.vocab_size,
    )
    results = run_bench(runner, steps, args.repeats)
    print_table(results)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        print(f"peak GPU memory {peak:.1f} GiB; {len(runner.captured_graphs)} graphs captured")
    figures = {
        f"{r['step']}": {
            f"{how}_{key}": r[how][key] for how in ("eager", "graph") for key in r[how]
        }
        | {"tokens": r["tokens"], "agree_same_plan": r["agree_same_plan"]}
        for r in results
    }
    if not args.no_record:
        record_run("model_bench", figures, preset=args.preset, device_kind=device.type)
    return 0


if __name__ == "__main__":
    sys.exit(main())
