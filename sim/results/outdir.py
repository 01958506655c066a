"""Results folders: what ``--out`` may touch, and how files get into it.

stepplan never deletes, moves or replaces anything it did not write. A folder it writes
carries :data:`MANIFEST` (``stepplan-manifest.json``): the kind of run, the files (or, for
``compare``, the sub-folders) it wrote, by which program, user and host, and when. Rules:

- a new folder, or an existing empty one, is used as it is (missing parents are made);
- an existing folder with other content and no manifest is refused, naming it;
- a stepplan folder is reused only with ``overwrite``, and then only the entries its
  manifest lists are replaced or removed (or, with ``resume``, a folder of the same
  kind is taken up as it is, its entries kept: a sweep goes on where it stopped);
  anything else in it (``report.html``,
  figures, ``graph_sizes.toml`` written later by ``stepplan report``/``buckets`` or by
  hand) is the user's and is left as it is -- a file stepplan would write that the
  manifest does not list is refused;
- a file as the folder, or a path through a file, is refused.

A :class:`ResultsFolder` is claimed before any work: its checks run first, and an
exclusive ``flock`` on the folder itself is held until its files are in place, so of two
runs on one folder exactly one goes ahead and the other is told the folder is in use.
Files are written into a hidden staging folder inside the target (:data:`STAGING_PREFIX`)
and renamed into place one by one, the manifest first (listing old and new entries, so
an interruption leaves a folder stepplan still recognises) and last. A staging folder
left by a killed run is removed when the folder is next claimed. Folders and files are
made with the user's umask.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import getpass
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Collection, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST = "stepplan-manifest.json"
STAGING_PREFIX = ".stepplan-partial-"
#: Version of the manifest's layout.
MANIFEST_FORMAT = 1
#: Kinds of folder: one run's results, ``compare``'s folder of two runs, ``fidelity``'s,
#: and the folders of ``sweep`` and ``capacity`` (their points' records and runs inside).
KINDS = ("simulate", "compare", "fidelity", "sweep", "capacity")
_DIGEST_CHARS = 8
_MAX_COUNTER = 999
_CLAIM_TRIES = 5  # a folder removed between open and lock is claimed again


#: errno values that mean the device has no room (a quota counts as none).
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def no_space(error: OSError) -> bool:
    """Whether ``error`` says the device (or the user's quota) is full."""
    return error.errno in NO_SPACE


class OutDirError(ValueError):
    """A results folder that cannot be used; the message names the user's path."""


class FolderTaken(OutDirError):
    """The folder holds something this run may not replace."""


class FolderBusy(OutDirError):
    """Another stepplan run holds the folder."""


def _version() -> str:
    try:
        return metadata.version("stepplan")
    except metadata.PackageNotFoundError:
        return "unknown"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        return str(os.getuid())


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The folder's manifest, or ``None`` when it has none; an unreadable one is an
    :class:`OutDirError` (stepplan then treats the folder as not its own)."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FolderTaken(f"{path}: not a readable stepplan manifest ({exc})") from None
    entries = document.get("entries") if isinstance(document, dict) else None
    if (
        not isinstance(entries, list)
        or document.get("kind") not in KINDS
        or not all(isinstance(e, str) and _plain_name(e) for e in entries)
    ):
        raise FolderTaken(f"{path}: not a stepplan manifest (needs a kind and plain entries)")
    return document


def _plain_name(name: str) -> bool:
    """A file name without any path part (a manifest may name nothing outside its folder)."""
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _stale_staging(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(STAGING_PREFIX) and p.is_dir()]


class ResultsFolder:
    """A results folder this process holds (use :meth:`claim`, then ``with``).

    Attributes:
        path: the folder.
        shown: the path as the user gave it, for messages.
        kind: one of :data:`KINDS`.
    """

    def __init__(self, path: Path, shown: str, kind: str, fd: int, created: list[Path]) -> None:
        self.path, self.shown, self.kind = path, shown, kind
        self._fd, self._created = fd, created
        self._entries: list[str] = []
        self._placed = False
        self._stage: Path | None = None

    # ------------------------------------------------------------------ claiming

    @classmethod
    def claim(
        cls,
        path: str | Path,
        *,
        kind: str = "simulate",
        overwrite: bool = False,
        names: Collection[str] = (),
        resume: bool = False,
    ) -> ResultsFolder:
        """Check ``path`` and lock it for this process.

        ``names`` are the entries this run may write (checked against an old manifest
        when ``overwrite`` or ``resume``: with ``resume`` an earlier folder of the same
        kind is taken up without ``overwrite``). Raises :class:`FolderTaken`,
        :class:`FolderBusy` or another :class:`OutDirError`, each naming ``path`` as given.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        shown, path = str(path), Path(path)
        for _ in range(_CLAIM_TRIES):
            created = _make_folder(path, shown)
            fd = lock_folder(path, shown)  # busy: what it made stays, the holder may be using it
            if _same_folder(fd, path):
                break
            os.close(fd)  # removed or replaced between mkdir and lock: once more
        else:
            raise FolderBusy(f"{shown}: keeps changing under this run; is another one using it?")
        folder = cls(path, shown, kind, fd, created)
        try:
            folder._check(overwrite, names, resume)
        except BaseException:
            folder.release(keep=False)
            raise
        return folder

    def _check(self, overwrite: bool, names: Collection[str], resume: bool = False) -> None:
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise OutDirError(f"{self.shown}: folder is not writable")
        for stale in _stale_staging(self.path):  # left by a killed run: ours, and we hold it
            shutil.rmtree(stale, ignore_errors=True)
        entries = sorted(os.listdir(self.path))
        manifest = read_manifest(self.path)
        if manifest is None:
            if entries:
                raise FolderTaken(
                    f"{self.shown}: holds files stepplan did not write (no {MANIFEST}); "
                    "choose a new or empty folder"
                )
            return
        if manifest["kind"] != self.kind:
            raise FolderTaken(
                f"{self.shown}: holds a stepplan {manifest['kind']} run, not a {self.kind} "
                "run; choose another folder"
            )
        if not (overwrite or resume):
            raise FolderTaken(
                f"{self.shown}: holds an earlier stepplan run; --overwrite replaces the files "
                f"its {MANIFEST} lists (nothing else), or choose another folder"
            )
        listed = set(manifest["entries"])
        for name in sorted(set(names) & set(entries)):
            entry = self.path / name
            # compare and fidelity folders hold their runs' folders besides their files.
            kind_ok = entry.is_file() or (self.kind != "simulate" and entry.is_dir())
            ours = name in listed and kind_ok
            if not ours or entry.is_symlink():
                raise FolderTaken(
                    f"{self.shown}: {name} was not written by stepplan; move it away or "
                    "choose another folder"
                )
        self._entries = [e for e in manifest["entries"] if (self.path / e).exists()]

    @property
    def placed(self) -> bool:
        """Whether this claim has written files (or a manifest) into the folder."""
        return self._placed

    @property
    def entries(self) -> tuple[str, ...]:
        """The entries the manifest lists now (an earlier run's, until this one writes)."""
        return tuple(self._entries)

    # ------------------------------------------------------------------ writing

    def staging(self) -> Path:
        """The hidden staging folder this claim writes into, made on first use: a run
        streams its files there, and :meth:`put` renames them into place."""
        if self._stage is None:
            self._stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.path))
        return self._stage

    def discard_staging(self) -> None:
        """Remove the staging folder and what was written there."""
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None

    def put(
        self,
        write: Callable[[Path], Iterable[str]],
        *,
        complete: bool = True,
        keep: Collection[str] = (),
    ) -> None:
        """Write this run's files: ``write(staging)`` writes them into the staging folder
        (:meth:`staging`, where files streamed earlier wait) and returns their names; they
        then replace the old run's entries, but for ``keep`` (entries already in place,
        such as sub-folders), which stay listed."""
        stage = self.staging()
        placed = False
        try:
            names = list(write(stage))
            if not all(_plain_name(n) and (stage / n).is_file() for n in names):
                raise ValueError(f"put: {names} must be files written into the staging folder")
            self._write_manifest(stage, sorted(set(self._entries) | set(names)), False)
            for name in names:
                os.replace(stage / name, self.path / name)
                placed = True
            self._finish(stage, [*names, *(k for k in keep if k not in names)], complete)
        except OSError as exc:
            if not no_space(exc):
                raise
            kept = (
                "its files are in place, its manifest says incomplete"
                if placed
                else "nothing of this write was kept: the folder holds what it held before"
            )
            raise OutDirError(f"{self.shown}: no space left on the device; {kept}") from None
        finally:
            self.discard_staging()

    def record(self, entries: Iterable[str], *, complete: bool = True) -> None:
        """Write the manifest for ``entries`` already in place (``compare``'s sub-folders)."""
        stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.path))
        try:
            self._finish(stage, list(entries), complete)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def put_into(self, folder: str, name: str, data: bytes) -> Path:
        """Write the file ``folder/name`` (``folder`` a sub-folder of this one, made and
        listed in the manifest first) all at once or not at all; its path. For a sweep's
        records, one per point as it finishes."""
        if not (_plain_name(folder) and _plain_name(name)):
            raise ValueError(f"put_into: {folder!r}/{name!r} must be plain names")
        if folder not in self._entries:
            self.record([*self._entries, folder], complete=False)
        target = self.path / folder
        target.mkdir(exist_ok=True)
        staged = target / f"{STAGING_PREFIX}{os.getpid()}-{name}"
        try:
            with staged.open("wb") as handle:  # open, not mkstemp: the user's umask
                handle.write(data)
            os.replace(staged, target / name)
        except OSError as exc:
            if not no_space(exc):
                raise
            raise OutDirError(
                f"{self.shown}: no space left on the device for {folder}/{name}; the folder "
                "keeps what was written before it"
            ) from None
        finally:
            staged.unlink(missing_ok=True)
        return target / name

    def _finish(self, stage: Path, names: list[str], complete: bool) -> None:
        for name in sorted(set(self._entries) - set(names)):
            old = self.path / name
            if old.is_file() and not old.is_symlink():  # only files: never a folder
                old.unlink()
        self._write_manifest(stage, sorted(names), complete)
        self._entries, self._placed = sorted(names), True

    def _write_manifest(self, stage: Path, entries: list[str], complete: bool) -> None:
        document = {
            "stepplan_manifest": MANIFEST_FORMAT,
            "kind": self.kind,
            "entries": entries,
            "complete": complete,
            "written_by": {
                "program": f"stepplan {self.kind}",
                "version": _version(),
                "user": _user(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
            },
            "written_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "note": "stepplan replaces or removes only these entries (with --overwrite)",
        }
        staged = stage / MANIFEST
        staged.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(staged, self.path / MANIFEST)

    # ------------------------------------------------------------------ releasing

    def release(self, *, keep: bool = True) -> None:
        """Unlock; without ``keep``, folders the claim made are removed while still empty."""
        if self._fd < 0:
            return
        self.discard_staging()
        try:
            if not keep and not self._placed:
                for made in reversed(self._created):
                    with contextlib.suppress(OSError):  # not empty: someone's, keep it
                        made.rmdir()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultsFolder:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        self.release(keep=error is None)


def _make_folder(path: Path, shown: str) -> list[Path]:
    """Make ``path`` and its missing parents; the folders made, outermost first."""
    if path.exists() and not path.is_dir():
        raise OutDirError(f"{shown}: is a file; the results go into a folder")
    missing = []
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise OutDirError(f"{shown}: {probe} is a broken link")
        missing.append(probe)
        probe = probe.parent
    if not probe.is_dir():
        raise OutDirError(f"{shown}: {probe} is a file, not a folder")
    if missing and not os.access(probe, os.W_OK | os.X_OK):
        raise OutDirError(f"{shown}: cannot create it, {probe} is not writable")
    created = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # another run made it meanwhile: not ours to remove
        except OSError as exc:
            raise OutDirError(f"{shown}: cannot create {folder} ({exc.strerror})") from None
        created.append(folder)
    return created


def lock_folder(path: Path, shown: str) -> int:
    """An open descriptor of ``path`` holding its exclusive lock (:class:`FolderBusy` when
    another run holds it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise OutDirError(f"{shown}: cannot open the folder ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderBusy(
            f"{shown}: in use by another stepplan run; wait for it, or choose another folder"
        ) from None
    return fd


def _same_folder(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def config_digest(key: object, chars: int = _DIGEST_CHARS) -> str:
    """A digest of ``key`` (JSON-able: the effective settings and the trace spec), its
    first ``chars`` hex digits."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


def claim_new(
    parent: str | Path,
    stem: str,
    *,
    kind: str = "simulate",
    overwrite: bool = False,
    names: Collection[str] = (),
    resume: bool = False,
) -> ResultsFolder:
    """Claim ``parent/stem``, or ``stem-2``, ``stem-3``, ... when one is taken or in use
    (with ``overwrite`` or ``resume``, an earlier stepplan run of the same kind counts
    as free)."""
    for counter in range(1, _MAX_COUNTER + 1):
        name = stem if counter == 1 else f"{stem}-{counter}"
        try:
            return ResultsFolder.claim(
                Path(parent) / name, kind=kind, overwrite=overwrite, names=names, resume=resume
            )
        except (FolderTaken, FolderBusy):
            continue
    raise OutDirError(f"{Path(parent) / stem}: {_MAX_COUNTER} folders of this name are taken")
