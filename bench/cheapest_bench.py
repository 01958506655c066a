"""Wall time of ``stepplan capacity --find cheapest`` over the issue's grid: GPU presets x
tensor-parallel sizes x the fewest replicas (1 to ``--max-replicas``), on the bundled
Azure code trace, with ``--workers`` processes.

    python bench/cheapest_bench.py [--gpus H100,H200,A100] [--tensor 1,2,4] [--workers 2]

The record (date, device, command, commit, figures: wall seconds, pairs, replica counts
run, the answer's price) goes to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_record import ROOT, record_run

CLI = "import sys; from stepplan.sim import cli; sys.exit(cli.main(sys.argv[1:]))"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="H100,H200,A100")
    parser.add_argument("--tensor", default="1,2,4")
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "cheapest"
        argv = ["capacity", "--find", "cheapest", "--gpus", args.gpus, "--tensor", args.tensor]
        argv += ["--max-replicas", str(args.max_replicas), "--workers", str(args.workers)]
        argv += ["--quiet", "--out", str(out)]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", CLI, *argv], cwd=ROOT, check=True)
        wall_s = time.perf_counter() - started
        document = json.loads((out / "capacity.json").read_text())
        runs = len(list((out / "points").glob("*.json")))
    answer = document["answer"] or {}
    figures = {
        "wall_s": round(wall_s, 2),
        "pairs": len(document["candidates"]),
        "replica_runs": runs,
        "pairs_meeting_slo": sum(row["met"] for row in document["candidates"]),
        "cheapest_usd_per_hour": answer.get("usd_per_hour"),
        "cheapest_gpus": answer.get("gpus"),
    }
    said = f"{answer.get('replicas')} x {answer.get('gpu')} at TP {answer.get('tensor')}"
    record_run(
        "capacity_cheapest",
        figures,
        title="The cheapest deployment meeting the SLO (capacity --find cheapest)",
        notes=[f"answer: {said}; SLO {document['slo']}", f"stepplan {' '.join(argv[:-2])}"],
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
