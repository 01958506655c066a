"""The compiled plan packer (``plan_packer.c``), built with the system C compiler at first use.

Built the way Triton builds its launcher stubs: nothing happens at install, so editable
installs, CI and the GPU host need no build step. The first process that asks for the
packer compiles it into a per-user cache, under a name hashed from everything that decides
the binary (C source, compiler command, flags, Python headers and ABI), then loads it.
Later processes find the file and only load it. Files appear in the cache whole or not
at all (compiled to a temporary name, then renamed), so processes building at the same
time never load half a file; an entry that does not load is rebuilt.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("plan_packer.c")
MODULE_NAME = "_plan_packer"  # the C source's PyInit__plan_packer
FLAGS = ("-O3", "-shared", "-fPIC")


class NativeBuildError(RuntimeError):
    """The packer could not be built or loaded; the message says why (with compiler output)."""


def cache_dir() -> Path:
    """Where built packers live: ``$STEPPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/stepplan``,
    else ``~/.cache/stepplan``."""
    if os.environ.get("STEPPLAN_CACHE_DIR"):
        return Path(os.environ["STEPPLAN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stepplan"


def compiler() -> tuple[str, ...]:
    """The C compiler command: ``$CC`` split as a shell would, else ``cc``, else ``gcc``."""
    if os.environ.get("CC"):
        return tuple(shlex.split(os.environ["CC"]))
    return ("cc",) if shutil.which("cc") or not shutil.which("gcc") else ("gcc",)


def load_packer() -> ModuleType:
    """The packer module (functions ``pack``, ``prefill_tiles`` and ``check_batch``), built into
    :func:`cache_dir` by :func:`compiler` when not there yet.

    Raises :class:`NativeBuildError` naming what is missing (compiler, Python headers,
    source) or quoting the compiler's errors.
    """
    found = _load(cache_dir(), compiler())
    if isinstance(found, str):
        raise NativeBuildError(found)
    return found


@functools.cache
def packer_or_none() -> ModuleType | None:
    """:func:`load_packer` as the environment names it at the first call, kept for the
    process (a lookup hashes the source: ~45 µs, too dear per step); ``None`` where it
    does not build. Quiet: a Planner that falls back says why."""
    try:
        return load_packer()
    except NativeBuildError:
        return None


@functools.cache
def _load(directory: Path, command: tuple[str, ...]) -> ModuleType | str:
    """Once per process for each cache dir and compiler: the loaded module, or why it
    could not be had (kept too, so a missing compiler is not run again per planner)."""
    try:
        return _load_or_build(directory, command)
    except NativeBuildError as error:
        return str(error)


def entry_path(directory: Path, command: tuple[str, ...]) -> Path:
    """The cache file of the packer that ``command`` builds from today's source: named by
    a hash of the source, the command, :data:`FLAGS`, the Python headers and ABI."""
    include = sysconfig.get_paths()["include"]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    try:
        source = SOURCE.read_bytes()
    except OSError as error:
        raise NativeBuildError(f"the packer's C source is missing: {error}") from None
    key = hashlib.sha256(
        repr((source, command, FLAGS, include, suffix, sys.version)).encode()
    ).hexdigest()[:24]
    return directory / f"{MODULE_NAME}-{key}{suffix}"


def _load_or_build(directory: Path, command: tuple[str, ...]) -> ModuleType:
    path = entry_path(directory, command)
    if path.is_file():
        try:
            return _import(path)
        except ImportError:  # damaged or foreign: built afresh below, under the same name
            pass
    _build(path, command, sysconfig.get_paths()["include"])
    try:
        return _import(path)
    except ImportError as error:
        raise NativeBuildError(f"the freshly built packer {path} does not load: {error}") from None


def _build(path: Path, command: tuple[str, ...], include: str) -> None:
    """Compile the source to a temporary file beside ``path``, then rename it into place."""
    if not command or shutil.which(command[0]) is None:
        raise NativeBuildError(
            f"no C compiler: {command[0] if command else '$CC'!r} is not on PATH "
            "(install gcc, or point $CC at a C compiler)"
        )
    if not Path(include, "Python.h").is_file():
        raise NativeBuildError(
            f"no Python headers: {include}/Python.h is missing (install the python3-dev "
            "package of this Python)"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as error:
        raise NativeBuildError(f"cannot write the packer cache {path.parent}: {error}") from None
    os.close(handle)
    argv = [*command, *FLAGS, f"-I{include}", str(SOURCE), "-o", temporary]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip() or "(no output)"
            raise NativeBuildError(
                f"`{shlex.join(argv)}` exited with status {done.returncode}:\n{output}"
            )
        os.replace(temporary, path)
    except OSError as error:
        raise NativeBuildError(f"`{shlex.join(argv)}` could not run: {error}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
