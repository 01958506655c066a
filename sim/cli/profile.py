"""``stepplan profile``: time the live engine over a grid of step shapes, write its profile.

The engine is the one live mode runs (``model.name``'s preset on the executor, on
``--live-device`` with ``--live-backend``), under the planner settings of the command
line; the grid is :func:`stepplan.sim.timing.profiler.profile_batches`'s. The profile is one
JSON file (:mod:`stepplan.sim.timing.engine_profile`) that ``--profile FILE`` hands to the cost
model. On CUDA it also holds each graph's memory (``graph_memory``: every graph the
planner settings capture, taken before the timing), which ``stepplan buckets
--graph-memory`` reads. An existing file is replaced only with ``--overwrite``, and only
when it is an engine profile itself.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from importlib import metadata
from typing import Any

import attrs

from ..live import engine_setup, length_limit, make_runner
from ..progress import count_progress
from ..results.outfile import OutputFile
from ..settings.config import ConfigError, SimConfig
from ..timing.engine_profile import (
    PROFILE_FILE,
    EngineProfile,
    EngineProfileError,
    write_engine_profile,
)
from ..timing.profiler import (
    CONTEXT_LEVELS,
    WARMUP_RUNS,
    GridLimits,
    graph_batches,
    graph_memory,
    measure,
    profile_batches,
    token_grid,
)
from .options import add_setting_options, build_config

#: The grid draws contexts up to this multiple of its largest context level.
_CONTEXT_ROOM = 1.5


def grid_limits(config: SimConfig) -> GridLimits:
    """The grid's bounds: the token budget, a slot per scheduler slot, and KV positions for
    the budget's prefill and the grid's longest contexts (``live.max_len`` when set)."""
    budget = config.scheduler.max_num_batched_tokens
    needed = max(budget, int(CONTEXT_LEVELS[-1] * _CONTEXT_ROOM) + 16)
    max_len = config.live.max_len or min(length_limit(config), needed)
    return GridLimits(budget, config.scheduler.slots + 1, max_len, config.scheduler.num_groups)


def _versions() -> dict[str, str]:
    import torch
    import triton

    found = {"python": platform.python_version(), "torch": torch.__version__}
    found["triton"] = triton.__version__
    found["cuda"] = str(torch.version.cuda)
    try:
        found["stepplan"] = metadata.version("stepplan")
    except metadata.PackageNotFoundError:
        found["stepplan"] = "unknown"
    return found


def run_profile(args: argparse.Namespace) -> int:
    """``stepplan profile``: measure, fit, write; print what was measured."""
    if args.repeats < 1:
        raise ConfigError(f"--repeats: must be at least 1, got {args.repeats}")
    config = build_config(args)
    config = attrs.evolve(config, live=attrs.evolve(config.live, enabled=True))
    target = OutputFile.claim(args.out, PROFILE_FILE, overwrite=args.overwrite)
    from stepplan.executor.model import sample_positions

    started = time.perf_counter()
    limits = grid_limits(config)
    planner = config.plan
    runner = make_runner(config, planner, limits.max_len)
    batches = profile_batches(planner, limits, seed=config.seed)
    runs = len(batches) * (WARMUP_RUNS + args.repeats)
    if not args.quiet:
        print(
            f"profiling {len(batches)} step shapes on {_device(runner)}: {WARMUP_RUNS} warm-up "
            f"and {args.repeats} timed runs each, {runs:,} runs ...",
            file=sys.stderr,
        )
    progress = count_progress(runs, sys.stderr, unit="shape run", quiet=args.quiet, label="profile")

    def run(plan: Any, ids: Any, samples: Any) -> tuple[float, float | None, float]:
        _, timing = runner.timed_run(plan, ids, samples)
        return timing.wall_s, timing.gpu_s, timing.host_s

    graph_mib = _graph_memory(runner, planner)
    points = measure(
        batches,
        runner.planner,
        run,
        sample_positions,
        vocab_size=runner.shape.vocab_size,
        repeats=args.repeats,
        warmup=WARMUP_RUNS,
        seed=config.seed,
        progress=progress,
    )
    if progress is not None:
        progress.close()
    preset, planner_setup = engine_setup(config, planner)
    profile = EngineProfile(
        source=target.shown,
        device=_device(runner),
        versions=_versions(),
        preset=preset,
        planner=planner_setup,
        runner=_runner_setup(runner, config),
        token_grid=token_grid(limits),
        points=tuple(points),
        graph_mib=graph_mib,
    )
    write_engine_profile(profile, target)
    if not args.quiet:
        print(_report(profile, time.perf_counter() - started))
    return 0


def _graph_memory(runner: Any, planner: Any) -> dict:
    """MiB of each CUDA graph's capture, keyed by kind and size (none off CUDA); taken
    before the timing, so each capture's memory is its own."""
    if runner.device.type != "cuda":
        return {}
    return graph_memory(
        graph_batches(planner, runner.num_groups),
        runner.planner,
        lambda plan: runner.warm_up([plan]),
        lambda: _free_bytes(runner.device),
    )


