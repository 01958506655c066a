"""What the simulating subcommands share: their options, the settings they build, their
results folder, running one simulation into it, and the summary table they print (the
trace they read: ``trace_reading.py``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib

from stepplan.planner import GRAPH_MODES

from ..acceptance import DEEPSEEK_MTP_PROBS, EAGLE3_PROBS, load_replay
from ..admission import POLICIES
from ..deployment import ROUTER_NAMES
from ..deployment import TABLE as ROUTERS
from ..deployment.disaggregated import run_disaggregated
from ..deployment.loop import run_deployment
from ..live import check_live, engine_setup
from ..progress import Progress, ProgressBar, ProgressLines, live_warning
from ..results.outdir import ResultsFolder, claim_new, config_digest
from ..results.records import CHUNK_STEPS
from ..results.schema import RESULT_FILES
from ..results.summary import summary_rows
from ..results.writer import ResultsWriter, parquet_available
from ..run import run_steps
from ..scheduler.vllm_engine_scheduler import check_vllm
from ..settings.config import (
    ACCEPTANCE_MODELS,
    HOST_COSTS,
    LIVE_BACKENDS,
    LIVE_DEVICES,
    LIVE_TIMES,
    SCHEDULER_IMPLEMENTATIONS,
    ConfigError,
    SimConfig,
    check_config,
    load_config,
    with_settings,
)
from ..settings.links import KV_LINK_NAMES
from ..timing.cost import load_profile
from ..timing.engine_profile import read_engine_profile
from ..traces import FORMATS
from ..traces.source import STDIN
from ..workloads import SYNTHETIC_PREFIX
from .provenance import provenance
from .signals import StopRequest
from .tables import align
from .trace_reading import EMBEDDED_TRACE, identify, load_requests

#: Where runs without ``--out`` go: ``results/<name>-<digest>`` (see :func:`results_folder`).
RESULTS_PARENT = "results"

#: ``--flag`` destinations and the setting each overrides.
OVERRIDES = {
    "num_spec_tokens": "scheduler.num_spec_tokens",
    "max_num_seqs": "scheduler.max_num_seqs",
    "max_num_batched_tokens": "scheduler.max_num_batched_tokens",
    "slot_capacity": "scheduler.slot_capacity",
    "max_model_len": "model.max_model_len",
    "num_groups": "scheduler.num_groups",
    "policy": "scheduler.policy",
    "policy_age_limit_s": "scheduler.policy_age_limit_s",
    "scheduler": "scheduler.implementation",
    "graph_mode": "planner.graph_mode",
    "graph_sizes": "planner.graph_sizes",
    "host_cost": "cost.host_cost",
    "kernel_profile": "cost.kernel_profile",
    "profile": "cost.profile",
    "acceptance_probs": "acceptance.probs",
    "acceptance_length": "acceptance.length",
    "acceptance_trace": "acceptance.trace",
    "rate_scale": "workload.rate_scale",
    "start_s": "workload.start_s",
    "end_s": "workload.end_s",
    "limit": "workload.limit",
    "rate": "workload.rate",
    "slo_ttft_ms": "slo.ttft_ms",
    "slo_tpot_ms": "slo.tpot_ms",
    "seed": "seed",
    "name": "name",
    "live": "live.enabled",
    "live_backend": "live.backend",
    "live_device": "live.device",
    "live_time": "live.time",
    "replicas": "deployment.replicas",
    "router": "deployment.router",
    "prefill_replicas": "disaggregation.prefill_replicas",
    "prefill_gpu": "disaggregation.prefill_gpu",
    "prefill_tensor": "disaggregation.prefill_tensor",
    "kv_link": "disaggregation.link",
}
#: ``--graph-sizes``: one list in two units (``sim/buckets/demand.py`` and ``planner/config.py``).
GRAPH_SIZES_HELP = (
    "CUDA-graph sizes, e.g. 1,2,4,8,16,32, in two units: a spec or decode graph of size s "
    "holds s rows (a spec graph s*Q tokens, a decode graph s tokens), and only sizes up to "
    "max-num-seqs serve as row counts; a mixed graph's size counts tokens, as vLLM's "
    "capture sizes do (its rows take the smallest row size that fits)"
)
#: ``compare``'s per-side flags (``--a-host-cost``, ...), each overriding its ``OVERRIDES`` key.
SIDE_FLAGS = ("host_cost", "graph_mode", "graph_sizes", "scheduler")
#: ``--acceptance`` choices: a model, or a preset of per-position probabilities.
ACCEPTANCE_PRESETS = {"deepseek-mtp": DEEPSEEK_MTP_PROBS, "eagle3": EAGLE3_PROBS}


def _toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word such as mixed


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``["section.key=value", ...]`` as settings; values are TOML (bare words are text)."""
    settings: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        settings[key.strip()] = _toml_value(value.strip())
    return settings


