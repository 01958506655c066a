"""Runtime benchmark (CUDA GPU): host and GPU time per step, 32 layers in 4 groups, graphs vs eager.

For a pure spec step (256 requests x 4 tokens) and a mixed one (128 spec x 4 + 126
decodes + 2 prefills of 700 tokens), in one process:

- host µs per step: ``Planner.compile`` + ``Executor.step`` (graphs: the plan written into
  pinned staging memory, then one replay whose first kernel pulls it; eager: one pinned
  upload, then 32 layers of launches), measured with the GPU idle so the host never
  waits on it and the host core busy just before, as in an engine's loop (p50 / p90;
  ``cold``: started straight out of a ``synchronize``; ``busy``: with the GPU running a
  2 ms kernel queued just before, as while the previous step runs; ``quiet``: the
  calls made while a fixed loop timed just before ran within 1.25x of its usual best,
  and their share; ``steal``: the share of the VM's CPU time its hypervisor gave away meanwhile,
  from ``/proc/stat``; ``faults``, ``preempt``: the process's minor page faults and
  involuntary context switches per step); ``--breakdown`` times each part of a graph step alone;
- graph steps' host p50 again in ``--rounds`` rounds a second apart (best, median,
  worst): the host's slow phases come and go within a run;
- GPU µs per step: steps queued behind a sleep kernel, so launch gaps don't count;
- the sum of the 32 layers' conv times, each layer measured alone the same way.

Then, for each kernel variant (``--variants``, old and new side by side in one process),
the GPU table: per row the eager step (its plan unpadded, steps queued behind a sleep),
the graph step (``Executor.step``'s replay, CUDA events around each, median of many),
their ratio, and the bucket's padding overhead: the 32 layers captured in a graph over the
bucket's padded plan against the same layers over the step's unpadded plan (its real
work), ``(bucket - real) / real``. ``--gpu-only`` runs that table alone (what
``bench/kernel_bench.py --with-runtime`` runs after the kernels); ``--json PATH`` (default
``$OUT/runtime_gpu.json`` where ``$OUT`` is set) writes it.

Run: ``python3 bench/runtime_bench.py`` (``--channels 2048`` for a quicker run).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import time
from collections.abc import Callable

import attrs
import numpy as np
import torch
import triton
from bench_record import numbers_of, record_run

from stepplan.executor import Executor, kernels
from stepplan.planner import (
    ExecutionPlan,
    Planner,
    PlannerConfig,
    StepBatch,
    compile_plan,
    default_graph_sizes,
)

LAYERS, GROUPS, TAPS, DILATION, SPEC_TOKENS, ROWS = 32, 4, 4, 3, 3, 256


def planner_config() -> PlannerConfig:
    # vLLM's default sizes stop at 512 tokens; two more buckets let the mixed step
    # (2038 tokens) replay a graph too.
    sizes = (*default_graph_sizes(ROWS, SPEC_TOKENS), 1024, 2048)
    return PlannerConfig(
        num_spec_tokens=SPEC_TOKENS, graph_mode="mixed", graph_sizes=sizes, max_num_seqs=ROWS
    )


#: The runtime rows: name -> (spec rows of 4 tokens, decode rows, prefill rows, prefill
#: length). The first two are the host table's; the others put steps in buckets with more
#: padding (rows, tokens and tiles) for the GPU table.
BATCHES = {
    "spec 256x4": (ROWS, 0, 0, 0),
    "mixed 256": (ROWS // 2, ROWS // 2 - 2, 2, 700),
    "mixed 64": (32, 30, 2, 300),
    "decode 130": (0, 130, 0, 0),
}
HOST_ROWS = ("spec 256x4", "mixed 256")


def make_batch(
    rng: np.random.Generator, num_spec: int, num_decode: int, prefills: int, length: int = 700
):
    rows = num_spec + num_decode + prefills
    q = np.array([4] * num_spec + [1] * num_decode + [length] * prefills)
    drafts = np.array([3] * num_spec + [-1] * (num_decode + prefills))
    computed = rng.integers(100, 3000, rows)
    computed[num_spec + num_decode :] = [0, 2 * length][:prefills]
    order = rng.permutation(rows)  # kinds interleaved, as an engine hands them over
    slots = np.stack([rng.permutation(np.arange(1, ROWS + 1))[:rows] for _ in range(GROUPS)])
    return StepBatch(
        query_lens=q[order],
        num_computed_tokens=computed[order],
        slots=slots,
        num_draft_tokens=drafts[order],
        num_accepted_tokens=rng.integers(1, SPEC_TOKENS + 2, rows),
    )


def make_executors(
    channels: int, config: PlannerConfig, variants: tuple[str, ...] = (kernels.DEFAULT_VARIANT,)
) -> dict[str, dict[str, Executor]]:
    """Per kernel variant, a graph and an eager executor, all over the same bf16 weights and
    state pools."""
    window = (TAPS - 1) * DILATION + config.query_len_max - 1
    weights = [
        torch.randn(channels, TAPS, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)
    ]
    states = [
        torch.randn(ROWS + 1, window, channels, device="cuda", dtype=torch.bfloat16).permute(
            0, 2, 1
        )
        for _ in range(LAYERS)
    ]
    groups = [layer * GROUPS // LAYERS for layer in range(LAYERS)]
    return {
        variant: {
            mode: Executor(
                weights=weights,
                layer_groups=groups,
                conv_states=states,
                dilation=DILATION,
                config=config,
                use_graphs=mode == "graphs",
                kernel_variant=variant,
            )
            for mode in ("graphs", "eager")
        }
        for variant in variants
    }


def sleep_cycles_per_us() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1000)


def gpu_us(run, reps: int, host_us: float, cycles_per_us: float) -> float:
    """GPU µs per call: ``reps`` calls queued behind a sleep that outlasts their launching."""
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(int(cycles_per_us * (2 * reps * host_us + 2000)))
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(samples)


def host_us(
    run, iterations: int, warm_us: float = 300.0, busy_cycles: int = 0
) -> tuple[list[float], list[float]]:
    """Host µs per call and the host's speed just before it, each call started with
    the GPU idle and, unless ``warm_us`` is 0, the host core kept busy that long first:
    an engine's host works between steps, while a core that slept in ``synchronize``
    runs the next microseconds slowly (the ``cold`` column measures that case).
    ``busy_cycles``: the GPU is instead kept busy through the call by a sleep kernel
    queued first, as while an engine plans step n + 1 with step n running (the ``busy``
    column). The core is kept busy with :func:`fixed_work`, whose last time before the
    call is the host's speed then (NaN when ``warm_us`` is 0): lent hosts have phases
    where every instruction of the process runs several times slower (the ``quiet``
    columns keep the calls made while that loop ran at speed; a slow phase may spare the
    loop, so :func:`host_rounds` measures again over time)."""
    samples, speeds = [], []
    for _ in range(iterations):
        torch.cuda.synchronize()
        if busy_cycles:
            torch.cuda._sleep(busy_cycles)
        speed = float("nan")
        spin_until = time.perf_counter() + warm_us * 1e-6
        while time.perf_counter() < spin_until:
            speed = fixed_work()
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e6)
        speeds.append(speed)
    torch.cuda.synchronize()
    return samples, speeds


def cpu_jiffies() -> tuple[int, int]:
    """``(all, stolen)`` CPU time of the machine so far, from ``/proc/stat`` (0, 0 where
    there is none): time the hypervisor gave this VM's CPUs to someone else is stolen."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields), fields[7] if len(fields) > 7 else 0


