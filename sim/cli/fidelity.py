"""``stepplan fidelity``: the live engine against the simulator on one trace slice.

1. **Live.** The engine (live mode, measured time) serves the slice; every step's shape,
   measured time and coldness are kept (:class:`Recorder`), and every request's accepted
   drafts per spec step.
2. **Replay check.** The slice is simulated again with those accepted counts and those
   step times: the scheduler must make exactly the live run's batches (it decides from
   nothing else), so the comparison below compares like with like.
3. **Per step.** Every warm step the profile covers is predicted by the cost model's
   engine fit and scored by kind (:mod:`stepplan.sim.timing.fidelity`).
4. **End to end.** The slice is simulated with the replayed acceptance and the profile's
   step times; TTFT, TPOT and throughput are compared with the live run's.

``OUT`` (a results folder of its own, ``stepplan-manifest.json``) receives
``fidelity.json``, ``fidelity.png``, ``fidelity_steps.csv`` (per step: its whole shape,
measured and predicted time, its start on the run's clock and the host's),
``acceptance.jsonl`` (what ``--acceptance replay`` reads) and the two runs' results
folders ``live/`` and ``sim/``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ..acceptance import Replay
from ..live import engine_setup, length_limit
from ..results.outdir import ResultsFolder
from ..results.schema import RESULT_FILES
from ..results.sim_result import SimResult, write_results
from ..run import StepEvent, simulate
from ..settings.config import ConfigError, SimConfig, with_settings
from ..timing.engine_fit import StepShape, step_shape
from ..timing.engine_profile import EngineProfile, read_engine_profile
from ..timing.fidelity import StepErrors, StepRecord, end_to_end, step_errors
from .options import add_run_command, build_config, results_folder, run_progress
from .trace_reading import load_requests

FILES = ("fidelity.json", "fidelity.png", "fidelity_steps.csv", "acceptance.jsonl")
RUNS = ("live", "sim")
#: The issue's bar: per-step MAPE and end-to-end error, for kinds of at least this many steps.
TARGET_ERROR, MIN_STEPS = 0.05, 50


@attrs.define
class Recorder:
    """Keeps what the live run did, step by step (an observer of ``simulate``)."""

    records: list[StepRecord] = attrs.Factory(list)
    batches: list[tuple[int, ...]] = attrs.Factory(list)
    accepted: dict[int, list[int]] = attrs.Factory(dict)
    #: Each step's start on the run's clock, and the host's clock when it was recorded
    #: (seconds since the epoch: to line steps up with the GPU's own telemetry).
    clocks: list[tuple[float, float]] = attrs.Factory(list)

    def __call__(self, event: StepEvent) -> None:
        self.clocks.append((event.start_s, time.time()))
        outcome = event.outcome
        measured_us = event.costs.total * 1e6
        cold = bool(outcome is not None and outcome.cold)
        gpu = None if outcome is None or outcome.gpu_s is None else outcome.gpu_s * 1e6
        self.records.append(StepRecord(step_shape(event.plan), measured_us, cold, gpu))
        self.batches.append(_composition(event))
        spec = event.step.is_spec
        for request, count in zip(
            event.step.request_ids[spec].tolist(), event.accepted[spec].tolist(), strict=True
        ):
            self.accepted.setdefault(request, []).append(count)


def _composition(event: StepEvent) -> tuple[int, ...]:
    """A step's batch as the scheduler made it: requests and their query lengths."""
    return (*event.step.request_ids.tolist(), -1, *event.step.batch.query_lens.tolist())


def replay_of(accepted: dict[int, list[int]], num_requests: int) -> Replay:
    """Request ``r`` replays its own accepted counts (a request without spec steps gets a
    placeholder it never draws)."""
    sequences = [accepted.get(r) or [0] for r in range(num_requests)]
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    return Replay(offsets, np.concatenate([np.asarray(s, np.int64) for s in sequences]))


def _acceptance_jsonl(replay: Replay) -> str:
    lines = [
        json.dumps({"accepted": replay.values[a:b].tolist()})
        for a, b in zip(replay.offsets[:-1], replay.offsets[1:], strict=True)
    ]
    return "\n".join(lines) + "\n"


#: ``fidelity_steps.csv``'s columns of a step's :class:`StepShape` (after its graph).
SHAPE_COLUMNS = (
    "rows_spec", "rows_decode", "rows_prefill", "tokens_spec", "tokens_decode",
    "tokens_prefill", "tiles", "context_tokens", "prefill_pairs", "max_context",
    "prefill_context",
)  # fmt: skip