def _acceptance_settings(choice: str | None) -> dict[str, Any]:
    if choice is None:
        return {}
    if choice in ACCEPTANCE_PRESETS:
        return {"acceptance.model": "per-position", "acceptance.probs": ACCEPTANCE_PRESETS[choice]}
    return {"acceptance.model": choice}


def build_config(
    args: argparse.Namespace, config_path: str | None = None, *, check: bool = True
) -> SimConfig:
    """Defaults, then the TOML file, then ``--set`` items, then explicit flags; with
    ``check``, the result is :func:`checked`."""
    config = SimConfig()
    path = config_path if config_path is not None else args.config
    if path:
        config = load_config(path, config)
    try:
        config = with_settings(config, parse_assignments(args.set))
    except ConfigError as exc:
        raise ConfigError(f"--set: {exc}") from None
    flags = {key: getattr(args, dest) for dest, key in OVERRIDES.items()}
    flags.update(_acceptance_settings(args.acceptance))
    config = with_settings(config, flags)
    return checked(config) if check else config


def checked(config: SimConfig) -> SimConfig:
    """``config`` once the rules across its settings hold, the planner takes it and the
    files it names (kernel profile, acceptance trace) read, so that every refusal comes
    before anything runs or is written."""
    check_config(config)
    plan = config.plan  # the planner's refusals, before anything runs
    load_profile(config.cost.kernel_profile)
    if config.cost.profile is not None:
        engine = read_engine_profile(config.cost.profile)
        engine.check_setup(*engine_setup(config, plan))
    check_live(config)
    if config.scheduler.implementation == "vllm":
        check_vllm()
    if config.acceptance.model == "replay" and config.acceptance.trace:
        load_replay(config.acceptance.trace)
    return config


def run_name(args: argparse.Namespace, config: SimConfig) -> str:
    if config.name:
        return config.name
    if args.trace is None:
        return Path(EMBEDDED_TRACE).stem
    if args.trace.startswith(SYNTHETIC_PREFIX):
        return "synthetic"
    if args.trace == STDIN:
        return "stdin"
    return Path(args.trace).stem


def format_table(columns: list[tuple[str, dict[str, Any]]]) -> str:
    """Summaries side by side: one labelled column per ``(label, summary)``."""
    rows = [summary_rows(summary) for _, summary in columns]
    labels = [label for label, _ in rows[0]]
    header = ["", *(label for label, _ in columns)]
    body = [[label, *(r[i][1] for r in rows)] for i, label in enumerate(labels)]
    return align(header, body)


def _add_trace_options(parser: argparse.ArgumentParser, *, parquet: bool = True) -> None:
    parser.add_argument(
        "trace",
        nargs="?",
        help="trace file (any supported format; - is standard input, and pipes are read "
        "once) or synthetic:key=value,...; default: the first 1,000 requests of the "
        "embedded Azure code trace",
    )
    parser.add_argument("--format", choices=FORMATS, help="trace format (default: detected)")
    parser.add_argument(
        "--out",
        help="results folder: new or empty (default: a new results/<name>-<settings digest>)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="reuse a results folder of an earlier run: replaces the files its "
        "stepplan-manifest.json lists, nothing else",
    )
    if parquet:
        parser.add_argument("--parquet", action="store_true", help="Parquet files (needs pyarrow)")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress, no table (a results folder stepplan named is still printed)",
    )


def add_setting_options(parser: argparse.ArgumentParser) -> None:
    """The settings' flags: ``--config``, ``--set``, and a flag for each common setting,
    section by section in the order ``--help`` lists them."""
    add = parser.add_argument
    add("--config", help="TOML settings file (`stepplan config` prints one)")
    add("--set", action="append", metavar="SECTION.KEY=VALUE", help="any setting (repeatable)")
    add("--name", help="run name: one folder name under results/")
    add("--seed", type=int, help="seed of the acceptance draws and of synthetic arrivals")
    add(
        "--limit",
        type=int,
        help="keep the first N requests and stop reading the trace there",
    )
    _add_engine_options(parser)
    _add_cost_options(parser)
    _add_acceptance_options(parser)
    _add_workload_options(parser)
    _add_live_options(parser)
    _add_deployment_options(parser)


