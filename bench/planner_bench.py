"""Host time of the planner per step: StepBatch validation (compiled check, and numpy's in
column ``numpy validate``, as where the extension is not installed), compile_plan (compile +
pack), and the same step through a kept ``Planner``, which packs with the compiled packer
(column ``path`` says whether the extension is installed: ``native``, else ``numpy``), and
through a kept ``Planner(native=False)`` (compile_plan's numpy packing).

Each case is a stream of >= 1000 distinct steps (fresh slots, accepted counts and
draft counts each step, as an engine would hand over; mixed steps also vary their
spec/decode split and their prefill rows and lengths), 4 layer groups. Validation,
compile_plan and each Planner are timed in a loop of their own over the same
batches. Prints p50 and p90 in microseconds, and the seed builder's per-step cost
for the same number of layer groups (SPEC §4: 250 µs pure spec, ~900 µs mixed, per
group, H200 host CPU). The last case alternates spec 256 x 4 and mixed 256 steps.

    python bench/planner_bench.py [--steps 2000] [--groups 4]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
from bench_record import record_run

from stepplan.planner import Planner, PlannerConfig, StepBatch, compile_plan
from stepplan.planner import batch as batch_module

NUM_SPEC_TOKENS = 3  # Q = 4
SEED_US_PER_GROUP = {"spec": 250.0, "decode": 250.0, "mixed": 900.0}


def step_inputs(
    rng: np.random.Generator, spec: int, decode: int, prefills: tuple[int, ...], groups: int
) -> dict:
    """One step's engine arrays: spec and decode rows interleaved at random, prefills last
    (vLLM's reorder puts decode-like rows first but does not separate spec from decode).

    A mixed step (``prefills`` given) draws its split like an engine's steps vary:
    ``spec / 2 ..  3 spec / 2`` spec rows of the ``spec + decode`` decode-like ones,
    ``1 .. len(prefills)`` prefill rows of ``2 .. 2 mean`` tokens each.
    """
    if prefills:
        decode_like = spec + decode
        spec = int(rng.integers(spec // 2, min(decode_like, spec * 3 // 2) + 1))
        decode = decode_like - spec
        mean = sum(prefills) // len(prefills)
        count = int(rng.integers(1, len(prefills) + 1))
        prefills = tuple(rng.integers(2, 2 * mean + 1, count).tolist())
    rows = spec + decode + len(prefills)
    is_spec = np.zeros(spec + decode, dtype=bool)
    is_spec[rng.choice(spec + decode, spec, replace=False)] = True
    drafts = np.where(is_spec, rng.integers(0, NUM_SPEC_TOKENS + 1, spec + decode), -1)
    drafts = np.concatenate([drafts, np.full(len(prefills), -1)]).astype(np.int32)
    query_lens = np.where(drafts >= 0, drafts + 1, 1).astype(np.int32)
    query_lens[spec + decode :] = prefills
    pool = rng.permutation(np.arange(1, groups * rows * 2 + 1, dtype=np.int32))
    return dict(
        query_lens=query_lens,
        num_computed_tokens=rng.integers(0, 4000, rows).astype(np.int32),
        slots=pool[: groups * rows].reshape(groups, rows),
        num_draft_tokens=drafts,
        num_accepted_tokens=rng.integers(1, NUM_SPEC_TOKENS + 2, rows).astype(np.int32),
    )


CASES = {
    "spec 1 x 4": [("spec", 1, 0, ())],
    "spec 4 x 4": [("spec", 4, 0, ())],
    "spec 64 x 4": [("spec", 64, 0, ())],
    "spec 256 x 4": [("spec", 256, 0, ())],
    "decode 256": [("decode", 0, 256, ())],
    "mixed 64": [("mixed", 32, 30, (700, 700))],
    "mixed 256": [("mixed", 128, 126, (700, 700))],
    "spec/mixed 256": [("spec", 256, 0, ()), ("mixed", 128, 126, (700, 700))],
}


def timed(step: Callable[[object], object], items: list) -> np.ndarray:
    """``[len(items)], float64`` microseconds of ``step(item)``, item by item."""
    clock, ns = time.perf_counter_ns, []
    for item in items:
        t0 = clock()
        step(item)
        ns.append(clock() - t0)
    return np.array(ns) / 1e3


def time_case(
    inputs: list[dict], config: PlannerConfig, planner: Planner, numpy_planner: Planner
) -> dict[str, np.ndarray]:
    """Per-step microseconds of validation, compile_plan, ``planner`` and ``numpy_planner``,
    each its own loop."""
    batch_us = timed(lambda kw: StepBatch(**kw), inputs)
    with mock.patch.object(batch_module, "native_check", lambda: None):  # numpy checks
        numpy_batch_us = timed(lambda kw: StepBatch(**kw), inputs)
    batches = [StepBatch(**kw) for kw in inputs]
    compile_us = timed(lambda batch: compile_plan(batch, config), batches)
    planner_us = timed(planner.compile, batches)
    numpy_us = timed(numpy_planner.compile, batches)
    return {
        "batch": batch_us,
        "numpy batch": numpy_batch_us,
        "compile": compile_us,
        "total": batch_us + compile_us,
        "planner": planner_us,
        "numpy": numpy_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--graph-mode", default="full", choices=("none", "full", "mixed"))
    args = parser.parse_args()
    config = PlannerConfig(num_spec_tokens=NUM_SPEC_TOKENS, graph_mode=args.graph_mode)
    rng = np.random.default_rng(0)
    print(
        f"# planner host time per step, {args.groups} layer groups, Q = 4, "
        f"graph mode {args.graph_mode}; {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}, numpy {np.__version__}"
    )
    header = (
        f"{'case':<14} {'compile+pack p50':>16} {'p90':>7} {'validate p50':>13} {'p90':>7} "
        f"{'total p50':>10} {'p90':>7} {'seed (all groups)':>18} {'speed-up':>9} "
        f"{'Planner p50':>12} {'p90':>7} {'path':>6} {'numpy Planner p50':>18} {'p90':>7} "
        f"{'numpy validate p50':>19} {'p90':>7}"
    )
    print(header)
    figures = {}
    for name, kinds in CASES.items():
        inputs = [
            step_inputs(rng, *kinds[step % len(kinds)][1:], args.groups)
            for step in range(args.steps)
        ]
        planner, numpy_planner = Planner(config), Planner(config, native=False)
        time_case(inputs[:200], config, planner, numpy_planner)  # warm-up
        times = time_case(inputs, config, planner, numpy_planner)
        p = {k: np.percentile(v, [50, 90]) for k, v in times.items()}
        seed = np.mean([SEED_US_PER_GROUP[kind] for kind, *_ in kinds]) * args.groups
        print(
            f"{name:<14} {p['compile'][0]:>16.1f} {p['compile'][1]:>7.1f} "
            f"{p['batch'][0]:>13.1f} {p['batch'][1]:>7.1f} "
            f"{p['total'][0]:>10.1f} {p['total'][1]:>7.1f} "
            f"{seed:>18.0f} {seed / p['total'][0]:>8.0f}x "
            f"{p['planner'][0]:>12.1f} {p['planner'][1]:>7.1f} "
            f"{'native' if planner.native else 'numpy':>6} "
            f"{p['numpy'][0]:>18.1f} {p['numpy'][1]:>7.1f} "
            f"{p['numpy batch'][0]:>19.1f} {p['numpy batch'][1]:>7.1f}"
        )
        figures[name.replace(" ", "_")] = {
            f"{key.replace(' ', '_')}_p{q}_us": float(p[key][i])
            for key in times
            for i, q in enumerate((50, 90))
        } | {"seed_all_groups_us": float(seed), "native_planner": planner.native}
    headline = [f"{case}.planner_p50_us" for case in ("spec_256_x_4", "mixed_256")]
    record_run(
        "planner_bench", figures, groups=args.groups, graph_mode=args.graph_mode, headline=headline
    )


if __name__ == "__main__":
    main()