def _free_bytes(device: Any) -> int:
    """Free device memory, the stream synchronized (captures are asynchronous)."""
    import torch

    torch.cuda.synchronize(device)
    return int(torch.cuda.mem_get_info(device)[0])


def _device(runner: Any) -> str:
    if runner.device.type != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(runner.device)


def _runner_setup(runner: Any, config: SimConfig) -> dict[str, Any]:
    return {
        "backend": config.live.engine_backend,
        "device": str(runner.device),
        "attention": runner.attention,
        "dtype": runner.shape.dtype,
        "slots": runner.num_slots,
        "max_len": runner.max_len,
        "graphs": bool(runner.captured_graphs),
        "seed": config.live.seed,
    }


def _report(profile: EngineProfile, seconds: float) -> str:
    """A few lines: points, the fit's error on them, host share, time taken."""
    fit = profile.fit
    errors = [
        abs(guess - p.wall_us) / p.wall_us
        for p in profile.points
        if (guess := fit.predict_us(p.shape)) is not None
    ]
    graphs = sum(p.shape.graph is not None for p in profile.points)
    hosts = [p.host_us / p.wall_us for p in profile.points if p.host_us]
    lines = [
        f"profile: {profile.source} ({len(profile.points)} shapes: {graphs} graph, "
        f"{len(profile.points) - graphs} eager; {len(fit.buckets)} buckets) in {seconds:.0f} s",
        f"fit on its own points: MAPE {100 * sum(errors) / max(1, len(errors)):.2f}%",
    ]
    if profile.graph_mib:
        mib = sorted(profile.graph_mib.values())
        lines.append(f"graph memory: {len(mib)} graphs, {mib[0]:.1f}-{mib[-1]:.1f} MiB each")
    if hosts:
        lines.append(f"host share of a step: median {100 * sorted(hosts)[len(hosts) // 2]:.1f}%")
    return "\n".join(lines)


def add_profile(subparsers: Any) -> None:
    """``profile --out FILE [settings]``."""
    parser = subparsers.add_parser(
        "profile",
        help="time the live engine over a grid of step shapes; write its profile",
        description="Build the live engine (model.name's preset; --live-device, "
        "--live-backend) and time its steps over a grid of shapes: every CUDA-graph bucket "
        "at four context levels and with one long row, eager steps over a token grid (and "
        "in graph mode mixed, mixed graphs). The profile JSON is what --profile FILE "
        "hands to the cost model; docs/fidelity_h200.toml holds the shipped H200 "
        "profile's settings (--config).",
    )
    parser.add_argument("--out", required=True, help="the profile JSON file to write")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier profile at --out"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each shape (median)")
    parser.add_argument("--quiet", action="store_true", help="no progress or report")
    add_setting_options(parser)
    parser.set_defaults(handler=run_profile)


ERRORS = (EngineProfileError,)