def _add_deployment_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--replicas",
        type=int,
        help="engine replicas behind the router, each a whole engine with these settings "
        "(more than one adds a replica column to steps.csv and requests.csv)",
    )
    add(
        "--router",
        choices=ROUTER_NAMES,
        help="which replica an arriving request goes to: "
        + "; ".join(f"{entry.name}: {entry.description}" for entry in ROUTERS),
    )
    add(
        "--prefill-replicas",
        type=int,
        help="replicas of a prefill pool apart from the decode pool (--replicas, gpu.name, "
        "parallel.tensor); 0: prefill and decode on the same replicas",
    )
    add("--prefill-gpu", help="the prefill pool's GPU preset")
    add("--prefill-tensor", type=int, help="the prefill pool's tensor-parallel ranks")
    add(
        "--kv-link",
        choices=KV_LINK_NAMES,
        help="the link a request's KV blocks and conv state cross from its prefill "
        "replica to its decode replica (docs/presets.md)",
    )


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--num-spec-tokens", type=int, help="drafts per spec step (Q - 1); 0: no spec")
    add("--max-num-seqs", type=int, help="most requests running at once")
    add("--max-num-batched-tokens", type=int, help="token budget per step, lookahead included")
    add("--slot-capacity", type=int, help="conv-state slots")
    add("--num-groups", type=int, help="layer groups")
    orders = "; ".join(f"{name}: {policy.description}" for name, policy in POLICIES.items())
    add(
        "--policy",
        choices=tuple(POLICIES),
        help=f"admission order of waiting requests ({orders}; ties in arrival order)",
    )
    add(
        "--policy-age-limit-s",
        type=float,
        help="a request waiting longer than this many seconds is admitted first, the oldest first",
    )
    add(
        "--scheduler",
        choices=SCHEDULER_IMPLEMENTATIONS,
        help="whose decisions schedule the steps: stepplan's own scheduler, or the installed "
        "vLLM's (docs/scheduler_vllm.md)",
    )
    add(
        "--max-model-len",
        type=int,
        help="context in tokens: longer requests (prompt + output) are rejected",
    )
    add(
        "--graph-mode",
        choices=GRAPH_MODES,
        help="none: every step eager; full: CUDA graphs for pure spec or pure decode steps; "
        "mixed: a graph for any step that fits one",
    )
    add("--graph-sizes", help=GRAPH_SIZES_HELP)


def _add_cost_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--host-cost",
        choices=HOST_COSTS,
        help="host time per step: model (deterministic), measured (the planner's "
        "real time; results then vary run to run) or seed (the seed builder's 250/900 us)",
    )
    add(
        "--profile",
        help="engine profile JSON of `stepplan profile`: steps it covers take its measured "
        "engine's predicted time instead of the roofline",
    )
    add(
        "--kernel-profile",
        help="kernel profile JSON, or public for SPEC §4's public kernel",
    )


def _add_acceptance_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--acceptance",
        choices=(*ACCEPTANCE_MODELS, *ACCEPTANCE_PRESETS),
        help="acceptance model, or a preset of per-position probabilities",
    )
    add("--acceptance-probs", help="per-position acceptance, e.g. 0.9,0.8,0.7")
    add("--acceptance-length", type=float, help="mean acceptance length for 'fixed'")
    add("--acceptance-trace", help="JSONL of accepted counts for 'replay'")


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rate-scale", type=float, help="arrival-rate multiplier")
    add("--start-s", type=float, help="window start, trace seconds")
    add("--end-s", type=float, help="window end, trace seconds")
    add(
        "--rate",
        type=float,
        help="req/s for traces without arrival times",
    )
    add("--slo-ttft-ms", type=float, help="TTFT objective of a good request")
    add("--slo-tpot-ms", type=float, help="TPOT objective of a good request")


def _add_live_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--live",
        action="store_const",
        const=True,
        help="live mode: a real toy model (settings: [live]) runs every step and its greedy "
        "tokens decide what the drafts accept, in place of the acceptance model",
    )
    add(
        "--live-backend",
        choices=LIVE_BACKENDS,
        help="executor backend",
    )
    add("--live-device", choices=LIVE_DEVICES, help="where the toy model runs")
    add(
        "--live-time",
        choices=LIVE_TIMES,
        help="step time in live mode: model (the cost model, deterministic on a given backend) "
        "or measured (the model run's wall time replaces the model, short-conv and "
        "launch terms; results then vary run to run)",
    )


