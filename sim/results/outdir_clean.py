"""Listing and removing the results folders stepplan wrote, by ``outdir.py``'s rule: a
folder is stepplan's when it carries a manifest, and of it only what the manifest lists
(and what stepplan marks as its own) is stepplan's to remove; the rest is the user's."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .outdir import MANIFEST, STAGING_PREFIX, FolderTaken, OutDirError, lock_folder, read_manifest


def stepplan_folders(path: str | Path) -> list[Path]:
    """``path`` itself when it is a stepplan folder, else its sub-folders that are (by
    name); a folder without a readable manifest is not stepplan's and is left out."""
    path = Path(path)

    def is_ours(folder: Path) -> bool:
        try:
            return not folder.is_symlink() and read_manifest(folder) is not None
        except OutDirError:
            return False

    if is_ours(path):
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and is_ours(p))


class Cleaning:
    """What cleaning a stepplan folder removes and what it keeps (the user's).

    Attributes:
        folder: the folder. removed: files and folders stepplan wrote, deepest first
            (the folder itself last when nothing of the user's is left in it).
        kept: what is left as it was: files the manifest does not list (unless
            ``ours`` recognised them), links, and folders the user's files keep.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.removed: list[Path] = []
        self.kept: list[Path] = []

    @property
    def folder_removed(self) -> bool:
        """Whether the folder itself goes (nothing of the user's in it)."""
        return bool(self.removed) and self.removed[-1] == self.folder


def clean_folder(
    path: str | Path, *, ours: Callable[[Path], bool] = lambda _: False, apply: bool = False
) -> Cleaning:
    """Remove what stepplan wrote into the stepplan folder ``path`` (only with ``apply``;
    else say what would go). Removed: the entries its manifest lists -- files, and
    listed sub-folders: one with a manifest of its own by this same rule, one without
    (a sweep's ``points/``) its ``.json`` records -- stale staging folders, other files
    ``ours`` recognises by their stepplan mark (a report, a figure), then the manifest
    and the folder once empty. Never a link or anything else: a folder that still holds
    the user's files stays, with them. The folder is locked as a run's is
    (:class:`FolderBusy` while a run holds it); one without a manifest is refused
    (:class:`FolderTaken`)."""
    path = Path(path)
    fd = lock_folder(path, str(path))
    try:
        if read_manifest(path) is None:
            raise FolderTaken(f"{path}: holds no {MANIFEST}: not a folder stepplan wrote")
        cleaning = Cleaning(path)
        _clean_into(cleaning, path, ours, apply)
        return cleaning
    finally:
        os.close(fd)


def _clean_into(cleaning: Cleaning, path: Path, ours: Callable[[Path], bool], apply: bool) -> None:
    manifest = read_manifest(path)
    assert manifest is not None
    listed = set(manifest["entries"])
    for item in sorted(path.iterdir()):
        if item.name == MANIFEST:
            continue
        if item.is_symlink():
            cleaning.kept.append(item)
        elif item.is_dir() and item.name.startswith(STAGING_PREFIX):
            _remove(cleaning, item, apply, tree=True)
        elif item.is_dir() and item.name in listed:
            if (item / MANIFEST).exists() and read_manifest(item) is not None:
                _clean_into(cleaning, item, ours, apply)
            else:
                _clean_records(cleaning, item, apply)
        elif item.is_file() and (item.name in listed or ours(item)):
            _remove(cleaning, item, apply)
        else:
            cleaning.kept.append(item)
    _remove(cleaning, path / MANIFEST, apply)
    _remove_if_emptied(cleaning, path, apply)


def _clean_records(cleaning: Cleaning, folder: Path, apply: bool) -> None:
    """A listed sub-folder without a manifest: the records ``put_into`` wrote."""
    for item in sorted(folder.iterdir()):
        ours = item.name.endswith(".json") or item.name.startswith(STAGING_PREFIX)
        if ours and item.is_file() and not item.is_symlink():
            _remove(cleaning, item, apply)
        else:
            cleaning.kept.append(item)
    _remove_if_emptied(cleaning, folder, apply)


def _remove_if_emptied(cleaning: Cleaning, folder: Path, apply: bool) -> None:
    inside = [p for p in cleaning.kept if folder in p.parents]
    if not inside:
        _remove(cleaning, folder, apply, folder=True)


def _remove(
    cleaning: Cleaning, path: Path, apply: bool, *, tree: bool = False, folder: bool = False
) -> None:
    if apply:
        if tree:
            shutil.rmtree(path)
        elif folder:
            path.rmdir()
        else:
            path.unlink()
    cleaning.removed.append(path)
