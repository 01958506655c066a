"""The ``stepplan`` command line."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stepplan`` console script."""
    parser = argparse.ArgumentParser(prog="stepplan")
    parser.parse_args(argv)
    return 0