def results_folder(
    args: argparse.Namespace,
    config: SimConfig,
    key: object,
    *,
    kind: str = "simulate",
    names: tuple[str, ...] = RESULT_FILES,
) -> ResultsFolder:
    """The run's results folder, checked and locked before any work: ``--out``, or a new
    ``results/<name>-<digest of key>`` (``results/<--name>`` when named; ``-2``, ``-3``,
    ... when taken). ``key`` is what makes runs differ: the trace spec and settings."""
    if args.out:
        return ResultsFolder.claim(args.out, kind=kind, overwrite=args.overwrite, names=names)
    name = run_name(args, config)
    stem = name if config.name else f"{name}-{config_digest(key)}"
    if kind == "compare":
        stem = f"compare-{stem}"
    return claim_new(RESULTS_PARENT, stem, kind=kind, overwrite=args.overwrite, names=names)


def run_progress(
    args: argparse.Namespace, total: int, label: str, *, stoppable: bool = True
) -> Progress | None:
    """Progress of a simulation of ``total`` requests on stderr: a bar on a terminal,
    plain lines elsewhere; none with ``--quiet``. ``stoppable``: Ctrl-C keeps the
    steps so far (the first line says so)."""
    if args.quiet:
        return None
    if sys.stderr.isatty():
        if label:
            print(f"simulating {label} ...", file=sys.stderr)
        return ProgressBar(total, sys.stderr)
    return ProgressLines(total, sys.stderr, label=label, stoppable=stoppable)


def simulate_one(
    args: argparse.Namespace, config: SimConfig, folder: ResultsFolder, label: str = ""
) -> dict[str, Any]:
    """Load the trace, simulate it and write the results into ``folder`` as the run goes
    (``writer.py``); its summary. A first Ctrl-C/SIGTERM (``args.stop``) stops the loop;
    what is left of the results is written, then :class:`~.signals.Interrupted` says
    where."""
    stop: StopRequest = getattr(args, "stop", None) or StopRequest()
    requests = load_requests(args, config)
    origin = provenance(getattr(args, "argv", None), identify(args.trace, requests), config)
    if args.parquet and not parquet_available():
        print("stepplan: pyarrow is not installed; writing CSV", file=sys.stderr)
    warning = None if args.quiet else live_warning(requests, config)
    if warning:
        print(warning, file=sys.stderr)
    with stop.deferred() as event:
        progress = run_progress(args, requests.num_requests, label)
        parquet = args.parquet and parquet_available()
        with ResultsWriter(folder, parquet=parquet, stop=event) as writer:
            if config.deployment.replicas > 1 or config.disaggregation.enabled:
                run = run_disaggregated if config.disaggregation.enabled else run_deployment
                deployed = run(requests, config, writer, progress=progress, stop=event)
                rows, summary = None, deployed.summary
                for first in range(0, requests.num_requests, CHUNK_STEPS):
                    writer.add_request_columns(deployed.request_columns(first, first + CHUNK_STEPS))
            else:
                end = run_steps(
                    requests, config, writer, progress=progress, stop=event, keep_gaps=False
                )
                rows, summary = end.rows, end.summary
            if summary["steps"]["count"] == 0 and event.is_set():
                stop.raise_if_stopped("stopped before the first step, nothing written")
            summary = {**summary, "provenance": origin}
            writer.finish(summary, rows)
    if summary["complete"]:
        stop.raise_if_stopped(f"the run had finished: results in {folder.shown}/")
    stop.raise_if_stopped(
        f"{summary['steps']['count']:,} steps simulated, {summary['finished_requests']:,} of "
        f"{summary['requests']:,} requests finished: partial results in {folder.shown}/ "
        '(summary.json "complete": false)'
    )
    return summary


def add_run_command(
    subparsers: Any,
    name: str,
    handler: Callable[[argparse.Namespace], int],
    *,
    parquet: bool = True,
    **texts: str,
) -> argparse.ArgumentParser:
    """A subcommand that simulates a trace: its parser with the trace and setting options
    (``--parquet`` only where the command writes a run's tables)."""
    parser = subparsers.add_parser(name, **texts)
    _add_trace_options(parser, parquet=parquet)
    add_setting_options(parser)
    parser.set_defaults(handler=handler)
    return parser
