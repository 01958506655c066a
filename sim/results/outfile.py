"""Single files stepplan writes (a report, a figure, a graph-size config, an engine
profile, a trace): the one rule every such write follows. Results folders follow
``outdir.py``; this is its counterpart for one file.

- A path with nothing there is written; folders missing above it are made (and removed
  again when the write fails).
- Something already there is replaced only with ``overwrite``, and only when it is a
  file stepplan wrote: its format's mark is in it (:class:`FileKind`'s ``recognise``;
  each format's module says what marks it). Anything else there -- the user's file, a
  folder, a link, a FIFO -- is refused with one line naming it, and nothing is written.
- :meth:`OutputFile.claim` runs the checks before any work. :meth:`OutputFile.write`
  runs them again, so a file that appeared or changed meanwhile is left alone.
- The data goes to a hidden file in the same folder (made with the user's umask) and is
  renamed into place: an interrupted or failed write -- a full disk included -- leaves no
  half file, and whatever was there as it was.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import attrs

from .outdir import OutDirError, no_space

#: Bytes of an existing file a :class:`FileKind` looks at: this many from its start and
#: as many from its end (a PDF says who made it near its end).
SAMPLE_BYTES = 1 << 16
_TEMPORARY = ".stepplan-partial-"


class OutputError(OutDirError):
    """A file stepplan may not write or replace; the message names it."""


@attrs.frozen
class FileKind:
    """A format stepplan writes as one file.

    Attributes:
        what: its name in messages, with its article (``an HTML report``).
        recognise: whether a file holds this format's stepplan mark, given
            :func:`file_sample` of it.
    """

    what: str
    recognise: Callable[[bytes], bool]


def file_sample(path: Path) -> bytes:
    """The first and the last :data:`SAMPLE_BYTES` of a regular file (all of a small one)."""
    with path.open("rb") as handle:
        head = handle.read(SAMPLE_BYTES)
        size = os.fstat(handle.fileno()).st_size
        if size <= 2 * SAMPLE_BYTES:
            return head + handle.read()
        handle.seek(size - SAMPLE_BYTES)
        return head + handle.read()


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class OutputFile:
    """A file this command may write (use :meth:`claim`, then :meth:`write`).

    Attributes:
        path: the file. shown: the path as the user gave it, for messages.
        kind: its format.
    """

    def __init__(self, path: Path, shown: str, kind: FileKind, found: tuple[int, ...] | None):
        self.path, self.shown, self.kind = path, shown, kind
        self._found = found  # what was there when claimed (None: nothing)

    @classmethod
    def claim(cls, path: str | Path, kind: FileKind, *, overwrite: bool = False) -> OutputFile:
        """Check that ``path`` may be written (see the module docstring); an
        :class:`OutputError` naming it, as the user gave it, when not."""
        shown, path = str(path), Path(path)
        found = _check(path, shown, kind, overwrite)
        _check_folder(path, shown)
        return cls(path, shown, kind, found)

    def write(self, data: bytes) -> Path:
        """Write ``data`` (all of it or nothing) and return the path."""
        made = _make_folders(self.path.parent, self.shown)
        temporary: Path | None = None
        try:
            temporary = self._write_temporary(data)
            self._commit(temporary)
        except OSError as exc:
            raise self._failed(exc) from None
        finally:
            if temporary is not None:
                temporary.unlink(missing_ok=True)
            if not self.path.exists():
                for folder in reversed(made):
                    with contextlib.suppress(OSError):
                        folder.rmdir()
        return self.path

    def _write_temporary(self, data: bytes) -> Path:
        folder, name = self.path.parent, self.path.name
        for attempt in range(100):
            temporary = folder / f".{name}{_TEMPORARY}{os.getpid()}-{attempt}"
            try:
                # os.open, not mkstemp: the user's umask decides the mode, as for any file
                handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(data)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
            return temporary
        raise OutputError(f"{self.shown}: cannot make a temporary file in {folder}")

    def _commit(self, temporary: Path) -> None:
        """Rename into place, unless something appeared or changed there meanwhile."""
        appeared = OutputError(
            f"{self.shown}: appeared while stepplan worked; left as it is, nothing written"
        )
        if self._found is None:
            try:
                os.link(temporary, self.path)  # never replaces: fails if a file appeared
            except FileExistsError:
                raise appeared from None
            except OSError:  # a file system without hard links: rename, checked just before
                if os.path.lexists(self.path):
                    raise appeared from None
                os.rename(temporary, self.path)
            return
        try:
            now: tuple[int, ...] | None = _identity(os.lstat(self.path))
        except FileNotFoundError:
            now = None
        if now != self._found:
            raise OutputError(
                f"{self.shown}: changed while stepplan worked (another program wrote it); "
                "left as it is, nothing written"
            )
        os.replace(temporary, self.path)

    def _failed(self, error: OSError) -> OutputError:
        kept = "it was not there before" if self._found is None else "the file there is as it was"
        folder = self.path.parent.absolute()
        if no_space(error):
            return OutputError(
                f"{self.shown}: no space left on the device of {folder}; nothing written ({kept})"
            )
        reason = error.strerror or str(error)
        return OutputError(f"{self.shown}: cannot write it ({reason}); nothing written ({kept})")


def _check(path: Path, shown: str, kind: FileKind, overwrite: bool) -> tuple[int, ...] | None:
    """What is at ``path`` when it may be replaced (``None``: nothing); else the refusal."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None  # a file above it: _check_folder says which
    except OSError as exc:
        raise OutputError(f"{shown}: cannot look at it ({exc.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise OutputError(f"{shown}: is a folder; {kind.what} is one file")
    if stat.S_ISLNK(info.st_mode):
        raise OutputError(
            f"{shown}: is a symbolic link; stepplan replaces only files it wrote itself, "
            "not links: choose another name"
        )
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{shown}: is not a regular file; stepplan leaves it alone")
    try:
        ours = kind.recognise(file_sample(path))
    except OSError:
        ours = False
    if not ours:
        raise OutputError(
            f"{shown}: exists and is not {kind.what} stepplan wrote; stepplan leaves it "
            "alone: choose another name, or move it away"
        )
    if not overwrite:
        raise OutputError(
            f"{shown}: exists ({kind.what} stepplan wrote earlier); --overwrite replaces it"
        )
    return _identity(info)


def _check_folder(path: Path, shown: str) -> None:
    """The folder ``path`` goes into exists and is writable, or can be made."""
    probe = path.parent
    while not probe.exists():
        if probe.is_symlink():
            raise OutputError(f"{shown}: {probe} is a broken link")
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"{shown}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{shown}: cannot write there, {probe} is not writable")


def _make_folders(folder: Path, shown: str) -> list[Path]:
    """Make ``folder`` and its missing parents; the folders made, outermost first."""
    missing = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            for earlier in reversed(made):
                with contextlib.suppress(OSError):
                    earlier.rmdir()
            raise OutputError(f"{shown}: cannot create {folder} ({exc.strerror})") from None
        made.append(folder)
    return made
