"""The compiled stepper's speed with prefix caching, against a baseline checkout.

Each case simulates 400 requests of the Mooncake synthetic trace on the compiled stepper
(``simulate(native=True)``; the trace's hashes make every full block an entry of the
prefix cache) and keeps the best of five CPU times, in each of three processes (the
best of all kept: the machine is shared). With ``--baseline CHECKOUT`` every case also
runs under that checkout's own Python (its ``.venv``, its build), the two processes in
turn, and the record holds both and their ratio. Writes
``bench/results/prefix_cache_speed-<UTC time>.json``.

    python bench/prefix_cache_speed.py [--baseline /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MOONCAKE = "/work/shared/traces/mooncake_synthetic.jsonl"
#: name -> settings; the hybrid model's conv states as blocks of the pool where the
#: checkout has that model (its default), slots apart in ``hybrid-slots-apart``.
CASES = {
    "hybrid": {},
    "hybrid-50gib": {"memory.kv_cache_gib": 50.0},
    "hybrid-slots-apart": {"memory.align_state_blocks": False},
    "attention-only": {"model.conv_layers": 0},
    "attention-only-12gib-2-drafts": {
        "model.conv_layers": 0,
        "memory.kv_cache_gib": 12.0,
        "scheduler.num_spec_tokens": 2,
    },
}
RUNS = 5
#: Processes per case and checkout, taken in turn with the baseline's.
ROUNDS = 3


def time_case(settings: dict) -> dict:
    """Best of :data:`RUNS` CPU seconds of one simulation, and its steps."""
    from stepplan.sim.run import simulate
    from stepplan.sim.settings.config import SimConfig, with_settings
    from stepplan.sim.traces import load_trace

    table = load_trace(MOONCAKE).limit(400)
    config = with_settings(SimConfig(), settings)
    best, steps = float("inf"), 0
    for _ in range(RUNS):
        start = time.process_time()
        result = simulate(table, config, native=True)
        best = min(best, time.process_time() - start)
        steps = int(result.summary["steps"]["count"])
    return {"cpu_s": best, "steps": steps}


def in_checkout(checkout: Path, settings: dict) -> dict:
    """:func:`time_case` under ``checkout``'s Python (``None`` figures: it refused)."""
    python = checkout / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), __file__, "--one", json.dumps(settings)],
        capture_output=True,
        text=True,
        cwd=checkout,
        check=False,
    )
    if done.returncode:
        return {"cpu_s": None, "steps": None}
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one case, under this Python
    args = parser.parse_args()
    if args.one:
        print(json.dumps(time_case(json.loads(args.one))))
        return
    here = Path(__file__).resolve().parent.parent
    figures: dict = {}
    for name, settings in CASES.items():
        new_s, old_s, steps = [], [], None
        for _ in range(ROUNDS):
            new = in_checkout(here, settings)
            new_s.append(new["cpu_s"])
            steps = new["steps"]
            if args.baseline:
                old_s.append(in_checkout(args.baseline, settings)["cpu_s"])
        figures[name] = {"cpu_s": min(new_s), "steps": steps}
        if old_s and None not in old_s:
            figures[name]["baseline_cpu_s"] = min(old_s)
            figures[name]["speedup"] = min(old_s) / min(new_s)
        print(name, figures[name], flush=True)
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_record import record_run

    baseline = None
    if args.baseline:
        head = ["git", "-C", str(args.baseline), "rev-parse", "HEAD"]
        baseline = subprocess.run(head, capture_output=True, text=True, check=False).stdout
    record_run(
        "prefix_cache_speed",
        figures,
        title="Compiled stepper with prefix caching, Mooncake 400 requests",
        baseline_commit=(baseline or "").strip() or None,
        headline=[f"{name}.speedup" for name in CASES if name != "hybrid-slots-apart"],
    )


if __name__ == "__main__":
    main()
