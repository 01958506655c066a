"""The house rules, checked on the source (an AST walk, ``bench/import_graph.py``, so
they cannot drift from the code).

``docs/architecture.md`` draws the map this test holds the code to: the planner imports
nothing of stepplan; the executor imports the planner only; the simulator imports the
executor (and torch, triton) only in its live-mode modules, and only inside functions,
so a simulation without live mode never loads torch (``test_sim_live.py`` checks that
at run time too); plots import the simulator's result types only; only the command
line (``stepplan.sim.cli``) imports plots; no import cycles. Modules stay within 500
lines and functions within 60, Triton kernels excepted. Each rule is also fed a
synthetic tree that breaks it, so a rule that can no longer fail is caught too.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import networkx as nx
import pytest
import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from import_graph import PACKAGES, ROOT, Import, all_imports, import_graph, modules, package_of

#: What each package may import of stepplan (besides itself).
ALLOWED = {
    "planner": set(),
    "executor": {"planner"},
    "sim": {"planner", "executor", "plots"},
    "plots": {"sim"},
}
#: Simulator modules that may import the executor (live mode), inside functions only; and
#: the one that drives vLLM's scheduler, which loads torch through vLLM when chosen.
LIVE_MODULES = {"stepplan.sim.live", "stepplan.sim.cli.profile", "stepplan.sim.cli.fidelity"}
LIVE_MODULES |= {"stepplan.sim.scheduler.vllm_engine_scheduler"}
#: Simulator modules plots may import: the result types.
RESULT_TYPES = {
    "stepplan.sim.results.schema",
    "stepplan.sim.results.sim_result",
    "stepplan.sim.results.table",
}
#: The only modules allowed to import the plots: the command line's.
COMMAND_LINE = "stepplan.sim.cli"
#: Third-party packages only the executor imports freely (the GPU stack).
GPU_STACK = {"torch", "triton"}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

MODULES = modules()


def _within(module: str, prefixes: set[str] | str) -> bool:
    """``module`` is one of ``prefixes`` or a submodule of one."""
    prefixes = {prefixes} if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(f"{p}.") for p in prefixes)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _wrong(item: Import, path: Path) -> str | None:
    """Why one import breaks the map, or ``None``."""
    mine, target = package_of(item.source), item.target
    where = f"{_shown(path)}:{item.line}: {item.source} imports {target}"
    theirs = package_of(target)
    if target.split(".")[0] in GPU_STACK:
        theirs = "executor"  # torch and triton load where the executor may
    if not theirs or theirs == mine:
        return None
    if theirs not in ALLOWED[mine]:
        return where
    if mine == "sim" and theirs == "executor":
        if item.source not in LIVE_MODULES or item.at_import:
            return f"{where} (only live mode, inside functions)"
    elif mine == "sim" and theirs == "plots" and not _within(item.source, COMMAND_LINE):
        return f"{where} (only the command line draws)"
    elif mine == "plots" and not _within(target, RESULT_TYPES):
        return f"{where} (plots read result types only)"
    return None


def map_violations(found: dict[str, Path]) -> list[str]:
    """Every import of ``found``'s modules that breaks the map, one line each."""
    wrong = (_wrong(item, found[item.source]) for item in all_imports(found))
    return [line for line in wrong if line is not None]


def import_cycles(found: dict[str, Path]) -> list[list[str]]:
    """The cycles among the imports that run on import."""
    return list(nx.simple_cycles(import_graph(found)))


