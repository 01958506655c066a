"""The ``stepplan`` command line (``stepplan.sim.cli``).

Each subcommand is one ``add_<name>(subparsers)`` function that builds its parser and
sets ``handler`` (a function of the parsed arguments returning the exit code);
:data:`SUBCOMMANDS` lists them. Adding a subcommand is one such function and one
entry in that tuple.
Modules: ``options`` (what the simulating commands share), ``simulate``, ``compare``,
``buckets``, ``report``, ``config_cmd`` (``stepplan config``), ``sweep`` and
``capacity_cmd`` (with ``sweep_run``, what they share), ``results_cmd`` (``stepplan
results list|clean``); ``helptext`` (help that
shows every default), ``provenance`` (what ``summary.json`` records to run it again) and
``tables`` (what is printed and saved about runs). Only this package of the simulator
imports ``stepplan.plots``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from ..acceptance import AcceptanceError
from ..results.outdir import OutDirError
from ..settings.config import ConfigError, with_settings
from ..sweep.ray_runner import RayMissing
from ..sweep.search import SearchError
from ..sweep.spec import SweepError
from ..timing.cost import ProfileError
from ..timing.engine_profile import EngineProfileError
from ..traces import TraceError
from ..workloads import WorkloadError
from .buckets import ERRORS as BUCKET_ERRORS
from .buckets import add_buckets
from .capacity_cmd import add_capacity
from .compare import add_compare, run_compare
from .config_cmd import add_config
from .fidelity import add_fidelity
from .helptext import Parser, UsageError
from .options import build_config
from .profile import ERRORS as PROFILE_ERRORS
from .profile import add_profile
from .provenance import stepplan_version
from .report import ERRORS as REPORT_ERRORS
from .report import add_report
from .results_cmd import add_results
from .scheduler_diff_cmd import add_scheduler_diff
from .signals import Interrupted, stop_on_signals
from .simulate import add_simulate
from .sweep import add_sweep
from .trace_reading import load_requests

USER_ERRORS = (ConfigError, TraceError, WorkloadError, ProfileError, AcceptanceError, OSError)
USER_ERRORS += (OutDirError, EngineProfileError)
USER_ERRORS += REPORT_ERRORS + BUCKET_ERRORS + PROFILE_ERRORS
USER_ERRORS += (SweepError, SearchError, RayMissing)

__all__ = [
    "SUBCOMMANDS",
    "USER_ERRORS",
    "build_config",
    "build_parser",
    "load_requests",
    "main",
    "run_compare",
    "with_settings",
]


#: One entry per subcommand (see the module docstring).
SUBCOMMANDS: tuple[Callable[[Any], None], ...] = (
    add_simulate,
    add_compare,
    add_buckets,
    add_report,
    add_config,
    add_profile,
    add_fidelity,
    add_sweep,
    add_capacity,
    add_scheduler_diff,
    add_results,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``stepplan`` parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = Parser(
        prog="stepplan", description="Plan, replay and simulate PLE short-conv serving steps."
    )
    parser.add_argument("--version", action="version", version=f"stepplan {stepplan_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stepplan`` console script. Ctrl-C and SIGTERM end it with one
    line and exit code 130/143 (``signals.py``; handlers see them as ``args.stop``)."""
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"stepplan: error: {exc.line}", file=sys.stderr)
        return 2
    args.argv = argv  # what the provenance records
    args.started = started  # the command's wall time runs from here (tables.command_wall)
    try:
        with stop_on_signals() as args.stop:
            return args.handler(args)
    except Interrupted as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # a SIGINT before the handler was in place
        print("stepplan: interrupted by SIGINT", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        print(f"stepplan: error: {exc}", file=sys.stderr)
        return 2
