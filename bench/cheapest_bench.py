"""Wall and CPU time of ``stepplan capacity --find cheapest`` over the issue's grid: GPU
presets x tensor-parallel sizes x co-located or disaggregated x the fewest replicas (1 to
``--max-replicas``), on a trace (the Azure code trace where the shared copy is, else the
bundled one), with ``--workers`` processes; with ``--ray`` the same search again on a
local Ray of ``--workers`` CPUs, and whether its table is the same bytes.

    python bench/cheapest_bench.py [--gpus H100,H200,A100] [--tensor 1,2,4]
        [--disaggregation off,on] [--workers 2] [--trace PATH] [--ray]

The record (date, device, command, commit, load average, figures: wall and CPU seconds,
candidates, replica counts run, the answer's price) goes to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_record import ROOT, record_run

CLI = "import sys; from stepplan.sim import cli; sys.exit(cli.main(sys.argv[1:]))"
#: The issue's trace, where this machine has it.
AZURE_CODE = Path("/work/shared/traces/azure_llm_2023_code.csv")
#: Starts a local Ray of ``argv[1]`` CPUs, then runs the command line on it.
ON_RAY = (
    "import sys, ray; ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, "
    "logging_level='ERROR'); from stepplan.sim import cli; code = cli.main(sys.argv[2:]); "
    "ray.shutdown(); sys.exit(code)"
)


def _timed(command: list[str]) -> tuple[float, float]:
    """Run ``command``; its wall seconds and its CPU seconds (user + sys, children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="H100,H200,A100")
    parser.add_argument("--tensor", default="1,2,4")
    parser.add_argument("--disaggregation", default="off,on")
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trace", default=str(AZURE_CODE) if AZURE_CODE.exists() else "")
    parser.add_argument("--ray", action="store_true", help="run it again on a local Ray")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "cheapest"
        argv = ["capacity", *([args.trace] if args.trace else []), "--find", "cheapest"]
        argv += ["--gpus", args.gpus, "--tensor", args.tensor]
        argv += ["--disaggregation", args.disaggregation]
        argv += ["--max-replicas", str(args.max_replicas)]
        shown = ["stepplan", *argv, "--workers", str(args.workers)]
        wall_s, cpu_s = _timed(
            [
                sys.executable,
                "-c",
                CLI,
                *argv,
                "--workers",
                str(args.workers),
                "--quiet",
                "--out",
                str(out),
            ]
        )
        document = json.loads((out / "capacity.json").read_text())
        runs = len(list((out / "points").glob("*.json")))
        figures = {"wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2)}
        if args.ray:
            ray_out = Path(scratch) / "ray"
            ray_wall_s, ray_cpu_s = _timed(
                [
                    sys.executable,
                    "-c",
                    ON_RAY,
                    str(args.workers),
                    *argv,
                    "--ray",
                    "",
                    "--quiet",
                    "--out",
                    str(ray_out),
                ]
            )
            same = (ray_out / "capacity.csv").read_bytes() == (out / "capacity.csv").read_bytes()
            figures |= {"ray_wall_s": round(ray_wall_s, 2), "ray_driver_cpu_s": round(ray_cpu_s, 2)}
            figures["ray_same_table"] = int(same)
    answer = document["answer"] or {}
    candidates = document["candidates"]
    figures |= {
        "candidates": len(candidates),
        "replica_runs": runs,
        "candidates_meeting_slo": sum(row["met"] for row in candidates),
        "disaggregated_meeting_slo": sum(row["met"] for row in candidates if row["disaggregated"]),
        "cheapest_usd_per_hour": answer.get("usd_per_hour"),
        "cheapest_gpus": answer.get("gpus"),
    }
    pools = " per pool (disaggregated)" if answer.get("disaggregated") else ""
    said = f"{answer.get('replicas')} x {answer.get('gpu')} at TP {answer.get('tensor')}{pools}"
    record_run(
        "capacity_cheapest",
        figures,
        title="The cheapest deployment meeting the SLO (capacity --find cheapest)",
        notes=[
            f"answer: {said}; SLO {document['slo']}",
            " ".join(shown),
            f"prices: {document['price_per_gpu_hour']}; KV link: {document.get('kv_link')}",
        ],
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
