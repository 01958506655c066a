"""Host time per build of stepplan's vLLM builder, through vLLM's own subclass and beside
vLLM 0.33's builder, and of the duck-typed drop-in with its layer groups sharing a step.

Where vLLM is installed, each batch (drawn afresh every step) first runs through vLLM
(``vllm_plugged.py``): stepplan's builder as vLLM's plugin loader hands it out
(``StepplanPleBuilder``, one layer group, ``idle`` and ``busy``), beside vLLM 0.33's own
``PleShortConvAttentionMetadataBuilder`` on the same steps, in the same rounds, both fed
vLLM's own ``CommonAttentionMetadata``; then the synchronizations per build of each,
how many of stepplan's opening launches were replayed as CUDA graphs and what one costs,
a check that every field equals vLLM's, and on a GPU a CUDA graph of vLLM's ``ple_conv``
captured over ``build_for_cudagraph_capture``'s fields and replayed after later builds.
The ratio table gives vLLM's p50 over stepplan's. The cases below are the duck-typed
``PlanMetadataBuilder`` (seed revision), as measured for issue 21.

Inputs sit where vLLM 0.33 keeps them: ``query_start_loc``, ``seq_lens``, each layer
group's ``block_table_tensor`` and ``num_accepted_tokens`` on the device (persistent
buffers, sliced per step), ``query_start_loc_cpu`` and ``num_decode_draft_tokens_cpu``
on the host (fresh tensors every step). Batches: pure spec 4 and 256 requests x 4 tokens
(the same host data every step, as with a fixed draft length), pure spec 256 with 0-3
drafts per row varying every step, and mixed 64 and 256 (spec and decode rows
interleaved, 1-2 prefills of up to 1400 tokens at the end, drawn afresh every step, the
worst case; ``recurring``: 16 such steps recur in random order, as an engine's shapes
do). Each batch also runs with the engine's block tables registered on the share
(``+tables``). Per batch, p50 host µs of:

- ``idle``: one group's build with the GPU idle (synchronized, then the core kept busy
  100 µs, as in an engine's loop);
- ``busy``: the same with a long kernel in flight (``torch.cuda._sleep``), as while an
  engine plans step n + 1 with step n running;
- ``4 groups``: the four builds of one step together (one compile, three slot gathers),
  GPU idle; ``further`` is one of the three further builds alone.

Each measurement runs in rounds; each round starts with a host-speed check (p50 of a
fixed pure-Python loop, ``runtime_bench.fixed_work``). A round is *quiet* when its
speed is within 1.25x of the best round's (the lent hosts have phases that slow every
host cost about 4x); the table gives the p50 over the quiet rounds and lists the slow
rounds with their speed. Then, per batch: how many launches were replayed as graphs, the
launch alone (replayed as a graph, past Triton's dispatch, and through it), the
synchronizations per build under
``torch.cuda.set_sync_debug_mode("warn")`` (with a positive control: reading a device
tensor the old way counts), and a check of the fields against the host oracle.

The seed builder is not run: its source (``/work/shared/seed``) lost its indentation in
transport and builds on vLLM's base builder; its figures are quoted in bench/results/history/.

    python3 bench/vllm_builder_bench.py [--rounds 12] [--builds 200] [--no-vllm]
    python3 bench/vllm_builder_bench.py --smoke   # tiny, on the CPU too: no timing claims
    python3 bench/vllm_builder_bench.py --host-only   # the host's work alone, on the CPU

``--host-only`` leaves every build's device half out (stepplan's builder through vLLM
too, without vLLM's own builder, all of whose work is host work there): on one core
(``taskset -c 1``), what the host pays per build, free of any GPU host's launch costs.
"""

from __future__ import annotations

import argparse
import functools
import gc
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from bench_record import record_run
from planner_bench import step_inputs
from runtime_bench import fixed_work, freeze_startup_objects

from stepplan.executor.vllm import (
    PlanMetadataBuilder,
    StepShare,
    host_array,
    kernel_launcher,
    plan_from_common_metadata,
    seed_view,
)
from stepplan.planner import PlannerConfig

