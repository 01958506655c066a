"""``stepplan compare``: one trace under two configurations.

The runs go to ``OUT/a/`` and ``OUT/b/``; their table, with ``B - A`` and ``(B - A) / A``
columns, is printed and saved as ``OUT/compare.csv`` and ``OUT/compare.json``
(``tables.py``), and ``stepplan report OUT`` reports both."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from stepplan.planner import GRAPH_MODES

from ..results.outdir import ResultsFolder
from ..results.schema import RESULT_FILES
from ..settings.config import HOST_COSTS, SCHEDULER_IMPLEMENTATIONS, SimConfig, with_settings
from .options import (
    OVERRIDES,
    SIDE_FLAGS,
    add_run_command,
    build_config,
    checked,
    parse_assignments,
    results_folder,
    simulate_one,
)
from .report_verdict import side_labels
from .tables import (
    COMPARE_FILES,
    CompareTable,
    compare_csv,
    compare_json,
    compare_table,
    run_header,
)
from .trace_reading import TraceCache, read_limit

SIDES = ("a", "b")


def _side_config(args: argparse.Namespace, side: str) -> SimConfig:
    config = build_config(args, getattr(args, f"{side}_config") or args.config, check=False)
    settings = parse_assignments(getattr(args, f"{side}_set"))
    for flag in SIDE_FLAGS:
        settings[OVERRIDES[flag]] = getattr(args, f"{side}_{flag}")
    return checked(with_settings(config, settings))  # both sides, before either runs


def run_compare(args: argparse.Namespace) -> int:
    """``stepplan compare``: the same trace under two configurations, side by side."""
    configs = {side: _side_config(args, side) for side in SIDES}
    args.traces = TraceCache()  # both runs' reads, before either runs (a pipe is read once)
    for config in configs.values():
        args.traces.read(args.trace, args.format, config, read_limit(config))
    key = {"trace": args.trace, "format": args.format}
    key.update({side: config.to_dict() for side, config in configs.items()})
    titles = dict(zip(SIDES, side_labels(*(configs[s].to_dict() for s in SIDES)), strict=True))
    labels = {side: getattr(args, f"{side}_label") or titles[side] for side in configs}
    summaries: dict[str, dict[str, Any]] = {}
    table = None
    with contextlib.ExitStack() as stack:
        # The compare folder is stepplan's too: its manifest lists a/, b/ and the table;
        # all three folders are claimed before either run starts.
        base = stack.enter_context(
            results_folder(args, configs["a"], key, kind="compare", names=SIDES + COMPARE_FILES)
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
                summaries[side] = simulate_one(args, config, folders[side], labels[side])
            table = compare_table((labels["a"], labels["b"]), summaries["a"], summaries["b"])
            base.put(lambda stage: _write_table(stage, table), complete=False)
        finally:
            written = [side for side in SIDES if folders[side].placed]
            if written:
                tables = list(COMPARE_FILES) if table is not None else []
                base.record(written + tables, complete=len(summaries) == len(SIDES))
    if not args.quiet:
        headers = {side: run_header(summary) for side, summary in summaries.items()}
        if headers["a"] == headers["b"]:
            print(headers["a"])
        else:
            print("\n".join(f"{side.upper()}: {header}" for side, header in headers.items()))
        print(table.format())
    if not args.quiet or not args.out:  # a folder stepplan named is always said
        shown = base.shown
        print(f"\nresults: {shown}/a/ and {shown}/b/; table: {shown}/compare.csv, .json")
    return 0


def _write_table(stage: Path, table: CompareTable) -> list[str]:
    """``compare.csv`` and ``compare.json`` into the staging folder; their names."""
    for name, text in zip(COMPARE_FILES, (compare_csv(table), compare_json(table)), strict=True):
        (stage / name).write_text(text)
    return list(COMPARE_FILES)


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
        run = f"run {side.upper()}"
        add(
            f"--{side}-label",
            help=f"column title of {run} (default: {side.upper()} and the settings it "
            f"differs in, as {side.upper()}: host_cost={'model' if side == 'a' else 'seed'})",
        )
        add(f"--{side}-config", help=f"TOML settings of {run} (default: --config)")
        add(
            f"--{side}-set",
            action="append",
            metavar="SECTION.KEY=VALUE",
            help=f"a setting of {run} only, over the shared ones (repeatable)",
        )
        add(
            f"--{side}-host-cost",
            choices=HOST_COSTS,
            help=f"--host-cost of {run} (default: the shared one)",
        )
        add(
            f"--{side}-graph-mode",
            choices=GRAPH_MODES,
            help=f"--graph-mode of {run} (default: the shared one)",
        )
        add(
            f"--{side}-scheduler",
            choices=SCHEDULER_IMPLEMENTATIONS,
            help=f"--scheduler of {run}: stepplan's or vLLM's decisions (default: the shared "
            "one; stepplan scheduler-diff compares them step by step)",
        )
        add(
            f"--{side}-graph-sizes",
            help=f"--graph-sizes of {run}, in the units --graph-sizes gives "
            "(default: the shared one)",
        )
