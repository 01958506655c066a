"""The build of the planner's compiled packer; everything else is in pyproject.toml.

One optional C extension, ``stepplan.planner._packer``, from ``planner/csrc/``: where it
does not build (no C compiler, no Python headers), pip warns and installs the rest, and
the planner packs plans with numpy (``planner/native.py``).
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup

CSRC = Path("planner/csrc")


def _source_digest() -> str:
    """The digest ``planner/native.py`` checks the built extension by (its own function)."""
    spec = importlib.util.spec_from_file_location("_stepplan_native", "planner/native.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    return native.source_digest(CSRC)


packer = Extension(
    "stepplan.planner._packer",
    sources=sorted(path.as_posix() for path in CSRC.glob("*.c")),
    depends=sorted(path.as_posix() for path in CSRC.glob("*.h")),
    define_macros=[("PACKER_SOURCE_DIGEST", f'"{_source_digest()}"')],
    # -O3: the census and gather loops vectorize (Python's own flags may say -O2).
    extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
    optional=True,
)

setup(ext_modules=[packer])
