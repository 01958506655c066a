"""``stepplan simulate``."""

from __future__ import annotations

import argparse
from typing import Any

from .options import (
    add_run_command,
    build_config,
    format_table,
    results_folder,
    run_name,
    simulate_one,
)
from .report import add_report_option, claim_report, report_after_simulation
from .tables import command_wall, run_header


def run_simulate(args: argparse.Namespace) -> int:
    """``stepplan simulate``: one simulation, results written, summary printed."""
    config = build_config(args)
    name = run_name(args, config)
    key = {"trace": args.trace, "format": args.format, "config": config.to_dict()}
    with results_folder(args, config, key) as folder:
        report_file = None
        if args.report is not None:  # checked with the folder, before the run
            report_file = claim_report(args.report or folder.path / "report.html", args.overwrite)
        summary = simulate_one(args, config, folder)
        report = report_after_simulation(folder.path, report_file, args.quiet)
    if not args.quiet:
        print(run_header(summary))
        print(format_table([(name, summary)]) + "\n")
    if not args.quiet or not args.out:  # a folder stepplan named is always said
        print(f"results: {folder.shown}/ ({command_wall(args, summary)})")
    if report is not None and not args.quiet:
        print(f"report: {report}")
    return 0


def add_simulate(subparsers: Any) -> None:
    """``simulate [TRACE] [options]``."""
    parser = add_run_command(
        subparsers,
        "simulate",
        run_simulate,
        help="replay a trace through the scheduler, planner and cost model",
        description="Replay a trace (default: the first 1,000 requests of the embedded Azure "
        "code trace) through the continuous-batching scheduler with the real planner in "
        "every step.",
    )
    add_report_option(parser)
