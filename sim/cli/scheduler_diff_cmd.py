"""``stepplan scheduler-diff``: stepplan's scheduler against the installed vLLM's on one
trace and cost model, decision by decision (``sim/scheduler_diff.py``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..scheduler_diff import compare_schedulers
from ..settings.config import SCHEDULER_IMPLEMENTATIONS, with_settings
from ..traces import FORMATS
from .options import add_setting_options, build_config, checked
from .trace_reading import load_requests


def run_scheduler_diff(args: argparse.Namespace) -> int:
    """Run the trace under both schedulers and print where their decisions differ."""
    config = build_config(args, check=False)
    sides = (args.a_scheduler, args.b_scheduler)
    configs = [checked(with_settings(config, {"scheduler.implementation": name})) for name in sides]
    table = load_requests(args, configs[0])
    diff = compare_schedulers(table, configs[0], configs[1], sides)
    print(json.dumps(diff.to_dict(), indent=1) if args.json else diff.format())
    return 0


def add_scheduler_diff(subparsers: Any) -> None:
    """``scheduler-diff [TRACE] [--a-scheduler NAME] [--b-scheduler NAME] [options]``."""
    parser = subparsers.add_parser(
        "scheduler-diff",
        help="run two schedulers (stepplan's, vLLM's) on one trace and compare every step",
        description="Both runs share the trace, cost and acceptance models and settings; "
        "step i of one is set against step i of the other (same requests and token "
        "counts). Prints the share of identical steps, the first divergence with the "
        "steps before it, and preemptions, prefix hits, TTFT, TPOT and throughput side "
        "by side (docs/scheduler_vllm.md).",
    )
    add = parser.add_argument
    add("trace", nargs="?", help="trace file or synthetic:...; default: the embedded trace")
    add("--format", choices=FORMATS, help="trace format (default: detected)")
    add(
        "--a-scheduler",
        choices=SCHEDULER_IMPLEMENTATIONS,
        default="stepplan",
        help="run A's (default: stepplan)",
    )
    add(
        "--b-scheduler",
        choices=SCHEDULER_IMPLEMENTATIONS,
        default="vllm",
        help="run B's (default: vllm)",
    )
    add("--json", action="store_true", help="print the comparison as JSON")
    add_setting_options(parser)
    parser.set_defaults(handler=run_scheduler_diff)
