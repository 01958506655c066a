"""Where the first layer group's build of a new step spends its host time, piece by piece.

``vllm_builder_bench.py`` times whole builds. This bench times the pieces of one: it
runs the first group's path for a new step (``PlanMetadataBuilder.build`` ->
``StepShare.open`` -> ``StepShare._compile``) statement by statement, through the same
calls in the same order, with a timestamp between each (``perf_counter_ns``, about 50 ns
each), on the same fresh steps and inputs as ``vllm_builder_bench.py``'s ``idle`` and
``busy`` modes. Per round it prints the p50 of each piece, their sum, and the p50 of
whole builds timed in the same round, so the pieces' share of a build shows where
a host's time goes. The pieces:

- ``views``: the two host tensors as the packer reads them (``StepShare.host_views``);
- ``bytes``: their bytes and live tokens, one native call (``Planner.host_bytes``);
- ``key``: the step's key and device inputs;
- ``claim``, ``spaces``: a staging entry and its plan and summary regions;
- ``pack``: the plan packed into the entry (``Planner.pack_host_step``, native);
- ``keys``: the revision's counts and part keys (``Revision.counts_and_keys``);
- ``record``: the builder's plan record and its views;
- ``stage``: the header words and the ticket;
- ``open``: the opening launch (on a CUDA device: a graph replay once its arguments
  recur; with ``--host-only``, nothing);
- ``step``, ``meta``: the step record and the metadata tuple.

The replayed path's metadata is checked against a real build's for the same step
(``--smoke`` and the tests), so a change to the builder that this copy of its sequence
misses shows as a failure, not as wrong figures.

    python3 bench/vllm_builder_parts.py [--batch "mixed 256"] [--rounds 3] [--builds 300]
    python3 bench/vllm_builder_parts.py --smoke   # tiny, on the CPU: no timing claims
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time
from typing import Any

import torch
import vllm_builder_bench as bench
from bench_record import record_run

from stepplan.executor.vllm import host_inputs, step_share
from stepplan.executor.vllm.builder import PlanMetadataBuilder
from stepplan.planner import PlannerConfig

PIECES = (
    "views", "bytes", "key", "claim", "spaces", "pack", "keys", "record", "stage", "open",
    "step", "meta",
)  # fmt: skip
_clock = time.perf_counter_ns


def replayed_build(builder: PlanMetadataBuilder, m: Any, kwargs: dict) -> tuple[Any, list[int]]:
    """The first group's build of a new step, as ``build`` makes it, and ns per piece.

    Only for a builder of group 0 whose config speculates, on a step that packs a new
    plan (fresh host data) and takes the accepted counts on the device: the path the
    bench times."""
    share, group = builder.share, builder.group
    buffer, planner = share.buffer, share._planner
    accepted, drafts = kwargs["num_accepted_tokens"], kwargs["num_decode_draft_tokens_cpu"]
    marks = [_clock()]
    rows = m.num_reqs
    starts, drafts_view = share.host_views(m.query_start_loc_cpu, drafts)
    marks.append(_clock())
    host = share.host_bytes(starts, drafts_view, rows, None)
    marks.append(_clock())
    key = (rows, m.num_actual_tokens, host, None)
    device_inputs = (m.query_start_loc, m.seq_lens, accepted)
    marks.append(_clock())
    index = buffer.claim()
    marks.append(_clock())
    plan, summary = buffer.spaces(index)
    marks.append(_clock())
    shape = planner.pack_host_step(
        plan, starts, drafts_view, rows,
        num_padded_tokens=m.num_actual_tokens, num_groups=share.num_groups, summary=summary,
    )  # fmt: skip
    marks.append(_clock())
    counts_and_keys = share.revision.counts_and_keys(shape, share.graph_limits)
    marks.append(_clock())
    types = host_inputs.host_types(starts, drafts_view)
    record = step_share._Plan(key[:3], planner, types, shape, counts_and_keys, buffer)
    marks.append(_clock())
    buffer.stage(index, record, record.keys[3], None, packed=True)
    marks.append(_clock())
    buffer.open(m.block_table_tensor, m.query_start_loc, m.seq_lens, accepted, group)
    marks.append(_clock())
    share.num_steps += 1
    step = step_share._Step(share.num_steps, record, key, device_inputs, None, group)
    share._last_plan, share._step = record, step
    marks.append(_clock())
    views = record.rows.get(group) or buffer.row_views(record.keys, group, record.rows)
    fields = (*record.counts, *views, *record.tokens, m.query_start_loc, m.seq_lens, drafts)
    metadata = builder._make((*fields, record, group, step.index, *builder._unset))
    marks.append(_clock())
    return metadata, [b - a for a, b in itertools.pairwise(marks)]


def same_metadata(a: Any, b: Any) -> bool:
    """Whether two builds' metadata agree: equal counts, the same views (by identity: the
    buffer's fixed addresses) and the same engine tensors."""
    skip = {"plan_record", "step"}
    for name in type(a)._fields:
        x, y = getattr(a, name), getattr(b, name)
        if name in skip or x is y:
            continue
        if isinstance(x, torch.Tensor) or x != y:
            return False
    return True


