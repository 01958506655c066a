"""Predicted total step time of the fastest CUDA-graph size lists against vLLM's and
SGLang's default lists, on the bundled trace and the shared traces of other formats.

Each case simulates a trace (the cost model's times), then runs ``stepplan buckets``'
comparison with an engine profile's step times (the bundled H200 profiles: ``full``
graphs, and ``mixed`` graphs with the mixed profile) at vLLM's whole default count and at
8 graphs. The shipped profiles hold no graph memory figures, so lists are held to the
graph count only. The record (date, device, command, commit, figures per case and list)
goes to ``--record`` (``bench/results/``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_record import record_run

ROOT = Path(__file__).resolve().parents[1]
FULL_PROFILE = ROOT / "sim" / "data" / "engine_profile_hybrid-8b_h200.json"
MIXED_PROFILE = ROOT / "sim" / "data" / "engine_profile_hybrid-8b_h200_mixed.json"
SHARED = Path("/work/shared/traces")
#: ``(name, trace, extra simulate arguments, engine profile)``
CASES = (
    ("bundled azure code, full", ROOT / "sim/data/azure_llm_2023_code.csv", [], FULL_PROFILE),
    (
        "bundled azure code, mixed",
        ROOT / "sim/data/azure_llm_2023_code.csv",
        ["--graph-mode", "mixed"],
        MIXED_PROFILE,
    ),
    ("mooncake synthetic (jsonl), full", SHARED / "mooncake_synthetic.jsonl", [], FULL_PROFILE),
    (
        "mooncake synthetic (jsonl), mixed",
        SHARED / "mooncake_synthetic.jsonl",
        ["--graph-mode", "mixed"],
        MIXED_PROFILE,
    ),
)


def case_figures(folder: Path, profile: Path, max_graphs: int | None) -> dict:
    from stepplan.sim.buckets.bucket_table import compare_times
    from stepplan.sim.cli.buckets import run_config, run_costs, run_demand
    from stepplan.sim.results.sim_result import read_step_shapes

    started = time.perf_counter()
    results = read_step_shapes(folder)
    config = run_config(results)
    demand = run_demand(results, config)
    costs, _ = run_costs(demand, config, SimpleNamespace(profile=str(profile), largest=None))
    comparison = compare_times(demand, costs, max_graphs=max_graphs)
    rows = [
        {
            "list": row.score.label,
            "graphs": len(row.score.sizes),
            "largest": row.score.sizes[-1],
            "sizes": list(row.score.sizes),
            "total_step_s": row.total_s,
            "hit_rate": row.score.hit_rate,
            "padded_tokens": row.score.padded_tokens,
        }
        for row in comparison.rows
    ]
    return {"steps": demand.num_steps, "rows": rows, "wall_s": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    from stepplan.sim.cli import main as stepplan

    cases = {}
    with tempfile.TemporaryDirectory(prefix="bucket-time-") as scratch:
        for name, trace, extra, profile in CASES:
            if not trace.exists():
                print(f"{name}: {trace} not found, left out")
                continue
            folder = Path(scratch) / name.replace(" ", "_").replace(",", "")
            code = stepplan(["simulate", str(trace), *extra, "--out", str(folder), "--quiet"])
            if code != 0:
                raise SystemExit(f"{name}: simulate exited {code}")
            cases[name] = {
                "trace": str(trace),
                "profile": str(profile.relative_to(ROOT)),
                "budgets": {
                    str(budget): case_figures(folder, profile, budget) for budget in (None, 8)
                },
            }
            for budget, figures in cases[name]["budgets"].items():
                print(f"\n{name}, max graphs {budget} ({figures['steps']:,} steps)")
                for row in figures["rows"]:
                    print(
                        f"  {row['list']:<40} {row['graphs']:>3} {row['largest']:>4} "
                        f"{row['total_step_s']:>10.3f} s {row['hit_rate']:>7.2%}"
                    )
    record_run("bucket_time_bench", cases, folder=args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