def process_events() -> np.ndarray:
    """``[minor page faults, involuntary context switches]`` of this process so far:
    per step, either one costs the host microseconds that no code of ours spends."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([usage.ru_minflt, usage.ru_nivcsw])


def fixed_work() -> float:
    """µs of a fixed pure-Python loop: the host's speed right now."""
    start = time.perf_counter()
    total = 0
    for value in range(100):
        total += value * value
    return (time.perf_counter() - start) * 1e6


def quiet(samples: list[float], speeds: list[float], slack: float = 1.25) -> list[float]:
    """The samples taken while :func:`fixed_work` ran within ``slack`` of its usual best
    (its 10th percentile: the minimum is a lucky outlier)."""
    best = percentile(speeds, 10)
    return [sample for sample, speed in zip(samples, speeds, strict=True) if speed <= slack * best]


def host_speed_us(iterations: int = 2000) -> float:
    """p50 µs of :func:`fixed_work`: tells a slow or shared host from slow code when runs
    on lent machines differ (printed before and after the measurements)."""
    return percentile([fixed_work() for _ in range(iterations)], 50)


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q))


def measure(name, batch, executor, mode, iterations, cycles_per_us) -> dict:
    """One row of the table; eager steps use plans compiled without graphs (no padding)."""
    config = executor.config
    if mode == "eager":
        config = attrs.evolve(config, graph_mode="none")
    plan = compile_plan(batch, config)
    tokens = batch.num_tokens
    if mode == "graphs":
        x, residual = executor.staging(tokens)  # the buffers graphs read: no copies
    else:
        x = torch.empty(tokens, executor.channels, device="cuda", dtype=executor.dtype)
        residual = torch.zeros_like(x)
    x.normal_()

    planner = Planner(config)  # as an engine keeps one: equal plans to compile_plan's

    def step() -> None:
        executor.step(planner.compile(batch), x, residual)

    for _ in range(3):  # compiles kernels, captures the graph
        step()
    before, events = cpu_jiffies(), process_events()
    total, speeds = host_us(step, iterations)
    after, events = cpu_jiffies(), (process_events() - events) / iterations
    calm = quiet(total, speeds)
    cold, _ = host_us(step, iterations, warm_us=0.0)
    busy, _ = host_us(step, iterations, busy_cycles=int(cycles_per_us * 2000))
    plan_only, _ = host_us(lambda: planner.compile(batch), iterations)
    p90 = percentile(total, 90)
    reps = 12 if mode == "graphs" else 4
    gpu = gpu_us(lambda: executor.step(plan, x, residual), reps, p90, cycles_per_us)
    return {
        "batch": name,
        "mode": mode,
        "graph": str(plan.graph) if plan.graph else "eager",
        "host_p50": percentile(total, 50),
        "host_p90": p90,
        "quiet_p50": percentile(calm, 50),
        "quiet_share": len(calm) / len(total),
        "steal": (after[1] - before[1]) / max(1, after[0] - before[0]),
        "faults": events[0],
        "preempted": events[1],
        "cold_p50": percentile(cold, 50),
        "busy_p50": percentile(busy, 50),
        "busy_p90": percentile(busy, 90),
        "plan_p50": percentile(plan_only, 50),
        "gpu": gpu,
        "upload_bytes": plan.packed.nbytes,
        "plan": plan,
        "x": x,
        "residual": residual,
    }