GROUPS, SPEC_TOKENS = 4, 3
#: name: (rows of spec, decode, prefill lengths' means, drafts fixed at 3 on every spec row,
#: how many distinct steps recur (0: every step drawn afresh))
BATCHES = {
    "spec 4 x 4": (4, 0, (), True, 0),
    "spec 256 x 4": (256, 0, (), True, 0),
    "spec 256 varied": (256, 0, (), False, 0),
    "mixed 64": (32, 30, (700, 700), False, 0),
    "mixed 256": (128, 126, (700, 700), False, 0),
    "mixed 256 recurring": (128, 126, (700, 700), False, 16),
}
SMOKE_BATCHES = {"spec 4 x 4": (4, 0, (), True, 0), "mixed 8": (3, 3, (20, 20), False, 4)}


class Metadata:
    """The ``CommonAttentionMetadata`` fields the builder reads (vLLM's names)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def compute_num_computed_tokens(self) -> torch.Tensor:
        return self.seq_lens - torch.diff(self.query_start_loc)


class Engine:
    """Persistent device buffers as vLLM keeps them, and one step's metadata per group."""

    def __init__(
        self, device: str, rows: int, rng: np.random.Generator, *, uploads: bool = False
    ) -> None:
        self.device = torch.device(device)
        # ``uploads``: every step uploads its device values from pinned memory in stream
        # order before the builds, as vLLM's runner (and ``vllm_plugged.VllmEngine``) does.
        self.uploads = uploads
        self.query_start = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.accepted = torch.ones(rows, dtype=torch.int32, device=device)
        self.tables = [
            torch.zeros(rows, 64, dtype=torch.int32, device=device) for _ in range(GROUPS)
        ]
        self.rng = rng

    def step(self, inputs: dict, *, upload: bool = False) -> tuple[list[Metadata], dict]:
        """Every group's metadata for ``inputs`` (``planner_bench.step_inputs``) and the
        build's keyword arguments; ``upload`` also writes the device values (for checks)."""
        rows = len(inputs["query_lens"])
        starts = np.concatenate([[0], np.cumsum(inputs["query_lens"])]).astype(np.int32)
        if self.uploads:
            computed = inputs["num_computed_tokens"] + inputs["query_lens"]
            pairs = [
                (self.query_start[: rows + 1], starts),
                (self.seq_lens[:rows], computed),
                (self.accepted[:rows], inputs["num_accepted_tokens"]),
            ]
            pairs += [(t[:rows, 0], inputs["slots"][g]) for g, t in enumerate(self.tables)]
            for target, values in pairs:
                source = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int32))
                if self.device.type == "cuda":
                    source = source.pin_memory()
                target.copy_(source, non_blocking=True)
        elif upload:
            self.query_start[: rows + 1] = torch.from_numpy(starts)
            computed = inputs["num_computed_tokens"] + inputs["query_lens"]
            self.seq_lens[:rows] = torch.from_numpy(computed)
            self.accepted[:rows] = torch.from_numpy(inputs["num_accepted_tokens"])
            for group, table in enumerate(self.tables):
                table[:rows, 0] = torch.from_numpy(inputs["slots"][group])
        host = torch.from_numpy(starts)  # one host tensor for every group of the step
        shared = dict(
            query_start_loc_cpu=host,
            query_start_loc=self.query_start[: rows + 1],
            seq_lens=self.seq_lens[:rows],
            num_reqs=rows,
            num_actual_tokens=int(starts[-1]),
        )
        metadata = [Metadata(**shared, block_table_tensor=t[:rows]) for t in self.tables]
        kwargs = dict(
            num_accepted_tokens=self.accepted[:rows],
            num_decode_draft_tokens_cpu=torch.from_numpy(inputs["num_draft_tokens"].copy()),
        )
        return metadata, kwargs


def batch_steps(rng: np.random.Generator, spec: int, decode: int, prefills, fixed: bool, n: int):
    steps = []
    for _ in range(n):
        inputs = step_inputs(rng, spec, decode, prefills, GROUPS)
        if fixed:  # every spec row drafts Q - 1 tokens
            inputs["num_draft_tokens"] = np.where(inputs["num_draft_tokens"] >= 0, SPEC_TOKENS, -1)
            inputs["query_lens"] = np.where(
                inputs["num_draft_tokens"] >= 0, SPEC_TOKENS + 1, inputs["query_lens"]
            ).astype(np.int32)
            inputs["num_draft_tokens"] = inputs["num_draft_tokens"].astype(np.int32)
        steps.append(inputs)
    return steps


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spin(us: float) -> None:
    """Keep the core busy ``us`` microseconds, as an engine's host works between steps."""
    until = time.perf_counter() + us * 1e-6
    while time.perf_counter() < until:
        fixed_work()


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e6


