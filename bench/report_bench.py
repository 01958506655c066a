"""Time and memory of ``stepplan report`` on a large run (issue 49: a 600k-step run within
5 s and 500 MB).

    python bench/report_bench.py [--requests 140000] [--folder DIR] [--repeat 3]
    python bench/report_bench.py --folder /tmp/r600k --vs-tree /tmp/old-checkout

Makes the results folder once (``stepplan simulate`` of :data:`results_bench.SPEC`; or
reads ``--folder``), then runs ``stepplan report`` on it ``--repeat`` times, each in a
child process: its CPU seconds (user + system: the host is shared, so CPU time is the
figure to compare), wall seconds and peak RSS, the least of each over the repeats.
``--vs-tree`` runs the same with an older checkout's stepplan (``results_bench.shim``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_record import RESULTS, new_record, write_record
from results_bench import SPEC, shim

#: The child: the command line, then its own CPU time and peak RSS.
CHILD = """
import json, resource, sys
from stepplan.sim.cli import main
code = main(json.loads(sys.argv[1]))
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rc": code, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_mib": usage.ru_maxrss / 1024}))
"""
HEADLINE = ["new_tree.cpu_s", "new_tree.wall_s", "new_tree.peak_mib", "steps"]
TITLE = "stepplan report on a large run"
NOTES = [
    "The least of --repeat runs. CPU seconds (user + system) are the figure to compare: "
    "on a shared host the wall time holds other processes' turns (see load_average).",
    "old_tree: the checkout --vs-tree names, on the same results folder.",
]


def report_once(folder: Path, out: Path, path: Path | None) -> dict:
    """One ``stepplan report`` child: its exit code, CPU and wall seconds, peak RSS."""
    env = None if path is None else {"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"}
    argv = ["report", str(folder), "--out", str(out), "--overwrite", "--quiet"]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argv)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"report failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(lines[-1]), "wall_s": wall}


def best_of(folder: Path, out: Path, repeat: int, path: Path | None = None) -> dict:
    runs = [report_once(folder, out, path) for _ in range(repeat)]
    return {key: round(min(run[key] for run in runs), 3) for key in ("cpu_s", "wall_s", "peak_mib")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=140_000, help="synthetic requests")
    parser.add_argument("--folder", type=Path, help="an existing results folder to report")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vs-tree", type=Path, help="an older checkout, built in place")
    parser.add_argument("--record", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-bench-") as scratch:
        work = Path(scratch)
        folder = args.folder
        if folder is None:
            folder = work / "run"
            spec = SPEC.format(n=args.requests)
            command = ["simulate", spec, "--out", str(folder), "--quiet"]
            code = "import sys; from stepplan.sim.cli import main; sys.exit(main(sys.argv[1:]))"
            subprocess.run([sys.executable, "-c", code, *command], check=True)
        summary = json.loads((folder / "summary.json").read_text())
        figures: dict = {"steps": summary["steps"]["count"], "requests": summary["requests"]}
        figures["new_tree"] = best_of(folder, work / "report.html", args.repeat)
        if args.vs_tree is not None:
            path = shim(args.vs_tree.resolve(), work / "shim")
            old = best_of(folder, work / "report-old.html", args.repeat, path)
            figures["old_tree"] = {"path": str(args.vs_tree), **old}
    record = new_record("report_bench", figures, title=TITLE, notes=NOTES, headline=HEADLINE)
    write_record(record, args.record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
