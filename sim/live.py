"""Live mode: the simulated model runs every step, and its greedy tokens decide acceptance.

The model is the one the cost model describes: ``model.name``'s preset
(``sim/settings/presets.py``), built at full size with seeded random weights by
``stepplan.executor.model.HybridModelRunner`` -- short-conv layers through the executor's
kernels, attention over a KV cache indexed by the scheduler's slots, CUDA graphs per
bucket -- with the loop's planner config and the scheduler's slots (``1..slots``, the
same index in every layer group). The simulation loop (``run.py``) hands each step's
:class:`ScheduledStep` and compiled plan to a :class:`LiveStepper`, which folds the
greedy tokens back into each request:

- **Prompts.** A trace only has lengths, so request ``r`` gets ``prompt_tokens[r]``
  token ids drawn uniformly from the vocabulary, seeded by ``(run seed, r)``.
- **Inputs.** A prefill chunk feeds its tokens ``[computed, computed + q)`` of the
  request's stream (its prompt, and after a preemption the output it already had); a
  decode feeds the last emitted token; a spec row feeds it and its ``k = q - 1`` drafts.
- **Drafts.** Prompt lookup (``NgramIndex``, ``propose_drafts``'s answers in constant
  time) over the request's stream; when it finds fewer than ``k`` the rest repeat its
  last draft (or the last token), and are verified like any draft.
- **Sampling and verification.** The model computes logits where an engine samples: a
  spec row's every token, a decode row's, the last of a prefill chunk that completes
  the prompt. ``a`` = the longest prefix of drafts equal to the greedy tokens before
  them; the row emits those drafts and the greedy token after the last accepted one
  (``a + 1`` tokens, as ``Scheduler.commit`` expects).

Time (``live.time``): ``model`` keeps the cost model's step time, so only acceptance
is live; ``measured`` makes each step last what the engine took -- the planner's measured
time plus the runner's whole call, the stream synchronized at both ends -- which varies
from run to run. A bucket's CUDA graph is captured the first time a step needs it, before
that step and outside its time (a serving engine captures its graphs at start-up, never
while requests wait); the capture time is reported apart (``graph_capture_s``). A step
that compiled a Triton kernel is *cold* (:attr:`LiveOutcome.cold`); fidelity scoring keeps
such steps apart.

Only this module and the live-mode commands touch ``stepplan.executor``, inside
functions: a simulation without live mode never imports torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from stepplan.planner import DECODE, ExecutionPlan, PlannerConfig

from .scheduler import ScheduledStep
from .settings.config import ConfigError, SimConfig
from .settings.presets import MODEL_PRESETS

if TYPE_CHECKING:
    from stepplan.executor.model import HybridModelRunner

#: KV positions per slot are rounded up to this when sized from the trace.
_LEN_QUANTUM = 256


@attrs.frozen(eq=False)
class LiveOutcome:
    """One live step's result.

    Attributes:
        accepted: ``[R], int64`` accepted drafts per row (0 off the spec rows).
        wall_s: the runner's whole call (its stream synchronized at both ends).
        gpu_s: its GPU time by CUDA events (``None`` off CUDA).
        cold: the step compiled a kernel.
    """

    accepted: np.ndarray
    wall_s: float
    gpu_s: float | None = None
    cold: bool = False


def request_prompt(seed: int, request_id: int, length: int, vocab_size: int) -> np.ndarray:
    """``[length], int64`` the deterministic prompt of one request, ids in ``0..vocab - 1``."""
    rng = np.random.default_rng([seed % 2**63, request_id])
    return rng.integers(0, vocab_size, length, dtype=np.int64)


def pad_drafts(proposed: Sequence[int], count: int, last_token: int) -> list[int]:
    """``proposed`` (cut to ``count``) filled up to ``count`` by repeating its last
    draft, or ``last_token`` when it has none."""
    drafts = list(proposed[:count])
    fill = drafts[-1] if drafts else last_token
    return drafts + [fill] * (count - len(drafts))


def model_preset(config: SimConfig) -> dict[str, Any]:
    """``model.name``'s preset with the live run's dtype (``live.dtype`` when set)."""
    name = config.model.name
    if name not in MODEL_PRESETS:
        known = ", ".join(sorted(MODEL_PRESETS))
        raise ConfigError(f"model.name: no model preset {name!r} to run live (known: {known})")
    preset = dict(MODEL_PRESETS[name])
    if config.live.dtype is not None:
        preset["dtype"] = config.live.dtype
    return preset


def length_limit(config: SimConfig) -> int:
    """The longest context the live engine can hold: the preset's ``max_model_len`` or
    the simulation's, whichever is shorter."""
    return min(int(model_preset(config)["max_model_len"]), config.model.resolved().max_model_len)