def kernel_sum_us(executor: Executor, row: dict, cycles_per_us: float) -> float:
    """Sum over layers of one layer's conv GPU time on the row's plan, each layer alone."""
    executor.prepare(row["plan"])
    total = 0.0
    for layer in range(executor.num_layers):

        def conv(layer: int = layer) -> None:
            executor.conv(layer, row["x"], row["residual"])

        total += gpu_us(conv, 10, 200.0, cycles_per_us)
    return total


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=8192)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--breakdown", action="store_true", help="time the parts of a graph step")
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="measure graph steps' host time again in this many rounds a second apart (0: none)",
    )
    parser.add_argument(
        "--no-freeze",
        dest="freeze",
        action="store_false",
        help="leave start-up objects to the garbage collector (no gc.freeze)",
    )
    parser.add_argument(
        "--core", type=int, default=None, help="pin the process to this CPU core first"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(kernels.VARIANTS),
        choices=list(kernels.VARIANTS),
        help="kernel variants of the GPU table, side by side (the host table runs the default)",
    )
    parser.add_argument(
        "--batches", nargs="+", default=list(BATCHES), choices=list(BATCHES), help="rows to run"
    )
    parser.add_argument("--gpu-only", action="store_true", help="the GPU table alone")
    parser.add_argument("--samples", type=int, default=40, help="graph replays timed per figure")
    parser.add_argument("--json", help="GPU table as JSON (default $OUT/runtime_gpu.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("runtime_bench needs a CUDA GPU")
    if args.core is not None:  # no migration between cores mid-step (an engine pins too)
        os.sched_setaffinity(0, {args.core})
    config = planner_config()
    rng = np.random.default_rng(0)
    batches = {name: make_batch(rng, *BATCHES[name]) for name in BATCHES}
    variants = tuple(dict.fromkeys([kernels.DEFAULT_VARIANT, *args.variants]))
    executors = make_executors(args.channels, config, variants)
    cycles_per_us = sleep_cycles_per_us()
    if args.freeze:
        freeze_startup_objects()
    print(
        f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}"
        f"  C={args.channels} K={TAPS} D={DILATION} Q={config.query_len_max} bf16"
        f"  {LAYERS} layers / {GROUPS} groups"
    )
    chosen = {name: batches[name] for name in args.batches}
    gpu_rows = gpu_table(executors, chosen, args.variants, cycles_per_us, args.samples)
    print_gpu_table(gpu_rows)
    out = args.json or (
        os.environ.get("OUT") and os.path.join(os.environ["OUT"], "runtime_gpu.json")
    )
    if out:
        write_rows(out, gpu_rows, args.channels)
    figures = {"gpu": {f"{row['batch']} {row['variant']}": numbers_of(row) for row in gpu_rows}}
    if not args.gpu_only:
        host = {name: batches[name] for name in HOST_ROWS}
        rows = host_tables(args, host, executors, cycles_per_us)
        figures["host_us"] = {f"{row['batch']} {row['mode']}": numbers_of(row) for row in rows}
    record_run("runtime_bench", figures, channels=args.channels, variants=list(variants))


