"""Golden simulator results: per-column digests of ``steps.csv`` and ``requests.csv``.

The digests in ``tests/golden/sim_columns.json`` were made by the simulator as it stood
before the redesign (commit 98b90f7), so every later change that must leave results
unchanged is checked against that code, not against itself. The runs added for issue 23
(the memory model's paths, a light trace) and the columns added since 98b90f7 (memory,
``engine_s``) were pinned by main at 6fd578e, the code before the scheduler's rewrite.
``plan_us`` (measured, run dependent) is left out. Columns renamed since are compared
under their old name (:data:`RENAMED`). Regenerate only when a change is *meant* to alter results:
``python tests/golden_sim.py --write`` (and say so in the commit). ``mooncake-bound-caching``
was re-pinned when admission came to wait for a whole prompt's blocks, as vLLM 0.33's does,
and again when prefix-cache entries came to be registered when allocated for the step
that computes them (vLLM's rule; a request admitted later in that step hits them).
Every run of the hybrid model without prefix caching was re-pinned when its cache came
to be laid out as vLLM 0.33 lays out a hybrid model's (48-token KV blocks and the conv
states in one pool, ``memory_sizing._shared_pool``): ``kv_used_blocks`` and ``kv_usage``
everywhere, and the scheduling where memory binds. The hybrid model's prefix-cached runs
(``mooncake-bound-caching``, ``mooncake-caching-q2``) were re-pinned when they came to
follow vLLM 0.33's "align" mode (48-token aligned chunks and entries, conv states kept
only at a prompt's last boundary and at a shared-prefix junction), and both again when
every full block a request computes, output tokens' included, came to be cached as
vLLM 0.33 caches it (``kv_cached_blocks``, and the timing where eviction binds), and
both again when their conv states came to be blocks of the one pool by default
(``memory.align_state_blocks``: 48-token KV blocks, running, left and kept state blocks
counted as vLLM's align mode holds them).

The old code's model had 8e9 parameters by label; the model presets give ``hybrid-8b``
its real count (8,433,438,720). Every run here sets ``model.params = 8e9`` (:data:`PINNED`),
so the old code's digests still hold everything else to it: with that one figure pinned,
the presets, the memory model and the redesign left every column unchanged.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from stepplan.sim.results.schema import TABLES

GOLDEN = Path(__file__).with_name("golden") / "sim_columns.json"
#: A slice of a Mooncake trace: long prompts with block hashes (prefix caching).
MOONCAKE = str(Path(__file__).with_name("data") / "mooncake_slice.jsonl")
#: Runs the golden covers: (name, trace spec or None for the bundled default, settings).
RUNS: tuple[tuple[str, str | None, dict], ...] = (
    ("bundled-default", None, {}),
    (
        "bundled-mixed-q2-groups2",
        None,
        {
            "workload.limit": 600,
            "planner.graph_mode": "mixed",
            "scheduler.num_spec_tokens": 2,
            "scheduler.num_groups": 2,
        },
    ),
    (
        "synthetic-nospec-seed",
        "synthetic:n=400,rate=20,cv2=4,prompt=zipf:1.1:6000,output=uniform:1:200",
        {"scheduler.num_spec_tokens": 0, "cost.host_cost": "seed", "seed": 3},
    ),
    (
        "synthetic-eager-public-fixed",
        "synthetic:n=300,rate=50,cv2=1,prompt=uniform:16:4000,output=zipf:1.3:300",
        {
            "planner.graph_mode": "none",
            "cost.kernel_profile": "public",
            "acceptance.model": "fixed",
            "acceptance.length": 2.5,
            "scheduler.max_num_seqs": 64,
            "scheduler.max_num_batched_tokens": 2048,
        },
    ),
    # Made by the code of main at 6fd578e, before the scheduler's state moved into
    # preallocated arrays (issue 23): the memory model's paths and a light trace.
    ("mooncake-bound-caching", MOONCAKE, {"memory.kv_cache_gib": 5}),
    ("mooncake-caching-q2", MOONCAKE, {"scheduler.num_spec_tokens": 2}),
    (
        "synthetic-bound-spec",
        "synthetic:n=400,rate=20,cv2=4,prompt=zipf:1.1:6000,output=uniform:1:200",
        {"memory.kv_cache_gib": 1.2, "scheduler.num_spec_tokens": 4},
    ),
    (
        "synthetic-wide",
        "synthetic:n=2000,rate=150,cv2=1,prompt=uniform:16:1000,output=uniform:1:300",
        {"scheduler.max_num_seqs": 256, "scheduler.num_spec_tokens": 1},
    ),
    (
        "synthetic-lowrate",
        "synthetic:n=120,rate=0.1,cv2=1,prompt=zipf:1.1:4000,output=zipf:1.05:2000",
        {},
    ),
    (
        "synthetic-heavy-bound",
        "synthetic:n=1500,rate=100,cv2=2,prompt=uniform:16:2000,output=uniform:1:500",
        {"memory.kv_cache_gib": 2, "scheduler.max_num_seqs": 256},
    ),
)
#: Settings every golden run adds: the one figure the presets changed on purpose.
PINNED = {"model.params": 8.0e9}
#: New column name -> the name the golden knows it by: the schema's renames (the names
#: older folders have, which the reader takes too).
RENAMED: dict[str, str] = {new: old for table in TABLES for old, new in table.renamed.items()}
SKIPPED = frozenset({"plan_us"})


def _digest(values: np.ndarray) -> str:
    if values.dtype.kind == "f":
        cells = ["" if v != v else repr(v) for v in values.tolist()]
    else:
        cells = [str(v) for v in values.tolist()]
    return hashlib.sha256("\n".join(cells).encode()).hexdigest()[:32]


def digests(columns: dict[str, np.ndarray]) -> dict[str, str]:
    """``{old column name: digest}`` of every deterministic column."""
    return {
        RENAMED.get(name, name): _digest(np.asarray(values))
        for name, values in columns.items()
        if name not in SKIPPED
    }


def simulate_run(trace: str | None, settings: dict) -> tuple[dict, dict]:
    """``(steps columns, requests columns)`` of one golden run, through the public API."""
    from stepplan.sim import cli

    args = cli.build_parser().parse_args(["simulate", *([trace] if trace else [])])
    config = cli.with_settings(cli.build_config(args), {**PINNED, **settings})
    from stepplan.sim.run import simulate

    result = simulate(cli.load_requests(args, config), config)
    return result.steps, result.requests


def main() -> None:
    if "--write" not in sys.argv:
        raise SystemExit("usage: python tests/golden_sim.py --write")
    document = {}
    for name, trace, settings in RUNS:
        steps, requests = simulate_run(trace, settings)
        document[name] = {"steps": digests(steps), "requests": digests(requests)}
    GOLDEN.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