def _shape_cells(shape: StepShape) -> list[Any]:
    """``shape`` as :data:`SHAPE_COLUMNS` cells."""
    return [*shape.rows, *shape.tokens, shape.tiles, shape.context_tokens,
            repr(shape.prefill_pairs), shape.max_context, shape.prefill_context]  # fmt: skip


def shape_of_row(row: dict[str, str]) -> StepShape:
    """The :class:`StepShape` of one ``fidelity_steps.csv`` line (a ``csv.DictReader`` row):
    what rescoring a live run against another profile's fit reads."""
    graph = row["graph"].split(":") if row["graph"] else None
    counts = [int(row[name]) for name in SHAPE_COLUMNS[:7]]
    return StepShape(
        graph=None if graph is None else (graph[0], *map(int, graph[1:])),
        rows=(counts[0], counts[1], counts[2]),
        tokens=(counts[3], counts[4], counts[5]),
        tiles=counts[6],
        context_tokens=int(row["context_tokens"]),
        prefill_pairs=float(row["prefill_pairs"]),
        max_context=int(row["max_context"]),
        prefill_context=int(row["prefill_context"]),
    )


def _steps_csv(recorder: Recorder, profile: EngineProfile) -> str:
    """One line per live step: its kind, its whole :class:`StepShape` (so a run can be
    scored again against another profile's fit), the measured and predicted times."""
    from ..timing.fidelity import step_kind

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["step", "kind", "graph", "tokens", "rows", "cold", "measured_us", "gpu_us",
         "predicted_us", *SHAPE_COLUMNS, "start_s", "unix_s"]
    )  # fmt: skip
    for index, (record, clocks) in enumerate(zip(recorder.records, recorder.clocks, strict=True)):
        shape = record.shape
        guess = profile.fit.predict_us(shape)
        graph = "" if shape.graph is None else ":".join(map(str, shape.graph))
        writer.writerow(
            [index, step_kind(shape), graph, shape.num_tokens, shape.num_rows,
             int(record.cold), repr(record.measured_us),
             "" if record.gpu_us is None else repr(record.gpu_us),
             "" if guess is None else repr(guess), *_shape_cells(shape), repr(clocks[0]),
             repr(clocks[1])]
        )  # fmt: skip
    return out.getvalue()


def score(
    errors: StepErrors,
    e2e: dict[str, dict[str, float | None]],
    replay_identical: bool,
    records: list[StepRecord],
) -> dict[str, Any]:
    """The ``fidelity.json`` document's scores (see the module docstring)."""
    by_kind = errors.by_kind()
    cold = [r.measured_us for r in records if r.cold]
    scored = [k for k, v in by_kind.items() if v["n"] >= MIN_STEPS]
    met_steps = all(by_kind[k]["mape"] <= TARGET_ERROR for k in scored)
    met_e2e = all(v["error"] is not None and abs(v["error"]) <= TARGET_ERROR for v in e2e.values())
    return {
        "steps": by_kind,
        "all_steps": {
            "n": int(errors.ape.size),
            "mape": float(errors.ape.mean()) if errors.ape.size else None,
        },
        "cold_steps": {"n": len(cold), "measured_s": sum(cold) * 1e-6},
        "uncovered_steps": errors.uncovered,
        "end_to_end": e2e,
        "replay_check": {"identical_batches": replay_identical, "steps": len(records)},
        "targets": {
            "error": TARGET_ERROR,
            "min_steps": MIN_STEPS,
            "per_step_met": met_steps,
            "end_to_end_met": met_e2e,
        },
    }


def _configs(args: argparse.Namespace) -> tuple[SimConfig, SimConfig, EngineProfile]:
    """The live run's settings, the simulation's, and the profile (checked against both)."""
    base = build_config(args)
    profile_path = base.cost.profile
    if not profile_path:
        raise ConfigError("fidelity: needs --profile FILE (what `stepplan profile` wrote)")
    profile = read_engine_profile(profile_path)
    live = with_settings(base, {"live.enabled": True, "live.time": "measured"})
    live = _profiled_positions(live, profile)
    simulated = with_settings(base, {"live.enabled": False, "cost.profile": str(profile_path)})
    profile.check_setup(*engine_setup(live, live.plan))
    return live, simulated, profile


def _profiled_positions(live: SimConfig, profile: EngineProfile) -> SimConfig:
    """The live engine with the profiled engine's KV positions per slot unless
    ``live.max_len`` says otherwise: attention's graphs are captured for that many keys,
    so the engine that runs is the one measured. Only a profile of the model's whole
    length qualifies: every request the run admits fits it."""
    measured = profile.runner.get("max_len")
    if live.live.max_len is not None or measured != length_limit(live):
        return live
    return with_settings(live, {"live.max_len": measured})