def build_all(builders, metadata, kwargs) -> list:
    """One step's builds by the given builders, in group order."""
    return [b.build(0, m, **kwargs) for b, m in zip(builders, metadata, strict=False)]


def idle_samples(builders, engine, steps, groups: int) -> list[float]:
    """µs of the first ``groups`` builds of each step, the GPU idle before each step."""
    samples = []
    for inputs in steps:
        metadata, kwargs = engine.step(inputs)
        synchronize(engine.device)
        spin(100)
        samples.append(timed(functools.partial(build_all, builders[:groups], metadata, kwargs)))
    synchronize(engine.device)
    return samples


def further_samples(builders, engine, steps) -> list[float]:
    """µs of one further group's build (group 1, after group 0 opened the step)."""
    samples = []
    for inputs in steps:
        metadata, kwargs = engine.step(inputs)
        synchronize(engine.device)
        builders[0].build(0, metadata[0], **kwargs)
        spin(50)
        samples.append(timed(lambda m=metadata[1], kw=kwargs: builders[1].build(0, m, **kw)))
        for builder, m in zip(builders[2:], metadata[2:], strict=True):
            builder.build(0, m, **kwargs)
    synchronize(engine.device)
    return samples


def busy_samples(builders, engine, steps, groups: int, per_sleep: int = 24) -> list[float]:
    """µs of the first ``groups`` builds of each step with a long kernel in flight (at most
    ``per_sleep`` steps per kernel: fewer than the staging ring's entries, which only the
    GPU frees)."""
    samples = []
    for first in range(0, len(steps), per_sleep):
        synchronize(engine.device)
        torch.cuda._sleep(int(2e7))  # ~10 ms on an H200, longer than the builds below
        for inputs in steps[first : first + per_sleep]:
            # Made behind the kernel, as a runner makes each step's inputs: an engine that
            # uploads them (vLLM's) queues the copies in stream order.
            metadata, kwargs = engine.step(inputs)
            spin(20)
            samples.append(timed(functools.partial(build_all, builders[:groups], metadata, kwargs)))
        synchronize(engine.device)
    return samples


def host_speed() -> float:
    return statistics.median(fixed_work() for _ in range(300))


def measure_rounds(cases: dict, rounds: int, builds: int, busy: bool) -> dict:
    """Per (batch, mode): one p50 per round, over steps drawn afresh for each (an engine's
    mixed steps rarely repeat), and each round's host speed."""
    found: dict[tuple[str, str], list[float]] = {}
    speeds = []
    modes = {"idle": (idle_samples, 1), "4 groups": (idle_samples, GROUPS)}
    modes["further"] = (further_samples,)
    if busy:
        modes["busy"] = (busy_samples, 1)
        modes["busy 4 gr."] = (busy_samples, GROUPS)
    for _ in range(rounds):
        speeds.append(host_speed())
        for name, case in cases.items():
            for mode, (run, *extra) in modes.items():
                if mode in case.modes:
                    samples = run(case.builders, case.engine, case.steps(builds), *extra)
                    found.setdefault((name, mode), []).append(statistics.median(samples))
    return {"p50s": found, "speeds": speeds}


