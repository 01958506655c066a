"""The bucket-time prediction re-evaluated on a live proof's returned files, by step kind.

A live proof (``bench/graph_sizes_live.py``) returns its record, its engine profile and
the optimizer run's ``requests.csv``; its ``steps.csv`` may not come back. The step shapes
are then rebuilt by simulating the same slice with the profile's times and the live
model's acceptance (``--accepted``: the share of drafts it accepted, from
``requests.csv``), once per list of the record, and predicted under each list with the
live run's context per row; the measured totals are the record's. Where a run folder
with ``steps.csv`` is given (``--runs``), its own steps are predicted instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from graph_sizes_live import STEP_KINDS, _step_kinds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="the live proof's JSON record")
    parser.add_argument("profile", type=Path, help="the engine profile it used")
    parser.add_argument("requests", type=Path, help="a live run's requests.csv")
    parser.add_argument("--out", type=Path, default=Path("results/graph_sizes_reeval"))
    args = parser.parse_args()
    from stepplan.sim.buckets.bucket_time import predict
    from stepplan.sim.buckets.demand import row_context_of
    from stepplan.sim.cli import main as cli
    from stepplan.sim.cli.buckets import run_config, run_costs, run_demand
    from stepplan.sim.results.sim_result import read_step_shapes

    record = json.loads(args.record.read_text())
    setup = record["setup"]
    table = np.genfromtxt(args.requests, delimiter=",", names=True)
    context = row_context_of(table["prompt_tokens"], table["output_tokens"], table["num_steps"])
    drafted, accepted = table["drafted_tokens"].sum(), table["accepted_tokens"].sum()
    length = 1.0 + 3.0 * accepted / max(drafted, 1.0)
    print(f"live run: context per row {context} tokens, acceptance length {length:.2f}")
    for name, run in record["runs"].items():
        folder = args.out / name
        argv = ["simulate", str(ROOT / "sim" / "data" / Path(setup["trace"]).name),
                "--start-s", str(setup["start_s"]), "--limit", str(setup["requests"]),
                "--set", f"model.name={setup['model']}",
                "--set", "acceptance.model=fixed", "--set", f"acceptance.length={length}",
                "--num-spec-tokens", str(setup["num_spec_tokens"]),
                "--max-num-seqs", str(setup["max_num_seqs"]),
                "--max-num-batched-tokens", str(setup["max_num_batched_tokens"]),
                "--graph-mode", "full", "--profile", str(args.profile),
                "--graph-sizes", ",".join(map(str, run["graph_sizes"])),
                "--out", str(folder), "--overwrite", "--quiet"]  # fmt: skip
        if cli(argv) != 0:
            return 2
        results = read_step_shapes(folder)
        config = run_config(results)
        demand = run_demand(results, config)
        import attrs

        demand = attrs.evolve(demand, row_context=context)
        largest = SimpleNamespace(profile=str(args.profile), largest=setup["max_num_seqs"])
        costs, _ = run_costs(demand, config, largest)
        prediction = predict(demand, costs, run["graph_sizes"])
        steps = demand.num_steps
        print(f"{name}: {run['graph_sizes']}")
        print(f"  measured {run['measured_total_s']:.3f} s over {run['steps']:,} steps "
              f"({run['measured_total_s'] / run['steps'] * 1e3:.3f} ms a step)")  # fmt: skip
        print(f"  predicted {prediction.total_s:.3f} s over {steps:,} simulated steps "
              f"({prediction.total_s / steps * 1e3:.3f} ms a step)")  # fmt: skip
        rows = [s for s in run["graph_sizes"] if s <= demand.max_num_seqs]
        graph = demand.uniform & (demand.need <= max(rows))
        kind = _step_kinds(*demand.kind_rows, graph)
        for i, label in enumerate(STEP_KINDS):
            mine = kind == i
            count = float(demand.counts[mine].sum())
            if count:
                total = float((prediction.step_us * demand.counts)[mine].sum()) * 1e-6
                print(f"  {label:>14}: {count:6.0f} steps, {total:.3f} s, "
                      f"{total / count * 1e3:.3f} ms a step")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