def run_fidelity(args: argparse.Namespace) -> int:
    """``stepplan fidelity``: live run, replay check, per-step and end-to-end scores."""
    live_config, sim_config, profile = _configs(args)
    key = {"trace": args.trace, "limit": args.limit, "config": live_config.to_dict()}
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(
            results_folder(args, live_config, key, kind="fidelity", names=RUNS + FILES)
        )
        folders = {
            run: stack.enter_context(
                ResultsFolder.claim(
                    Path(base.shown) / run, overwrite=args.overwrite, names=RESULT_FILES
                )
            )
            for run in RUNS
        }
        requests = load_requests(args, live_config)
        recorder = Recorder()
        progress = run_progress(args, requests.num_requests, "live run", stoppable=False)
        live = simulate(requests, live_config, observer=recorder, progress=progress)
        write_results(live, folders["live"])
        # The simulation models the engine that ran: a prefix cache only if it kept one.
        caching = bool(live.summary["memory"]["prefix_caching"])
        sim_config = with_settings(sim_config, {"memory.prefix_caching": caching})
        replay = replay_of(recorder.accepted, requests.num_requests)
        check = Recorder()
        durations = [r.measured_us * 1e-6 for r in recorder.records]
        simulate(requests, sim_config, acceptance=replay, durations=durations, observer=check)
        predicted = simulate(requests, sim_config, acceptance=replay)
        write_results(predicted, folders["sim"])
        errors = step_errors(recorder.records, profile.fit)
        document = _document(args, profile, live, predicted, recorder, check, errors)
        base.put(lambda stage: _write_files(stage, document, recorder, replay, profile, errors))
        base.record([*RUNS, *FILES])
    if not args.quiet:
        print(_summary_lines(document, base.shown))
    return 0


def _document(
    args: argparse.Namespace,
    profile: EngineProfile,
    live: SimResult,
    predicted: SimResult,
    recorder: Recorder,
    check: Recorder,
    errors: StepErrors,
) -> dict[str, Any]:
    e2e = end_to_end(live.summary, predicted.summary)
    identical = check.batches == recorder.batches
    return {
        "trace": live.summary["trace"],
        "requests": live.summary["requests"],
        "profile": {
            "path": profile.source,
            "device": profile.device,
            "preset": dict(profile.preset),
        },
        "live_run": live.summary.get("live_run"),
        **score(errors, e2e, identical, recorder.records),
    }


def _write_files(
    stage: Path,
    document: dict[str, Any],
    recorder: Recorder,
    replay: Replay,
    profile: EngineProfile,
    errors: StepErrors,
) -> list[str]:
    from stepplan.plots.canvas import figure_bytes
    from stepplan.plots.fidelity import plot_fidelity

    (stage / "fidelity.json").write_text(json.dumps(document, indent=2) + "\n")
    (stage / "fidelity_steps.csv").write_text(_steps_csv(recorder, profile))
    (stage / "acceptance.jsonl").write_text(_acceptance_jsonl(replay))
    title = f"{profile.preset.get('name')} on {profile.device}: simulated against measured steps"
    figure = plot_fidelity(errors.measured_us, errors.predicted_us, errors.kinds, title)
    (stage / "fidelity.png").write_bytes(figure_bytes(figure, "png"))
    return list(FILES)


def _summary_lines(document: dict[str, Any], shown: str) -> str:
    lines = ["per step (warm, covered):  kind      n    MAPE"]
    for kind, row in document["steps"].items():
        lines.append(f"  {kind:<8} {row['n']:>6} {100 * row['mape']:7.2f}%")
    lines.append(
        f"cold steps {document['cold_steps']['n']}, uncovered {document['uncovered_steps']}; "
        f"replayed batches identical: {document['replay_check']['identical_batches']}"
    )
    lines.append("end to end:        live        sim    error")
    for name, row in document["end_to_end"].items():
        live, sim, error = row["live"], row["sim"], row["error"]
        text = "-" if error is None else f"{100 * error:+.2f}%"
        lines.append(f"  {name:<20} {_num(live):>10} {_num(sim):>10} {text:>8}")
    lines.append(f"\nresults: {shown}/ (fidelity.json, fidelity.png, live/, sim/)")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def add_fidelity(subparsers: Any) -> None:
    """``fidelity [TRACE] --profile FILE [options]``."""
    add_run_command(
        subparsers,
        "fidelity",
        run_fidelity,
        help="run the live engine on a trace slice and measure the simulator against it",
        description="Serve a trace slice on the live engine with measured time, then "
        "replay its steps through the cost model (per-step error by kind) and simulate "
        "the slice with its acceptance (end-to-end TTFT, TPOT, throughput). Needs the "
        "engine profile of `stepplan profile`.",
    )