def print_rounds(results: dict, slack: float = 1.25) -> dict:
    """Print the rounds' table; its figures, per batch and mode."""
    figures: dict = {}
    speeds = results["speeds"]
    best = min(speeds)
    quiet = [speed <= slack * best for speed in speeds]
    print(f"host speed per round (fixed loop p50 µs): {' '.join(f'{s:.2f}' for s in speeds)}")
    print(f"quiet rounds (<= {slack} x best {best:.2f} µs): {sum(quiet)} of {len(speeds)}")
    print(f"{'batch':<22} {'mode':<10} {'quiet p50':>9} {'all p50':>8}  slow rounds: p50 (speed)")
    for (name, mode), p50s in results["p50s"].items():
        calm = [p for p, q in zip(p50s, quiet, strict=True) if q] or p50s
        slow = [f"{p:.1f} ({s:.2f})" for p, s, q in zip(p50s, speeds, quiet, strict=True) if not q]
        print(
            f"{name:<22} {mode:<10} {statistics.median(calm):>9.1f} "
            f"{statistics.median(p50s):>8.1f}  {', '.join(slow) or '-'}"
        )
        figures[f"{name} {mode}"] = {
            "quiet_p50_us": statistics.median(calm),
            "all_p50_us": statistics.median(p50s),
        }
    figures["host_speed_p50_us"] = speeds
    return figures


def launch_parts(share: StepShare, engine: Engine, inputs: dict, builds: int) -> dict[str, float]:
    """p50 µs of the opening launch alone, replayed as a graph, past Triton's dispatch
    and through it (the staged entry of the last build, relaunched with the GPU idle)."""
    buffer = share.buffer
    metadata, kwargs = engine.step(inputs)
    entry = buffer._entries[buffer._open_entry][0]
    done = buffer._ring.done_word(buffer._open_entry)
    m = metadata[0]
    args = (entry, done, m.block_table_tensor, m.query_start_loc, m.seq_lens)
    accepted = kwargs["num_accepted_tokens"]
    parts = {}
    for label, direct, graphs in (
        ("launch, graph replay", True, True),
        ("launch, direct", True, False),
        ("launch, through Triton", False, False),
    ):
        launcher = kernel_launcher.Launcher(
            buffer.words, share.config.query_len_max, direct=direct, graphs=graphs
        )
        for _ in range(3):  # compiles or finds the variant, then (graphs) captures a graph
            launcher.open_step(*args, accepted, 0)
        samples = []
        for _ in range(builds):
            synchronize(engine.device)
            spin(50)
            samples.append(timed(lambda launcher=launcher: launcher.open_step(*args, accepted, 0)))
        parts[label] = statistics.median(samples)
    synchronize(engine.device)
    return parts


def count_syncs(run: Callable[[], object]) -> int:
    """Synchronizing CUDA calls ``run`` makes, as ``set_sync_debug_mode("warn")`` reports."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def check_fields(builders, engine: Engine, inputs: dict, config: PlannerConfig) -> str:
    """Every group's fields against ``seed_view`` of the plan read wholly on the host."""
    metadata, kwargs = engine.step(inputs, upload=True)
    built = [b.build(0, m, **kwargs) for b, m in zip(builders, metadata, strict=True)]
    synchronize(engine.device)
    for group, (md, m) in enumerate(zip(built, metadata, strict=True)):
        plan = plan_from_common_metadata(m, config=config, **kwargs)
        for name, want in seed_view(plan).items():
            got = getattr(md, name)
            if isinstance(want, np.ndarray):
                if got is None or not np.array_equal(got.cpu().numpy(), want):
                    return f"group {group}: {name} differs"
            elif got != want:
                return f"group {group}: {name} = {got}, oracle {want}"
    return "every field of every group equals the host oracle"


class Case:
    """One batch's four builders on one share, its engine and how its steps are drawn."""

    def __init__(
        self, config, device, batch, seed: int, host_only: bool, tables: bool, uploads=False
    ) -> None:
        self.batch, self.rng = batch[:4], np.random.default_rng(seed)
        spec, decode, prefills, _, recurring = batch
        self.pool = batch_steps(self.rng, *self.batch, recurring) if recurring else None
        self.share = StepShare(config, device, num_groups=GROUPS)
        if host_only:
            leave_device_half_out(self.share)
        self.builders = [
            PlanMetadataBuilder(config, device, share=self.share, group=g) for g in range(GROUPS)
        ]
        self.engine = Engine(device, spec + decode + len(prefills), self.rng, uploads=uploads)
        if tables:
            self.share.register_block_tables(self.engine.tables)
        self.modes = ("4 groups", "further", "busy 4 gr.") if tables else MODES
        if uploads:
            self.modes = ("idle", "busy")

    def steps(self, count: int) -> list[dict]:
        """``count`` steps: drawn afresh, or in turn from the pool of recurring ones (their
        order shuffled, so that consecutive steps differ)."""
        if self.pool is None:
            return batch_steps(self.rng, *self.batch, count)
        picks = self.rng.integers(0, len(self.pool), count)
        return [self.pool[i] for i in picks]


