"""The compiled plan packer: the optional C extension ``stepplan.planner._packer``.

``pip install`` builds it from ``csrc/`` (``setup.py`` marks it optional: an install
without a C compiler or the Python headers still succeeds, and plans are then packed with
numpy). Nothing is compiled at run time. compile.py's numpy packer is its specification.

The extension carries a digest of the sources it was built from. Where those sources lie
beside this file (a source checkout, an editable install) a packer built from other ones
is refused: after an edit or a pull of ``csrc/``, an old build would pack other bytes.

Imports nothing of stepplan: ``setup.py`` loads this file alone for :func:`source_digest`.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType

#: The C sources of the extension.
SOURCES = Path(__file__).with_name("csrc")
_MODULE = "_packer"  # in this package; its init function is PyInit__packer
_HOW = (
    "pip builds it at install time where a C compiler and the Python headers are found: "
    "install them (gcc and python3-dev, say) and reinstall stepplan (pip install -e .)"
)


class NativeBuildError(RuntimeError):
    """The compiled packer is not installed, or not from these sources; the message says
    why and how to build it."""


def source_digest(folder: Path) -> str:
    """A hex sha256 of the C sources in ``folder`` (every ``*.c`` and ``*.h``, by name):
    what the extension is built from."""
    digest = hashlib.sha256()
    for path in sorted([*folder.glob("*.c"), *folder.glob("*.h")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_packer() -> ModuleType:
    """The packer module (functions ``pack``, ``prefill_tiles`` and ``check_batch``).

    Raises :class:`NativeBuildError` where the extension is not installed (or does not
    load), or was built from other sources than those beside this file.
    """
    name = f"{__name__.rpartition('.')[0]}.{_MODULE}"
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise NativeBuildError(
            f"the compiled packer {name} is not installed ({error}); {_HOW}"
        ) from None
    if SOURCES.is_dir() and getattr(module, "SOURCE_DIGEST", None) != source_digest(SOURCES):
        raise NativeBuildError(
            f"the compiled packer {module.__file__} was built from other C sources than "
            f"{SOURCES} holds now; rebuild it: reinstall stepplan (pip install -e .)"
        )
    return module


def installed_packer() -> ModuleType | None:
    """:func:`load_packer`, or ``None`` where it raises; quiet (a Planner says why)."""
    try:
        return load_packer()
    except NativeBuildError:
        return None