def size_violations(path: Path) -> list[str]:
    """A module over its line limit, and each function over its own."""
    source = path.read_text()
    lines = source.count("\n")
    wrong = []
    if lines > MAX_MODULE_LINES:
        wrong.append(f"{_shown(path)}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any("triton.jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                wrong.append(f"{_shown(path)}:{node.lineno}: {node.name} is {length} lines")
    return wrong


def test_every_package_is_walked():
    """The packages walked are those pyproject.toml installs: one it installs but the
    walk missed would go unchecked, one it misses would not install."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(tool["package-dir"]) == {f"stepplan.{p}" for p in PACKAGES}
    walked = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert walked == set(tool["packages"])


def test_imports_follow_the_map():
    wrong = map_violations(MODULES)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    cycles = import_cycles(MODULES)
    assert not cycles, cycles


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name):
    wrong = size_violations(MODULES[name])
    assert not wrong, "\n".join(wrong)


# The self-test: small trees, each breaking (or keeping) one rule.
_WINGS = ("cli", "settings", "results")
_PACKAGE_INITS = {f"{p}/__init__.py": "" for p in PACKAGES} | {
    f"sim/{wing}/__init__.py": "" for wing in _WINGS
}
_LIVE_IN_FUNCTION = "def run():\n    from stepplan.executor import runtime\n"
MAP_CASES = [
    # (file, its source, the import the rules must refuse, or None where it is allowed)
    ("planner/a.py", "from stepplan.sim.settings import config", "stepplan.sim.settings.config"),
    ("planner/a.py", "from stepplan import sim", "stepplan.sim"),
    ("planner/a.py", "import importlib\nimportlib.import_module('stepplan.sim')", "stepplan.sim"),
    ("planner/a.py", "import torch", "torch"),
    ("planner/a.py", "from . import layout", None),
    ("executor/a.py", "import stepplan.sim.run", "stepplan.sim.run"),
    ("executor/a.py", "from ..planner import plan", None),
    ("sim/run.py", "from stepplan.executor import runtime", "stepplan.executor"),
    ("sim/run.py", _LIVE_IN_FUNCTION, "stepplan.executor"),
    ("sim/run.py", "def f():\n    import torch\n", "torch"),
    ("sim/run.py", "import typing\nif typing.TYPE_CHECKING:\n    import torch\n", "torch"),
    ("sim/run.py", "from stepplan.plots import canvas", "stepplan.plots.canvas"),
    ("sim/live.py", "from stepplan.executor import runtime", "stepplan.executor"),
    ("sim/live.py", "from ..executor import runtime", "stepplan.executor"),
    ("sim/live.py", "def f(torch=__import__('torch')): ...", "torch"),  # defaults run now
    ("sim/live.py", "if TYPE_CHECKING:\n    pass\nelse:\n    import torch\n", "torch"),
    ("sim/live.py", _LIVE_IN_FUNCTION, None),
    ("sim/live.py", "def run():\n    import torch\n", None),
    ("sim/live.py", "if TYPE_CHECKING:\n    from stepplan.executor import runtime\n", None),
    ("sim/cli/a.py", "from stepplan.plots import canvas", None),
    ("plots/a.py", "from stepplan.sim.run import simulate", "stepplan.sim.run"),
    ("plots/a.py", "from stepplan.sim import run", "stepplan.sim.run"),
    ("plots/a.py", "from stepplan.sim.settings import config", "stepplan.sim.settings.config"),
    ("plots/a.py", "from stepplan.sim.results import outdir", "stepplan.sim.results.outdir"),
    ("plots/a.py", "from stepplan.planner import plan", "stepplan.planner"),
    ("plots/a.py", "from stepplan.sim.results import sim_result", None),
    ("plots/a.py", "from stepplan.sim.results.schema import StepColumns", None),
]


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, source in {**_PACKAGE_INITS, **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(source))
    return modules(root)


@pytest.mark.parametrize(("file", "source", "refused"), MAP_CASES)
def test_the_map_refuses_what_it_should(tmp_path, file, source, refused):
    others = {"sim/run.py": "", "sim/settings/config.py": "", "plots/canvas.py": ""}
    others |= {"sim/results/sim_result.py": "", "sim/results/outdir.py": ""}
    wrong = map_violations(_tree(tmp_path, {**others, file: source}))
    if refused is None:
        assert not wrong
    else:
        assert len(wrong) == 1 and f"imports {refused}" in wrong[0], wrong


def test_a_cycle_is_found_and_a_deferred_import_breaks_it(tmp_path):
    found = _tree(tmp_path, {"sim/a.py": "from . import b", "sim/b.py": "from . import a"})
    assert [sorted(cycle) for cycle in import_cycles(found)] == [
        ["stepplan.sim.a", "stepplan.sim.b"]
    ]
    found = _tree(tmp_path, {"sim/b.py": "def f():\n    from . import a\n"})
    assert not import_cycles(found)


def test_sizes_refuse_long_functions_and_modules_but_not_kernels(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))  # 61 lines with the def
    path = tmp_path / "a.py"
    path.write_text(f"def long():\n{body}\n\n@triton.jit\ndef kernel():\n{body}")
    assert [line.split(": ")[-1] for line in size_violations(path)] == ["long is 61 lines"]
    path.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert size_violations(path) == [f"{path}: 501 lines (at most {MAX_MODULE_LINES})"]