def check_replay(case: bench.Case, steps: list[dict]) -> str:
    """The replayed path against real builds of the same steps (each step built twice:
    for real, then replayed after the share forgets its last plan)."""
    builder, share = case.builders[0], case.share
    for inputs in steps:
        metadata, kwargs = case.engine.step(inputs)
        real = builder.build(0, metadata[0], **kwargs)
        share._last_plan = None
        share.new_step()
        replayed, _ = replayed_build(builder, metadata[0], kwargs)
        bench.synchronize(case.engine.device)
        if not same_metadata(real, replayed):
            return "the replayed path's metadata differ from a real build's"
    return "the replayed path's metadata equal a real build's"


def measure(case: bench.Case, mode: str, builds: int) -> dict[str, float]:
    """p50 µs per piece and of whole builds, ``mode`` as ``vllm_builder_bench.py``'s: idle
    makes each step's inputs just before its build, then synchronizes and spins 100 µs;
    busy makes 24 steps' inputs, puts a long kernel in flight, then builds them, 20 µs
    apart."""
    device, builder = case.engine.device, case.builders[0]
    busy = mode == "busy" and device.type == "cuda"
    found: dict[str, list[float]] = {name: [] for name in (*PIECES, "sum", "build")}

    def build(metadata: list, kwargs: dict, replay: bool) -> None:
        if replay:
            _, parts = replayed_build(builder, metadata[0], kwargs)
            for name, ns in zip(PIECES, parts, strict=True):
                found[name].append(ns / 1e3)
            found["sum"].append(sum(parts) / 1e3)
        else:
            start = _clock()
            builder.build(0, metadata[0], **kwargs)
            found["build"].append((_clock() - start) / 1e3)

    for replay in (False, True):
        steps = case.steps(builds)
        if not busy:
            for inputs in steps:
                metadata, kwargs = case.engine.step(inputs)
                bench.synchronize(device)
                bench.spin(100)
                build(metadata, kwargs, replay)
        for first in range(0, len(steps) if busy else 0, 24):
            chunk = [case.engine.step(inputs) for inputs in steps[first : first + 24]]
            bench.synchronize(device)
            torch.cuda._sleep(int(2e7))  # longer than the 24 builds below
            for metadata, kwargs in chunk:
                bench.spin(20)
                build(metadata, kwargs, replay)
        bench.synchronize(device)
    return {name: statistics.median(values) for name, values in found.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="mixed 256", choices=sorted(bench.BATCHES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--builds", type=int, default=300, help="builds per measurement")
    parser.add_argument("--host-only", action="store_true", help="leave the launch out")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; any device")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.host_only else "cpu"
    batches = bench.SMOKE_BATCHES if args.smoke else bench.BATCHES
    batch = "mixed 8" if args.smoke else args.batch
    rounds, builds = (1, 8) if args.smoke else (args.rounds, args.builds)
    config = PlannerConfig(num_spec_tokens=bench.SPEC_TOKENS, graph_mode="full")
    case = bench.Case(config, device, batches[batch], 0, device == "cpu", False)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    print(
        f"# the first group's build of a new step, piece by piece: {batch}; {device} "
        f"({name}), python {platform.python_version()}, torch {torch.__version__}"
    )
    print(check_replay(case, case.steps(4)))
    measure(case, "idle", max(builds // 5, 4))  # warm-up: compiles, captures, caches
    print(f"{'round':<6} {'mode':<5} {'speed':>6} {'build':>6} {'sum':>6}  " + " ".join(PIECES))
    figures: dict = {}
    for round_ in range(rounds):
        for mode in ("idle", "busy"):
            speed = bench.host_speed()
            p50 = measure(case, mode, builds)
            pieces = " ".join(f"{p50[piece]:.2f}" for piece in PIECES)
            print(
                f"{round_:<6} {mode:<5} {speed:>6.2f} {p50['build']:>6.2f} {p50['sum']:>6.2f}  "
                f"{pieces}"
            )
            figures[f"round {round_} {mode}"] = {"host_speed_p50_us": speed} | {
                f"{piece}_p50_us": float(us) for piece, us in p50.items()
            }
    if device == "cuda":
        parts = bench.launch_parts(case.share, case.engine, case.steps(1)[0], builds)
        print("; ".join(f"{label} {us:.2f} µs" for label, us in parts.items()))
        figures["launch_us"] = {label: float(us) for label, us in parts.items()}
    if not args.smoke:  # a smoke run checks the code; it measures nothing worth keeping
        record_run("vllm_builder_parts", figures, batch=batch, host_only=args.host_only)


if __name__ == "__main__":
    main()
