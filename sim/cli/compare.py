"""``stepplan compare``: one trace under two configurations."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from stepplan.planner import GRAPH_MODES

from ..config import HOST_COSTS, SimConfig, with_settings
from ..outdir import ResultsFolder
from ..results import RESULT_FILES
from .options import (
    OVERRIDES,
    SIDE_FLAGS,
    add_run_command,
    build_config,
    format_table,
    parse_assignments,
    results_folder,
    simulate_one,
)

SIDES = ("a", "b")


def _side_config(args: argparse.Namespace, side: str) -> SimConfig:
    config = build_config(args, getattr(args, f"{side}_config") or args.config)
    settings = parse_assignments(getattr(args, f"{side}_set"))
    for flag in SIDE_FLAGS:
        settings[OVERRIDES[flag]] = getattr(args, f"{side}_{flag}")
    return with_settings(config, settings)


def run_compare(args: argparse.Namespace) -> int:
    """``stepplan compare``: the same trace under two configurations, side by side."""
    configs = {side: _side_config(args, side) for side in SIDES}
    key = {"trace": args.trace, "format": args.format}
    key.update({side: config.to_dict() for side, config in configs.items()})
    labels = {side: getattr(args, f"{side}_label") or side.upper() for side in configs}
    summaries = []
    with contextlib.ExitStack() as stack:
        # The compare folder is stepplan's too: its manifest lists a/ and b/, each a
        # results folder of its own; all three are claimed before either run starts.
        base = stack.enter_context(
            results_folder(args, configs["a"], key, kind="compare", names=SIDES)
        )
        folders = {
            side: stack.enter_context(
                ResultsFolder.claim(
                    Path(base.shown) / side, overwrite=args.overwrite, names=RESULT_FILES
                )
            )
            for side in SIDES
        }
        try:
            for side, config in configs.items():
                result = simulate_one(args, config, folders[side], labels[side])
                summaries.append((labels[side], result.summary))
        finally:
            written = [side for side in SIDES if folders[side].placed]
            if written:
                base.record(written, complete=len(summaries) == len(SIDES))
    if not args.quiet:
        print(format_table(summaries) + "\n")
    if not args.quiet or not args.out:  # a folder stepplan named is always said
        print(f"results: {base.shown}/a/ and {base.shown}/b/")
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
