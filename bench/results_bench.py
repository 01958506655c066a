"""Memory and Ctrl-C latency of large runs' results: writing them as the run goes, reading
them back for ``stepplan report`` and ``stepplan buckets``, ``--limit`` on a large trace.

    python bench/results_bench.py [--requests 2350000] [--trace-requests 9200000]
    python bench/results_bench.py --requests 200000 --vs-tree /tmp/i44-base --only-common

Every case runs in a child process that reports its own peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) when it ends; the Ctrl-C cases also poll
the child's RSS from ``/proc`` to tell the peak before the signal from the peak after it.

- ``simulation``: the simulation alone, its steps handed to a store that keeps nothing
  (an older tree: ``simulate()``, which keeps them): the simulation's own memory.
- ``simulate``: ``stepplan simulate SPEC --out DIR``, the same run with its results
  written; the ratio of the two peaks is what writing costs.
- ``report``, ``buckets``: on that folder.
- ``limit``: ``stepplan simulate TRACE --limit 3000`` on a trace of ``--trace-requests``
  requests that the script writes first (a Vidur CSV).
- ``interrupt-steps``: the ``simulate`` run again, SIGINT once it has simulated 80% of
  its steps; ``interrupt-trace``: the large trace (arrivals far faster than the model
  serves them, so millions of requests are unfinished), SIGINT after 200,000 steps.
  Each: seconds from the signal to the exit, the exit code, the peaks before and after.

``--vs-tree DIR`` runs the ``simulation``, ``simulate``, ``report`` and ``buckets`` cases
with the stepplan of an older checkout too (its C extensions built in place, as
``sim_bench.py`` says). The record (date, device, command, commit, figures) goes to
``bench/results/`` as one JSON file per run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_record import RESULTS, new_record, write_record

PACKAGES = ("planner", "executor", "sim", "plots")
#: The synthetic workload: about 4.3 steps per request, one or two rows a step.
SPEC = "synthetic:n={n},rate=50,prompt=uniform:16:256,output=uniform:1:64"
#: The large trace's workload: arrivals far faster than the model serves them.
#: The figures the README shows.
HEADLINE = [
    "new_tree.simulate.peak_mib",
    "new_tree.simulate.wall_s",
    "new_tree.report.peak_mib",
    "new_tree.interrupt-steps.signal_to_exit_s",
]
TRACE_SPEC = dict(rate=2000.0, prompt=(16, 512), output=(1, 64))

#: A child: run the command line (or the simulation alone) and report the peak RSS.
CHILD = """
import json, os, resource, sys, time
started = time.perf_counter()
argv = json.loads(sys.argv[1])
if argv[0] == "--simulation-only":
    from stepplan.sim import run
    from stepplan.sim.settings.config import SimConfig
    from stepplan.sim.workloads import parse_synthetic
    table = run.prepare_requests(parse_synthetic(argv[1]), SimConfig())
    if hasattr(run, "run_steps"):
        class Nothing:
            def start(self, rows): pass
            def add_steps(self, steps): pass
            def add_requests(self, rows): pass
        steps = run.run_steps(table, SimConfig(), Nothing()).summary["steps"]["count"]
    else:
        steps = run.simulate(table, SimConfig()).summary["steps"]["count"]
    code = 0
else:
    from stepplan.sim.cli import main
    code, steps = main(argv), None
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
with open(os.environ["RESULTS_BENCH_OUT"], "w") as out:
    json.dump({"rc": code, "peak_mib": peak, "wall_s": time.perf_counter() - started,
               "steps": steps}, out)
sys.exit(code)
"""


def shim(tree: Path, folder: Path) -> Path:
    """A folder whose ``stepplan`` package is ``tree``'s (for ``PYTHONPATH``)."""
    package = folder / "stepplan"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in PACKAGES:
        (package / name).symlink_to(tree / name, target_is_directory=True)
    return folder


def child(argv: list[str], cwd: Path, path: Path | None = None) -> subprocess.Popen:
    """The child for ``argv`` (``path``: import stepplan from there)."""
    env = {**os.environ, "RESULTS_BENCH_OUT": str(cwd / ".child.json")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    command = [sys.executable, "-c", CHILD, json.dumps(argv)]
    return subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, cwd: Path) -> dict:
    err = process.communicate()[1]
    if not (cwd / ".child.json").exists():
        raise SystemExit(f"the child failed ({process.returncode}):\n{err[-3000:]}")
    record = json.loads((cwd / ".child.json").read_text())
    (cwd / ".child.json").unlink()
    record["stderr_tail"] = err.strip().splitlines()[-2:]
    return record


def run(argv: list[str], cwd: Path, path: Path | None = None) -> dict:
    """One case: the child's record (exit code, peak RSS in MiB, wall seconds)."""
    print(f"  {' '.join(argv)[:140]}", file=sys.stderr, flush=True)
    return finished(child(argv, cwd, path), cwd)


