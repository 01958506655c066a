"""``stepplan results list`` and ``stepplan results clean``: the results folders stepplan
wrote (those with ``stepplan-manifest.json``, ``sim/results/outdir.py``), and removing them.

``clean`` removes only what a folder's manifest lists, its stale staging folders and
files stepplan marks as its own (a report, a figure, a graph-size file); whatever else
is in a folder is the user's and stays, with the folder. Without ``--yes`` it only says
what it would remove.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from ..results.outdir import FolderBusy, OutDirError, read_manifest
from ..results.outdir_clean import Cleaning, clean_folder, stepplan_folders
from ..results.outfile import file_sample
from .options import RESULTS_PARENT
from .outputs import FIGURE, GRAPH_SIZES, REPORT
from .tables import align

#: Single-file kinds whose stepplan mark makes a file in a results folder stepplan's.
MARKED_KINDS = (REPORT, FIGURE, GRAPH_SIZES)


def marked_by_stepplan(path: Path) -> bool:
    """Whether ``path`` is a report, figure or graph-size file stepplan wrote."""
    try:
        sample = file_sample(path)
    except OSError:
        return False
    return any(kind.recognise(sample) for kind in MARKED_KINDS)


def _folders(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if not Path(path).exists():
            raise OutDirError(f"{path}: no such folder")
        found += stepplan_folders(path)
    return found


def _size_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _written_at(manifest: dict[str, Any]) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(manifest.get("written_at")))
    except ValueError:
        return None


def run_list(args: argparse.Namespace) -> int:
    """``stepplan results list``: one line per stepplan folder."""
    folders = _folders(args.folders)
    if not folders:
        print(f"no results folders stepplan wrote in {', '.join(args.folders)}")
        return 0
    body = []
    for folder in folders:
        manifest = read_manifest(folder) or {}
        written = _written_at(manifest)
        listed = set(manifest.get("entries", ())) | {"stepplan-manifest.json"}
        others = [p.name for p in folder.iterdir() if p.name not in listed]
        body.append(
            [
                str(folder),
                str(manifest.get("kind")),
                "-" if written is None else written.strftime("%Y-%m-%d %H:%M"),
                "yes" if manifest.get("complete") else "no",
                f"{_size_bytes(folder) / 2**20:,.1f}",
                ", ".join(sorted(others)) or "-",
            ]
        )
    header = ["folder", "kind", "written (UTC)", "complete", "MiB", "other files"]
    print(align(header, body))
    print(
        f"{len(folders)} folder(s); `stepplan results clean` removes what stepplan wrote "
        "(never other files)"
    )
    return 0


def run_clean(args: argparse.Namespace) -> int:
    """``stepplan results clean``: remove stepplan's folders (with ``--yes``)."""
    if args.older_than is not None and args.older_than < 0:
        raise OutDirError(f"--older-than: must be at least 0 days, got {args.older_than}")
    now = dt.datetime.now(dt.timezone.utc)
    chosen = []
    for folder in _folders(args.folders):
        written = _written_at(read_manifest(folder) or {})
        old_enough = args.older_than is None or (
            written is not None and (now - written).total_seconds() >= args.older_than * 86400
        )
        if old_enough:
            chosen.append(folder)
    freed, removed_folders = 0, 0
    for folder in chosen:
        size = _size_bytes(folder)
        try:
            cleaning = clean_folder(folder, ours=marked_by_stepplan, apply=args.yes)
        except FolderBusy as exc:
            print(f"stepplan: skipped: {exc}", file=sys.stderr)
            continue
        freed += size - sum(p.stat().st_size for p in cleaning.kept if p.is_file())
        removed_folders += cleaning.folder_removed
        _say(cleaning, args.yes)
    verb = "removed" if args.yes else "would remove"
    print(
        f"{verb} {removed_folders} of {len(chosen)} folder(s) whole, "
        f"{freed / 2**20:,.1f} MiB" + ("" if args.yes else "; --yes removes them")
    )
    return 0


def _say(cleaning: Cleaning, applied: bool) -> None:
    verb = "removed" if applied else "would remove"
    if cleaning.folder_removed:
        print(f"{verb} {cleaning.folder}/")
        return
    files = sum(1 for p in cleaning.removed if p != cleaning.folder)
    kept = ", ".join(str(p.relative_to(cleaning.folder)) for p in cleaning.kept)
    print(f"{verb} {files} entries of {cleaning.folder}/, keeping the user's: {kept}")


def add_results(subparsers: Any) -> None:
    """``results list|clean [FOLDER ...]``."""
    parser = subparsers.add_parser(
        "results",
        help="list or remove the results folders stepplan wrote",
        description="Results folders are the ones with stepplan-manifest.json. Each FOLDER "
        "is such a folder or a folder holding them. `clean` removes only what stepplan "
        "wrote (the manifest's entries, stepplan's reports and figures); other files stay, "
        "with their folder.",
    )
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, handler, text in (
        ("list", run_list, "one line per results folder: kind, date, size, other files"),
        ("clean", run_clean, "remove results folders stepplan wrote (--yes to do it)"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "folders",
            nargs="*",
            default=[RESULTS_PARENT],
            metavar="FOLDER",
            help=f"results folders, or folders holding them (default: {RESULTS_PARENT}/)",
        )
        sub.set_defaults(handler=handler)
        if name == "clean":
            sub.add_argument(
                "--older-than",
                type=float,
                metavar="DAYS",
                help="only folders written at least DAYS days ago (default: all)",
            )
            sub.add_argument(
                "--yes", action="store_true", help="remove them (default: only say what would go)"
            )
