"""The build of the compiled parts; everything else is in pyproject.toml.

Optional C extensions: the planner's packer, ``stepplan.planner._packer`` from
``planner/csrc/``, the simulator's stepper, ``stepplan.sim._stepper`` from
``sim/csrc/``, and the results tables' CSV text (their formatter and their number
reader), ``stepplan.sim.results._csv`` from ``sim/results/csrc/``. Where they do not
build (no C compiler, no Python headers), pip warns and installs the rest: the planner
packs plans with numpy (``planner/native.py``), the simulator steps in Python
(``sim/stepper.py``) and the tables are formatted and read in Python
(``sim/results/table.py``), with the same results.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup

CSRC = Path("planner/csrc")
SIM_CSRC = Path("sim/csrc")
CSV_CSRC = Path("sim/results/csrc")


def _source_digest(folder: Path) -> str:
    """The digest the loaders check a built extension by (``planner/native.py``'s function)."""
    spec = importlib.util.spec_from_file_location("_stepplan_native", "planner/native.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    return native.source_digest(folder)


packer = Extension(
    "stepplan.planner._packer",
    sources=sorted(path.as_posix() for path in CSRC.glob("*.c")),
    depends=sorted(path.as_posix() for path in CSRC.glob("*.h")),
    define_macros=[("PACKER_SOURCE_DIGEST", f'"{_source_digest(CSRC)}"')],
    # -O3: the census and gather loops vectorize (Python's own flags may say -O2).
    extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
    optional=True,
)

stepper = Extension(
    "stepplan.sim._stepper",
    sources=sorted(path.as_posix() for path in SIM_CSRC.glob("*.c")),
    depends=sorted(path.as_posix() for path in SIM_CSRC.glob("*.h")),
    define_macros=[("STEPPER_SOURCE_DIGEST", f'"{_source_digest(SIM_CSRC)}"')],
    extra_compile_args=[] if sys.platform == "win32" else ["-O2"],
    optional=True,
)

csv = Extension(
    "stepplan.sim.results._csv",
    sources=sorted(path.as_posix() for path in CSV_CSRC.glob("*.c")),
    depends=sorted(path.as_posix() for path in CSV_CSRC.glob("*.h")),
    define_macros=[("CSV_SOURCE_DIGEST", f'"{_source_digest(CSV_CSRC)}"')],
    extra_compile_args=[] if sys.platform == "win32" else ["-O2"],
    optional=True,
)

setup(ext_modules=[packer, stepper, csv])