def rss_mib(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((line for line in text.splitlines() if line.startswith("VmRSS:")), "0 0")
    return int(line.split()[1]) / 1024


def cpu_s(pid: int) -> float | None:
    """The process's CPU seconds so far (user + system), ``None`` once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interrupted(argv: list[str], cwd: Path, steps: int) -> dict:
    """``argv`` with progress lines on; SIGINT once they report ``steps`` steps."""
    print(f"  {' '.join(argv)[:140]} (SIGINT at {steps:,} steps)", file=sys.stderr, flush=True)
    process = child(argv, cwd)
    peaks = {"before": 0.0, "after": 0.0}
    cpu = {"at_signal": 0.0, "last": 0.0}
    signalled: list[float] = []
    lines: list[str] = []

    def poll() -> None:
        while process.poll() is None:
            side = "after" if signalled else "before"
            peaks[side] = max(peaks[side], rss_mib(process.pid))
            seen = cpu_s(process.pid)
            if seen is not None:
                cpu["last" if signalled else "at_signal"] = seen
            time.sleep(0.05)

    watcher = threading.Thread(target=poll)
    watcher.start()
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)
        done = line.split(" steps,")[0].rsplit(" ", 1)[-1].replace(",", "")
        if not signalled and done.isdigit() and int(done) >= steps:
            signalled.append(time.perf_counter())
            process.send_signal(signal.SIGINT)
    process.wait()
    exited = time.perf_counter()
    watcher.join()
    record = json.loads((cwd / ".child.json").read_text())
    (cwd / ".child.json").unlink()
    record.update(
        signal_to_exit_s=exited - signalled[0] if signalled else None,
        cpu_after_signal_s=cpu["last"] - cpu["at_signal"] if signalled else None,
        load_average=os.getloadavg(),
        peak_before_signal_mib=peaks["before"],
        peak_after_signal_mib=peaks["after"],
        stderr_tail=[line.strip() for line in lines[-2:]],
    )
    return record


def write_trace_file(path: Path, requests: int) -> dict:
    """The large trace, written by a child (the table and its text take a few GB)."""
    code = (
        "import sys; from stepplan.sim.workloads import synthetic_table, LengthDist; "
        "from stepplan.sim.traces import write_trace; "
        f"t = synthetic_table({requests}, {TRACE_SPEC['rate']}, "
        f"LengthDist('uniform', {TRACE_SPEC['prompt']}), "
        f"LengthDist('uniform', {TRACE_SPEC['output']}), seed=7); "
        f"write_trace(t, {str(path)!r}, 'vidur')"
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return {
        "requests": requests,
        "bytes": path.stat().st_size,
        "wall_s": time.perf_counter() - started,
    }


def tree_cases(work: Path, spec: str, path: Path | None) -> dict:
    """The cases every tree runs: the simulation alone, with its results, and the
    readers on them."""
    out = work / "run"
    cases = {"simulation": run(["--simulation-only", spec], work, path)}
    cases["simulate"] = run(["simulate", spec, "--quiet", "--out", str(out)], work, path)
    cases["report"] = run(["report", str(out), "--out", str(work / "report.html")], work, path)
    cases["buckets"] = run(["buckets", str(out), "--figure", str(work / "b.png")], work, path)
    summary = json.loads((out / "summary.json").read_text())
    cases["steps"] = summary["steps"]["count"]
    cases["requests"] = summary["requests"]
    cases["files_mib"] = {p.name: p.stat().st_size / 2**20 for p in out.iterdir()}
    cases["write_over_simulation"] = cases["simulate"]["peak_mib"] / cases["simulation"]["peak_mib"]
    return cases


def new_only_cases(work: Path, spec: str, steps: int, trace_requests: int) -> dict:
    trace = work / "large.csv"
    cases = {"trace": write_trace_file(trace, trace_requests)}
    limit = ["simulate", str(trace), "--limit", "3000", "--quiet", "--out", str(work / "limit")]
    cases["limit"] = run(limit, work)
    stop = ["simulate", spec, "--out", str(work / "stop-steps")]
    cases["interrupt-steps"] = interrupted(stop, work, int(0.8 * steps))
    stop = ["simulate", str(trace), "--out", str(work / "stop-trace")]
    cases["interrupt-trace"] = interrupted(stop, work, 200_000)
    for name in ("stop-steps", "stop-trace"):
        summary = json.loads((work / name / "summary.json").read_text())
        key = "interrupt-" + name.split("-")[1]
        cases[key]["partial"] = {
            k: summary[k] for k in ("complete", "requests", "finished_requests")
        } | {"steps": summary["steps"]["count"]}
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_350_000, help="synthetic requests")
    parser.add_argument("--trace-requests", type=int, default=9_200_000)
    parser.add_argument("--vs-tree", type=Path, help="an older checkout, built in place")
    parser.add_argument(
        "--only-common",
        action="store_true",
        help="only the cases every tree runs (simulation, simulate, report, buckets)",
    )
    parser.add_argument("--record", type=Path, default=RESULTS)
    args = parser.parse_args()
    spec = SPEC.format(n=args.requests)
    record = new_record("results_bench", {}, spec=spec, headline=HEADLINE)
    del record["figures"]  # this benchmark's figures sit at the record's top level
    with tempfile.TemporaryDirectory(prefix="results-bench-") as scratch:
        work = Path(scratch)
        if args.vs_tree is not None:
            (work / "old").mkdir()
            path = shim(args.vs_tree.resolve(), work / "shim")
            record["old_tree"] = {"path": str(args.vs_tree), **tree_cases(work / "old", spec, path)}
        (work / "new").mkdir()
        new = tree_cases(work / "new", spec, None)
        if not args.only_common:
            new |= new_only_cases(work / "new", spec, new["steps"], args.trace_requests)
        record["new_tree"] = new
    write_record(record, args.record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