MODES = ("idle", "busy", "4 groups", "busy 4 gr.", "further")


def leave_device_half_out(share: StepShare) -> None:
    """``share``'s builds without their launches (or, on the CPU, the torch operations
    that stand in for them): the host's work alone."""
    share.buffer.open = share.buffer.slots = lambda *args: None


def make_cases(
    device: str, batches: dict, config: PlannerConfig, host_only: bool, uploads: bool = False
) -> dict:
    """Per batch a :class:`Case`, and one more whose share has the engine's block tables
    registered (``+tables``); with ``host_only`` (CPU only) the device half of every
    build is left out; ``uploads`` adds one whose engine uploads each step's device values
    before its builds, as vLLM's runner does (``+uploads``)."""
    cases = {}
    for index, (name, batch) in enumerate(batches.items()):
        cases[name] = Case(config, device, batch, index, host_only, False)
        if uploads:
            cases[f"{name} +uploads"] = Case(config, device, batch, index, host_only, False, True)
        cases[f"{name} +tables"] = Case(config, device, batch, index, host_only, True)
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--builds", type=int, default=200, help="builds per measurement")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 2 rounds; any device")
    parser.add_argument(
        "--host-only", action="store_true", help="CPU: leave the device half of builds out"
    )
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM's cases out")
    parser.add_argument(
        "--batches", help="comma-separated batch names to run (default: every batch)"
    )
    parser.add_argument(
        "--uploads-apart",
        action="store_true",
        help="add stepplan's builder through vLLM on an engine that uploads nothing between "
        "builds, and the duck-typed builder on one that uploads as vLLM's runner does",
    )
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.host_only else "cpu"
    batches, rounds, builds = BATCHES, args.rounds, args.builds
    if args.smoke:
        batches, rounds, builds = SMOKE_BATCHES, 2, 8
    if args.batches:
        wanted = [name.strip() for name in args.batches.split(",")]
        unknown = [name for name in wanted if name not in batches]
        if unknown:
            parser.error(f"--batches: unknown {unknown[0]!r} (known: {', '.join(batches)})")
        batches = {name: batches[name] for name in wanted}
    config = PlannerConfig(num_spec_tokens=SPEC_TOKENS, graph_mode="full")
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    print(
        f"# vLLM builder host time per build, {GROUPS} layer groups, Q = 4, graph mode full; "
        f"{device} ({name}), python {platform.python_version()}, torch {torch.__version__}"
    )
    if args.host_only:
        print("# host only: the device half (the gathers) left out of every build")
    cases = make_cases(device, batches, config, args.host_only, args.uploads_apart)
    plugged = None if args.no_vllm else vllm_part()
    if plugged is not None:
        builder_cls = plugged.plugged_builder_class()
        # Host only: stepplan's builder through vLLM, without vLLM's own (all of whose
        # work is host work on the CPU).
        found = plugged.make_cases(
            device,
            batches,
            batch_draw,
            SPEC_TOKENS,
            builder_cls,
            own=not args.host_only,
            without_uploads=args.uploads_apart,
        )
        if args.host_only:
            for case in found.values():
                leave_device_half_out(case.builders[0].stepplan.share)
        cases = found | cases
    freeze_startup_objects()
    try:
        figures = report(cases, rounds, builds, device, config, args.host_only)
        if plugged is not None and device == "cuda":
            steps = 5 if args.smoke else 200
            print(plugged.graph_replay(builder_cls, 256, spec_draw(256), steps, SPEC_TOKENS))
    finally:
        gc.unfreeze()
    if not args.smoke:  # a smoke run checks the code; it measures nothing worth keeping
        record_run("vllm_builder_bench", figures, rounds=rounds, builds=builds,
                   host_only=args.host_only)  # fmt: skip


def vllm_part():
    """``vllm_plugged`` (the cases that run vLLM itself), or ``None`` with a note where
    vLLM is not installed."""
    try:
        import vllm_plugged
    except ImportError as error:
        print(f"# vLLM's cases left out: {error}")
        return None
    import vllm

    print(f"# vLLM {vllm.__version__}: stepplan's builder through its plugin, beside vLLM's own")
    return vllm_plugged


