"""What ``summary.json``'s ``provenance`` section records: enough to run it again.

The command line (``argv`` and the same as one shell-quoted ``command``), the working
directory its relative paths start from, the versions of stepplan, Python and numpy, the
git commit of the checkout stepplan runs from (and whether its tracked files differ from
that commit), the trace's identity (path, size and sha256 of the file; the spec string of
a synthetic workload) and the settings as TOML text that ``--config`` reads back. The
simulation loop knows nothing of it: the CLI builds it and adds it to the summary before
the files are written.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..results.sim_result import SimResult
from ..scheduler.vllm_engine_scheduler import vllm_version
from ..settings.config import SimConfig
from ..settings.config_toml import config_toml
from ..traces import RequestTable
from ..traces.source import STDIN, STDIN_NAME
from ..workloads import SYNTHETIC_PREFIX

#: How long one git call may take before the commit is left out.
_GIT_TIMEOUT_S = 10


def stepplan_version() -> str:
    """The installed stepplan's version, ``unknown`` when it is not installed."""
    try:
        return metadata.version("stepplan")
    except metadata.PackageNotFoundError:
        return "unknown"


def trace_identity(trace: str | None, table: RequestTable, embedded: Path) -> dict[str, Any]:
    """The trace a run read: ``trace`` as given on the command line (``None`` for the
    embedded trace, whose file is ``embedded``), the size and sha256 of its bytes from
    ``table`` (the read hashed them: a pipe is never read twice). A file's path is
    absolute, links resolved; a pipe's as given; standard input is ``<stdin>``."""
    if trace is not None and trace.startswith(SYNTHETIC_PREFIX):
        return {"source": "synthetic", "spec": trace}
    read = {"bytes": table.size_bytes, "sha256": table.sha256}
    if trace is None:
        return {"source": "embedded", "path": str(embedded.resolve()), **read}
    if trace == STDIN:
        return {"source": "stdin", "path": STDIN_NAME, **read}
    path = Path(trace).resolve() if Path(trace).is_file() else Path(os.path.abspath(trace))
    return {"source": "file", "path": str(path), **read}


def _git(folder: Path, *arguments: str) -> str | None:
    """``git -C folder ARGUMENTS``'s output, or ``None`` when git is missing or fails."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *arguments],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            # status must not take the index lock of a checkout someone else works in
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


#: A file of the package itself (``stepplan.sim``'s ``__init__.py``): where the code that
#: runs lives, whatever the working directory.
_PACKAGE_FILE = Path(__file__).resolve().parents[1] / "__init__.py"


def git_state(module: str | Path = _PACKAGE_FILE) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git checkout that holds ``module``, or ``None``
    when it is not a tracked file of a checkout (an installed copy, no git, git
    failing). ``dirty``: tracked files differ from the commit (untracked files are not
    counted)."""
    path = Path(module).resolve()
    if _git(path.parent, "ls-files", "--error-unmatch", "--", path.name) is None:
        return None
    commit = _git(path.parent, "rev-parse", "HEAD")
    status = _git(path.parent, "status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return None
    return {"commit": commit.strip(), "dirty": bool(status.strip())}


def provenance(
    argv: Sequence[str] | None, trace: dict[str, Any], config: SimConfig
) -> dict[str, Any]:
    """The ``provenance`` section (see the module docstring); ``argv`` are the arguments
    after ``stepplan`` (``None``: not known, left out), ``trace`` is
    :func:`trace_identity`'s."""
    document: dict[str, Any] = {}
    if argv is not None:
        words = ["stepplan", *argv]
        # No working folder: equal commands give equal files wherever they run.
        document.update(argv=words, command=shlex.join(words))
    document.update(
        stepplan_version=stepplan_version(),
        python=platform.python_version(),
        numpy=np.__version__,
    )
    if config.scheduler.implementation == "vllm":
        document["vllm"] = vllm_version()  # whose scheduler made the decisions
    git = git_state()
    if git is not None:
        document["git"] = git
    document["trace"] = trace
    document["config_toml"] = config_toml(config)
    return document


def with_provenance(result: SimResult, section: dict[str, Any]) -> SimResult:
    """``result`` with ``section`` as its summary's ``provenance``."""
    return attrs.evolve(result, summary={**result.summary, "provenance": section})