def kv_positions(config: SimConfig, lengths: np.ndarray | None) -> int:
    """KV positions per slot: ``live.max_len``, else the longest request (prompt plus
    output) rounded up, within :func:`length_limit`."""
    limit = length_limit(config)
    if config.live.max_len is not None:
        if config.live.max_len > limit:
            raise ConfigError(f"live.max_len: {config.live.max_len} exceeds max_model_len {limit}")
        return config.live.max_len
    longest = int(lengths.max()) if lengths is not None and lengths.size else limit
    return min(limit, -(-longest // _LEN_QUANTUM) * _LEN_QUANTUM)


def engine_setup(
    config: SimConfig, planner: PlannerConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(preset, planner)`` as an engine profile records them and a simulation is checked
    against (``EngineProfile.check_setup``)."""
    preset = {"name": config.model.name, **_plain(model_preset(config))}
    return preset, {
        "num_spec_tokens": planner.num_spec_tokens,
        "graph_mode": planner.graph_mode,
        "graph_sizes": list(planner.sizes),
        "max_num_seqs": planner.max_num_seqs,
        "prefill_tile_tokens": planner.prefill_tile_tokens,
        "num_groups": config.scheduler.num_groups,
    }


def check_live(config: SimConfig) -> None:
    """Refuse live settings that cannot run, before anything does (``ConfigError``)."""
    if not config.live.enabled:
        return
    model_preset(config)
    import torch

    live = config.live
    if live.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("live.device: cuda asked for, but torch sees no CUDA device")
    cpu_triton = live.engine_backend == "triton" and live.device == "cpu"
    if cpu_triton and not os.environ.get("TRITON_INTERPRET"):
        raise ConfigError(
            "live.backend: triton on the CPU needs TRITON_INTERPRET=1 in the environment "
            "(interpreted, slow); use the reference backend or --live-device cuda"
        )


def make_runner(config: SimConfig, planner: PlannerConfig, max_len: int) -> HybridModelRunner:
    """The live engine: ``model.name``'s model, a slot per scheduler slot (and NULL)."""
    from stepplan.executor.model import HybridModelRunner, ModelShape

    check_live(attrs.evolve(config, live=attrs.evolve(config.live, enabled=True)))
    live = config.live
    try:
        shape = ModelShape(**model_preset(config), seed=live.seed)
        return HybridModelRunner(
            shape,
            planner,
            num_slots=config.scheduler.slots + 1,  # slot 0 is NULL
            max_len=max_len,
            num_groups=config.scheduler.num_groups,
            device=live.device,
            backend=live.engine_backend,
            attention=live.attention,
        )
    except ValueError as exc:
        raise ConfigError(f"live: {exc}") from None


class LiveStepper:
    """Runs the scheduler's steps on the live engine and keeps every request's tokens.

    Args:
        runner: the engine; its planner config must be the one the loop compiles
            plans with, its groups the scheduler's, its slots cover ``1..slots``.
        prompt_tokens: ``[N], int64`` prompt length of every request.
        config: the simulation's settings (``live``, ``scheduler`` and ``seed``).
    """

    def __init__(
        self, runner: HybridModelRunner, prompt_tokens: np.ndarray, config: SimConfig
    ) -> None:
        from stepplan.executor.engine import NgramIndex, accepted_prefix
        from stepplan.executor.kernels import compiled_variants
        from stepplan.executor.model import sample_positions

        scheduler = config.scheduler
        if runner.num_groups != scheduler.num_groups:
            raise ConfigError(
                f"live: the model has {runner.num_groups} layer groups, "
                f"scheduler.num_groups is {scheduler.num_groups}"
            )
        if runner.num_slots <= scheduler.slots:
            raise ConfigError(
                f"live: the model has {runner.num_slots} slots (0 is NULL), the scheduler "
                f"uses 1..{scheduler.slots}"
            )
        self.runner, self.settings = runner, config.live
        self._seed, self._model_name = config.seed, config.model.name
        self._prompt_lens = np.asarray(prompt_tokens, np.int64)
        self._streams: dict[int, Any] = {}  # NgramIndex per started request
        self._index, self._verify = NgramIndex, accepted_prefix
        self._samples, self._compiled = sample_positions, compiled_variants
        self.model_wall_s = 0.0
        self.capture_s = 0.0  # graph captures, outside every step's time
        self.warm_start_s, self.warm_start_steps = 0.0, 0

    @classmethod
    def create(cls, config: SimConfig, planner: PlannerConfig, table: Any) -> LiveStepper:
        """A stepper over a fresh :func:`make_runner` engine sized for ``table``'s
        requests (a ``RequestTable``), warmed up (:meth:`warm_start`) when its time is
        measured on a GPU."""
        lengths = np.asarray(table.prompt_tokens) + np.asarray(table.output_tokens)
        runner = make_runner(config, planner, kv_positions(config, lengths))
        stepper = cls(runner, table.prompt_tokens, config)
        if stepper.measured_time and runner.device.type == "cuda":
            stepper.warm_start(config.scheduler.max_num_batched_tokens)
        return stepper

    def warm_start(self, max_num_batched_tokens: int) -> None:
        """Run every eager shape of the profile grid once before serving, so that the
        kernels a run needs are compiled before its first request, as an engine warms
        up at start-up. The steps write their slots' state, which no request reads: a
        request's first step starts without history."""
        from .timing.profiler import GridLimits, profile_batches

        runner, start = self.runner, time.perf_counter()
        limits = GridLimits(
            max_num_batched_tokens, runner.num_slots, runner.max_len, runner.num_groups
        )
        rng = np.random.default_rng(self._seed)
        for batch in profile_batches(runner.planner.config, limits, seed=self._seed):
            plan = runner.planner.compile(batch)
            if plan.graph is None:
                ids = rng.integers(0, runner.shape.vocab_size, plan.num_tokens, dtype=np.int64)
                runner.run_plan(plan, ids, self._samples(batch))
                self.warm_start_steps += 1
        self.warm_start_s = time.perf_counter() - start

    @property
    def measured_time(self) -> bool:
        """Whether the engine's measured time replaces the cost model's."""
        return self.settings.time == "measured"

    def prompt(self, request_id: int) -> np.ndarray:
        """``[prompt_tokens], int64`` the request's prompt."""
        length = int(self._prompt_lens[request_id])
        return request_prompt(self._seed, request_id, length, self.runner.shape.vocab_size)

    def output(self, request_id: int) -> np.ndarray:
        """``[emitted], int64`` the tokens the request has emitted so far."""
        stream = self._streams.get(request_id)
        tokens = stream.tokens if stream is not None else []
        return np.asarray(tokens[int(self._prompt_lens[request_id]) :], np.int64)

    def run(self, step: ScheduledStep, plan: ExecutionPlan) -> LiveOutcome:
        """Run ``step`` (compiled as ``plan``) on the engine; verify drafts, emit tokens."""
        inputs, drafts = self._inputs(step)
        ids = np.fromiter((t for row in inputs for t in row), np.int64, plan.num_tokens)
        samples = self._samples(step.batch, step.emits_first)
        start = time.perf_counter()
        self.runner.warm_up([plan])  # a new bucket's capture, before the step's time
        self.capture_s += time.perf_counter() - start
        compiled = self._compiled()
        greedy, timing = self.runner.timed_run(plan, ids, samples)
        cold = self._compiled() != compiled
        self.model_wall_s += timing.wall_s
        accepted = self._emit(step, drafts, greedy.tolist())
        return LiveOutcome(accepted, timing.wall_s, timing.gpu_s, cold)

    def _stream(self, request_id: int) -> Any:
        stream = self._streams.get(request_id)
        if stream is None:
            prompt = self.prompt(request_id).tolist()
            stream = self._streams[request_id] = self._index(prompt, self.settings.ngram_max)
        return stream

    def _inputs(self, step: ScheduledStep) -> tuple[list[list[int]], list[list[int] | None]]:
        """Each row's input ids and (spec rows) drafts, in the batch's row order."""
        batch = step.batch
        inputs: list[list[int]] = []
        drafts: list[list[int] | None] = []
        rows = zip(
            step.request_ids.tolist(),
            batch.query_lens.tolist(),
            batch.num_computed_tokens.tolist(),
            strict=True,
        )
        for row, (request_id, q, computed) in enumerate(rows):
            stream = self._stream(request_id)
            tokens = stream.tokens
            if not step.decoding[row]:
                inputs.append(tokens[computed : computed + q])
                drafts.append(None)
                continue
            if computed != len(tokens) - 1:
                raise RuntimeError(
                    f"live: request {request_id} decodes at position {computed}, "
                    f"but has {len(tokens)} tokens"
                )
            row_drafts = pad_drafts(stream.propose(q - 1), q - 1, tokens[-1])
            inputs.append([tokens[-1], *row_drafts])
            drafts.append(row_drafts if step.is_spec[row] else None)
        return inputs, drafts

    def _emit(
        self, step: ScheduledStep, drafts: list[list[int] | None], greedy: list[int]
    ) -> np.ndarray:
        """Append each row's emitted tokens; ``[R], int64`` accepted drafts per row.
        ``greedy`` holds the sampled tokens row by row, as :meth:`run` asked for them:
        ``q`` of a spec row, one of a decode-kind row (a one-token prefill chunk too),
        one of a prefill chunk that completes its prompt."""
        batch = step.batch
        kinds, query_lens = batch.kinds.tolist(), batch.query_lens.tolist()
        accepted = np.zeros(len(drafts), np.int64)
        start = 0
        for row, request_id in enumerate(step.request_ids.tolist()):
            stream, row_drafts = self._streams[request_id], drafts[row]
            if row_drafts is not None:
                out = greedy[start : start + query_lens[row]]
                start += query_lens[row]
                a = self._verify(row_drafts, out)
                stream.extend([*row_drafts[:a], out[a]])
                accepted[row] = a
                continue
            sampled = kinds[row] == DECODE or bool(step.emits_first[row])
            if sampled and (step.decoding[row] or step.emits_first[row]):
                stream.extend([greedy[start]])
            start += sampled
        return accepted

    def summary(self) -> dict[str, Any]:
        """The run's live facts for ``summary.json`` (``live_run``)."""
        runner = self.runner
        return {
            "backend": self.settings.engine_backend,
            "device": str(runner.device),
            "device_name": _device_name(runner),
            "model": self._model_name,
            "shape": _plain(attrs.asdict(runner.shape)),
            "dtype": runner.shape.dtype,
            "attention": runner.attention,
            "time": self.settings.time,
            "reproducible": not self.measured_time,
            "slots": runner.num_slots,
            "max_len": runner.max_len,
            "graphs_captured": len(runner.captured_graphs),
            "graph_capture_s": self.capture_s,
            "warm_start": {"steps": self.warm_start_steps, "seconds": self.warm_start_s},
            "model_wall_s": self.model_wall_s,
        }


def _plain(value: Any) -> Any:
    """Tuples as lists, for JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def _device_name(runner: HybridModelRunner) -> str:
    if runner.device.type != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(runner.device)