def batch_draw(rng: np.random.Generator, batch: tuple, count: int) -> list[dict]:
    """``count`` steps of ``batch`` (drawn afresh), as :class:`Case` draws them."""
    return batch_steps(rng, *batch[:4], count)


def spec_draw(rows: int):
    """Pure spec steps of ``rows`` rows: drafts fixed at Q - 1, or 0 .. Q - 1."""
    return lambda rng, count, fixed: batch_steps(rng, rows, 0, (), fixed, count)


def report(cases: dict, rounds: int, builds: int, device: str, config, host_only: bool) -> dict:
    """Measure and print: the rounds' table, then per case its parts, syncs and check;
    the table's figures."""
    measure_rounds(cases, 1, builds, device == "cuda")  # warm-up: compiles the kernels
    results = measure_rounds(cases, rounds, builds, device == "cuda")
    figures = print_rounds(results)
    print_ratios(results)
    for label, case in cases.items():
        if not isinstance(case, Case):
            theirs = cases.get(label.replace("in vLLM", "vLLM 0.33"))
            if label.endswith("in vLLM") and theirs is not None:
                print(plugged_line(label, case, theirs, device, builds))
            continue
        share, builders, engine = case.share, case.builders, case.engine
        line = [f"{label:<22} compiles {share.num_compiles} for {share.num_steps} steps"]
        step = case.steps(1)[0]
        if device == "cuda":
            line.append(replays(share))
            parts = launch_parts(share, engine, step, builds)
            line += [f"{part} {us:.1f} µs" for part, us in parts.items()]
            metadata, kwargs = engine.step(step)
            syncs = count_syncs(functools.partial(build_all, builders, metadata, kwargs))
            control = count_syncs(functools.partial(host_array, metadata[0].block_table_tensor))
            line.append(
                f"syncs per step (4 builds) {syncs} (control: a host read counts {control})"
            )
        if not host_only:
            line.append(check_fields(builders, engine, step, config))
        print("  ".join(line))
    return figures


def print_ratios(results: dict) -> None:
    """vLLM's own builder's p50 over stepplan's (through vLLM), per batch and mode."""
    p50s = {key: statistics.median(values) for key, values in results["p50s"].items()}
    for (name, mode), ours in p50s.items():
        if name.endswith("| in vLLM"):
            theirs = p50s.get((name.replace("in vLLM", "vLLM 0.33"), mode))
            if theirs is not None:
                batch = name.split(" |")[0]
                print(
                    f"{batch:<22} {mode:<10} stepplan in vLLM {ours:.1f} µs, vLLM 0.33 "
                    f"{theirs:.1f} µs: vLLM's own takes {theirs / ours:.1f}x"
                )


def replays(share: StepShare) -> str:
    """How many of ``share``'s launches so far were replayed as CUDA graphs."""
    launcher = share.buffer._launcher
    return f"launches replayed {launcher.num_replays} ({share.num_steps} steps)"


def plugged_line(label: str, ours, theirs, device: str, builds: int) -> str:
    """Syncs per build of both builders (GPU), how many of stepplan's opening launches were
    replayed as graphs and what one costs (GPU), and stepplan's fields against vLLM's."""
    step = ours.steps(1)[0]
    theirs.steps(1)  # the pair draws alike
    line = [f"{label:<32}"]
    if device == "cuda":
        share = ours.builders[0].stepplan.share
        line.append(replays(share))
        parts = launch_parts(share, ours.engine, step, builds)
        line += [f"{part} {us:.1f} µs" for part, us in parts.items()]
        for name, case in (("stepplan", ours), ("vLLM", theirs)):
            metadata, kwargs = case.engine.step(step)
            syncs = count_syncs(functools.partial(build_all, case.builders, metadata, kwargs))
            line.append(f"{name} syncs per build {syncs}")
    line.append(vllm_plugged_check(ours, theirs, step))
    return "  ".join(line)


def vllm_plugged_check(ours, theirs, step: dict) -> str:
    import vllm_plugged

    return vllm_plugged.check_fields(ours, theirs, step)


if __name__ == "__main__":
    main()
