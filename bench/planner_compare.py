"""Two planners side by side in one process: this tree's and an older one's, on the same
steps as ``planner_bench.py``, timed in alternating rounds so both see the same machine.

The older planner is any checkout's ``planner/`` folder (it imports nothing else of
stepplan), imported under another name; ``--old`` names the checkout, e.g. one made by
``git archive edb8c7a | tar -x -C /tmp/old``. Prints p50 per step in microseconds for
StepBatch validation, compile_plan, the default Planner (compiled packer) and
``Planner(native=False)``, old then new, and checks that both make the same bytes.

    python bench/planner_compare.py --old /tmp/old [--steps 2000] [--rounds 3] [--graph-mode full]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
from bench_record import record_run
from planner_bench import CASES, NUM_SPEC_TOKENS, step_inputs, timed

from stepplan import planner as new_planner

COLUMNS = ("validate", "compile_plan", "Planner", "numpy Planner")


def load_old(checkout: Path) -> object:
    """``checkout/planner`` as the package ``old_planner`` (its compiled packer, if it
    builds one at first use, goes to a cache of this run's own)."""
    init = checkout / "planner" / "__init__.py"
    spec = importlib.util.spec_from_file_location("old_planner", init)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--old: no planner package at {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_planner"] = module
    spec.loader.exec_module(module)
    return module


def timings(package: object, inputs: list[dict], config: object) -> dict[str, np.ndarray]:
    """Per-step microseconds of each column with ``package``'s planner."""
    batches = [package.StepBatch(**kw) for kw in inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an old numpy-only planner warns; the column says
        planner, numpy_planner = package.Planner(config), package.Planner(config, native=False)
    for batch in batches[:200]:  # warm-up: kept shapes, caches
        planner.compile(batch), numpy_planner.compile(batch)
    return {
        "validate": timed(lambda kw: package.StepBatch(**kw), inputs),
        "compile_plan": timed(lambda batch: package.compile_plan(batch, config), batches),
        "Planner": timed(planner.compile, batches),
        "numpy Planner": timed(numpy_planner.compile, batches),
    }


def same_bytes(old: object, inputs: list[dict], old_config: object, config: object) -> bool:
    for kw in inputs[:200]:
        want = old.compile_plan(old.StepBatch(**kw), old_config).packed.tobytes()
        if new_planner.compile_plan(new_planner.StepBatch(**kw), config).packed.tobytes() != want:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--graph-mode", default="full", choices=("none", "full", "mixed"))
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as cache,
        mock.patch.dict(os.environ, STEPPLAN_CACHE_DIR=cache),
    ):
        old = load_old(args.old)
        settings = dict(num_spec_tokens=NUM_SPEC_TOKENS, graph_mode=args.graph_mode)
        old_config, config = old.PlannerConfig(**settings), new_planner.PlannerConfig(**settings)
        rng = np.random.default_rng(0)
        print(
            f"# p50 us per step over {args.rounds} alternating rounds, old -> new; "
            f"graph mode {args.graph_mode}, {args.groups} layer groups, Q = 4"
        )
        print(f"{'case':<15}" + "".join(f"{name:>22}" for name in COLUMNS) + "  same bytes")
        figures = {}
        for name, kinds in CASES.items():
            inputs = [
                step_inputs(rng, *kinds[step % len(kinds)][1:], args.groups)
                for step in range(args.steps)
            ]
            runs: dict[str, dict[str, list[np.ndarray]]] = {"old": {}, "new": {}}
            for _ in range(args.rounds):
                for side, package, cfg in (("old", old, old_config), ("new", new_planner, config)):
                    for column, values in timings(package, inputs, cfg).items():
                        runs[side].setdefault(column, []).append(values)
            cells = [
                f"{np.median(np.concatenate(runs['old'][c])):>10.1f} -> "
                f"{np.median(np.concatenate(runs['new'][c])):<6.1f}"
                for c in COLUMNS
            ]
            same = same_bytes(old, inputs, old_config, config)
            print(f"{name:<15}" + "".join(f"{cell:>22}" for cell in cells) + f"  {same}")
            figures[name.replace(" ", "_")] = {
                f"{side}_{c.replace(' ', '_')}_p50_us": float(np.median(np.concatenate(times)))
                for side in ("old", "new")
                for c, times in runs[side].items()
                if c in COLUMNS
            } | {"same_bytes": same}
    record_run("planner_compare", figures, old_tree=str(args.old), graph_mode=args.graph_mode)


if __name__ == "__main__":
    main()
