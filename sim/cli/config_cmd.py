"""``stepplan config``: the effective settings as TOML, which ``--config`` reads back."""

from __future__ import annotations

import argparse
from typing import Any

from ..settings.config_toml import config_toml
from .options import add_setting_options, build_config
from .provenance import stepplan_version


def run_config(args: argparse.Namespace) -> int:
    """``stepplan config``: print the settings the same flags would give ``simulate``."""
    header = (
        f"stepplan {stepplan_version()} settings: "
        "`stepplan simulate --config FILE` reads this file back"
    )
    print(config_toml(build_config(args), header), end="")
    return 0


def add_config(subparsers: Any) -> None:
    """``config [setting options]``."""
    parser = subparsers.add_parser(
        "config",
        help="print the effective settings as TOML (a file --config reads back)",
        description="Print the settings simulate would run with, as TOML: the defaults, "
        "then the --config file, then --set items, then the flags. Settings left unset "
        "(TOML has no null) appear as comments and read back as their defaults.",
    )
    add_setting_options(parser)
    parser.set_defaults(handler=run_config)
