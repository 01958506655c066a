"""``stepplan compare``: one trace under two configurations."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stepplan.planner import GRAPH_MODES

from ..config import HOST_COSTS, SimConfig, with_settings
from .options import (
    OVERRIDES,
    SIDE_FLAGS,
    add_run_command,
    build_config,
    checked,
    format_table,
    parse_assignments,
    run_name,
    simulate_one,
)


def _side_config(args: argparse.Namespace, side: str) -> SimConfig:
    config = build_config(args, getattr(args, f"{side}_config") or args.config, check=False)
    settings = parse_assignments(getattr(args, f"{side}_set"))
    for flag in SIDE_FLAGS:
        settings[OVERRIDES[flag]] = getattr(args, f"{side}_{flag}")
    return checked(with_settings(config, settings))  # both sides, before either runs


def run_compare(args: argparse.Namespace) -> int:
    """``stepplan compare``: the same trace under two configurations, side by side."""
    configs = {side: _side_config(args, side) for side in ("a", "b")}
    base = Path(args.out or Path("results") / f"compare-{run_name(args, configs['a'])}")
    labels = {side: getattr(args, f"{side}_label") or side.upper() for side in configs}
    summaries = []
    for side, config in configs.items():
        result = simulate_one(args, config, base / side, labels[side])
        summaries.append((labels[side], result.summary))
    if not args.quiet:
        print(format_table(summaries))
        print(f"\nresults: {base}/a/ and {base}/b/")
    return 0


def add_compare(subparsers: Any) -> None:
    """``compare [TRACE] --a-... --b-...``."""
    parser = add_run_command(
        subparsers,
        "compare",
        run_compare,
        help="run two configurations on the same trace and print them side by side",
        description="Shared options apply to both runs; --a-*/--b-* options to one side "
        "(for example --b-host-cost seed, or --a-graph-sizes/--b-graph-sizes).",
    )
    for side in ("a", "b"):
        add = parser.add_argument
        add(f"--{side}-label", help=f"column title of run {side.upper()}")
        add(f"--{side}-config", help=f"TOML settings of run {side.upper()}")
        add(f"--{side}-set", action="append", metavar="SECTION.KEY=VALUE")
        add(f"--{side}-host-cost", choices=HOST_COSTS)
        add(f"--{side}-graph-mode", choices=GRAPH_MODES)
        add(f"--{side}-graph-sizes", help="CUDA-graph sizes, e.g. 1,2,4,8")