def host_tables(
    args: argparse.Namespace,
    batches: dict[str, StepBatch],
    executors: dict[str, dict[str, Executor]],
    cycles_per_us: float,
) -> list[dict]:
    """The host table (and rounds) of the default variant's executors; its rows."""
    default = executors[kernels.DEFAULT_VARIANT]
    print(f"  host speed (a fixed Python loop) p50 {host_speed_us():.1f} µs", flush=True)
    rows = []
    for name, batch in batches.items():
        for mode, executor in default.items():
            iterations = args.iterations if mode == "graphs" else max(30, args.iterations // 6)
            row = measure(name, batch, executor, mode, iterations, cycles_per_us)
            row["kernels"] = kernel_sum_us(executor, row, cycles_per_us)
            rows.append(row)
            print(f"  measured {name} / {mode}", flush=True)
            if args.breakdown and mode == "graphs":
                parts = host_breakdown(executor, row, args.iterations)
                print("    host p50 µs: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    print(f"  host speed (a fixed Python loop) p50 {host_speed_us():.1f} µs")
    print_table(rows)
    if args.rounds:
        print_rounds(host_rounds(default, rows, args.rounds, args.iterations))
    return rows


def event_us(run: Callable[[], None], samples: int, cycles_per_us: float) -> float:
    """Median µs between CUDA events recorded around one ``run()`` (a graph replay): each
    sample queued behind a 300 µs sleep kernel, so the host's work before the launch
    (the staging write of a step) is over when the first event fires."""
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(int(300 * cycles_per_us))
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def layers_graph(
    executor: Executor, plan: ExecutionPlan, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A CUDA graph of the 32 layers' convs over ``plan`` (its own device buffer, no upload
    node), captured the way the executor's step graphs are (rows beside tiles); and that
    buffer, which every replay reads."""
    buffer = torch.from_numpy(np.array(plan.packed)).to(executor.device)
    executor.prepare_graphed(plan, buffer)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles every kernel outside the capture
        executor.run_layers(x, residual)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        executor.run_layers(x, residual)
    executor.forget_prepared()
    return graph, buffer


def gpu_row(
    name: str,
    batch: StepBatch,
    pair: dict[str, Executor],
    cycles_per_us: float,
    samples: int,
) -> dict:
    """One row of the GPU table for one variant's executors (``graphs``, ``eager``)."""
    graphs, eager = pair["graphs"], pair["eager"]
    plan = compile_plan(batch, graphs.config)
    plain = compile_plan(batch, attrs.evolve(graphs.config, graph_mode="none"))
    assert plan.graph is not None, f"{name}: no bucket fits"
    x, residual = graphs.staging(batch.num_tokens)  # the buffers graph steps read: no copies
    x.normal_()
    residual.zero_()
    for _ in range(3):  # compiles kernels, captures the step's graph
        graphs.step(plan, x, residual)
        eager.step(plain, x, residual)
    graph_step = event_us(lambda: graphs.step(plan, x, residual), samples, cycles_per_us)
    # Four eager steps queued behind a sleep that outlasts their launching (a few ms each).
    eager_step = gpu_us(lambda: eager.step(plain, x, residual), 4, 3000.0, cycles_per_us)
    # Each graph with its plan buffer, which its replays read: both kept alive until timed.
    bucket, real = (layers_graph(graphs, p, x, residual) for p in (plan, plain))
    bucket_us = event_us(bucket[0].replay, samples, cycles_per_us)
    real_us = event_us(real[0].replay, samples, cycles_per_us)
    torch.cuda.synchronize()
    return dict(
        batch=name,
        graph=str(plan.graph),
        eager_us=eager_step,
        graph_us=graph_step,
        ratio=graph_step / eager_step,
        bucket_us=bucket_us,
        real_us=real_us,
        padding=(bucket_us - real_us) / real_us,
        live=(plan.num_rows, plan.num_tokens, plan.num_tiles),
    )


def gpu_table(
    executors: dict[str, dict[str, Executor]],
    batches: dict[str, StepBatch],
    variants: list[str],
    cycles_per_us: float,
    samples: int,
) -> list[dict]:
    """The GPU table's rows, batch by batch, every variant in turn within a batch."""
    rows = []
    for name, batch in batches.items():
        for variant in variants:
            row = gpu_row(name, batch, executors[variant], cycles_per_us, samples)
            rows.append({"variant": variant, **row})
            print(f"  measured {name} / {variant}", flush=True)
    return rows


def print_gpu_table(rows: list[dict]) -> None:
    print()
    print(
        "GPU µs per step, 32 layers: eager (unpadded plan) vs graph (Executor.step replay); "
        "padding = (bucket - real) / real, the layers' graph over the bucket's plan against "
        "the same over the unpadded plan"
    )
    header = (
        f"{'batch':<11} {'variant':<11} {'graph':<42} {'live r/t/p':>14} {'eager':>9} "
        f"{'graph':>9} {'graph/eager':>11} {'real':>9} {'bucket':>9} {'padding':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        live = "/".join(map(str, r["live"]))
        print(
            f"{r['batch']:<11} {r['variant']:<11} {r['graph']:<42} {live:>14} "
            f"{r['eager_us']:>9.1f} {r['graph_us']:>9.1f} {r['ratio']:>11.3f} "
            f"{r['real_us']:>9.1f} {r['bucket_us']:>9.1f} {r['padding']:>8.1%}"
        )


def write_rows(path: str, rows: list[dict], channels: int) -> None:
    """The GPU table as JSON, atomically (a temporary file beside ``path``, then a rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    data = dict(
        device=torch.cuda.get_device_name(),
        C=channels,
        layers=LAYERS,
        groups=GROUPS,
        rows=rows,
    )
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(temporary, path)


def host_rounds(
    executors: dict[str, Executor], rows: list[dict], rounds: int, iterations: int
) -> dict[str, list[np.ndarray]]:
    """Host p50 µs of each graph row's step, measured again in ``rounds`` rounds that take
    the rows in turn, a second apart: lent hosts have phases of seconds in which the
    step runs several times slower while :func:`fixed_work`'s loop runs at speed and
    no page fault, preemption or stolen time shows. Rounds spread over them tell a
    slow phase from slow code: the best round is the code's cost, the spread the
    host's. Each round is the p50s of ``[step, planner, host work before the launch,
    launch]`` (:func:`split_graph_step`), so a slow phase shows which part it slows."""
    graphed = [row for row in rows if row["mode"] == "graphs"]
    found: dict[str, list[np.ndarray]] = {row["batch"]: [] for row in graphed}
    for _ in range(rounds):
        for row in graphed:
            step, parts = split_graph_step(executors["graphs"], row["plan"].batch), []
            samples, _ = host_us(lambda step=step, parts=parts: parts.append(step()), iterations)
            found[row["batch"]].append(np.percentile(np.column_stack([samples, parts]), 50, 0))
        time.sleep(1.0)
    return found


def split_graph_step(executor: Executor, batch: StepBatch) -> Callable[[], list[float]]:
    """A graph step as ``Executor.step(Planner.compile(batch), ...)`` makes it on the
    staged buffers (the calls of ``StepGraphs.run``, with clocks read between them),
    returning the µs of its three parts: the planner, the host work before the launch
    (graph lookup and check, ring turn, staging write) and the launch."""
    graphs = executor._step_graphs
    ring, planner = graphs._ring, Planner(executor.config)

    def step() -> list[float]:
        start = time.perf_counter()
        plan = planner.compile(batch)
        planned = time.perf_counter()
        captured = graphs.entry(plan)
        index = ring.claim()
        ring.write(index, plan.packed)
        executor.forget_prepared()
        staged = time.perf_counter()
        captured.graphs[index].replay()
        launched = time.perf_counter()
        return [1e6 * (planned - start), 1e6 * (staged - planned), 1e6 * (launched - staged)]

    return step


def print_rounds(found: dict[str, list[np.ndarray]]) -> None:
    count = len(next(iter(found.values())))
    print(f"\ngraph steps, host p50 µs in {count} rounds a second apart")
    for batch, rounds in found.items():
        p50s = [parts[0] for parts in rounds]
        print(
            f"  {batch:<11} best {min(p50s):.1f}  median {statistics.median(p50s):.1f}  "
            f"worst {max(p50s):.1f}"
        )
        shown = "  ".join("{:.1f} ({:.1f} / {:.1f} / {:.1f})".format(*parts) for parts in rounds)
        print(f"    rounds, p50 (planner / before launch / launch): {shown}")


def freeze_startup_objects() -> None:
    """Move every object made so far out of the collector's sight, as serving engines
    do after start-up (``gc.freeze``): a full collection then walks only what the
    steps make, not torch's and Triton's start-up objects (milliseconds otherwise,
    landing on whichever step triggers it)."""
    gc.collect()
    gc.freeze()


def host_breakdown(executor: Executor, row: dict, iterations: int) -> dict[str, float]:
    """p50 host µs of each part of a graph step, each timed alone with the GPU idle.

    A graph step is ``entry`` (graph lookup and signature check), a ring turn
    (the staging entry's ticket has come back from its last replay), the staging
    write (the plan and a fresh ticket into pinned memory; the graph's first node
    uploads them) and the replay launch (which brings the ticket back, so the
    write's part must come before the replay's). ``full signature`` is what a replay
    costs to check when the plan's config or layout is not the captured one (and what
    every step paid before).
    """
    plan, x, residual = row["plan"], row["x"], row["residual"]
    batch, config = plan.batch, plan.config
    planner = Planner(config)
    graphs = executor._step_graphs
    captured = graphs.entry(plan)
    ring = graphs._ring

    parts = {
        "compile_plan": lambda: compile_plan(batch, config),
        "Planner.compile": lambda: planner.compile(batch),
        "entry (lookup+check)": lambda: graphs.entry(plan),
        "full signature": lambda: executor.signature(plan),
        "ring turn": ring.claim,
        "staging write": lambda: ring.write(0, plan.packed),
        "graph.replay": lambda: captured.graphs[0].replay(),
        "StepGraphs.run": lambda: graphs.run(plan),
        "Executor.step": lambda: executor.step(plan, x, residual),
        "compile + step": lambda: executor.step(planner.compile(batch), x, residual),
    }
    return {name: percentile(host_us(part, iterations)[0], 50) for name, part in parts.items()}


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'batch':<11} {'mode':<6} {'graph':<42} {'host p50':>9} {'host p90':>9} {'quiet p50':>9} "
        f"{'quiet %':>7} {'steal %':>7} {'faults':>6} {'preempt':>7} "
        f"{'cold p50':>9} "
        f"{'busy p50':>9} {'busy p90':>9} {'plan p50':>9} {'GPU/step':>9} {'kern sum':>9} "
        f"{'GPU/sum':>8} {'upload B':>9}"
    )
    print()
    print("µs per step (host: Planner.compile + Executor.step; GPU: all 32 layers + upload)")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['batch']:<11} {r['mode']:<6} {r['graph']:<42} {r['host_p50']:>9.1f} "
            f"{r['host_p90']:>9.1f} {r['quiet_p50']:>9.1f} "
            f"{r['quiet_share']:>7.0%} {r['steal']:>7.1%} {r['faults']:>6.2f} "
            f"{r['preempted']:>7.2f} {r['cold_p50']:>9.1f} "
            f"{r['busy_p50']:>9.1f} "
            f"{r['busy_p90']:>9.1f} {r['plan_p50']:>9.1f} {r['gpu']:>9.1f} "
            f"{r['kernels']:>9.1f} {r['gpu'] / r['kernels']:>8.3f} {r['upload_bytes']:>9}"
        )


if __name__ == "__main__":
    main()
