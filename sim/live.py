"""Live mode: a real toy model runs every step and decides what the spec rows accept.

The simulation loop (``run.py``) hands each step's :class:`ScheduledStep` and its
compiled plan to a :class:`LiveStepper`, which feeds them to
``stepplan.executor.engine.ToyModelRunner`` -- the executor's demo engine model,
the same planner config, the scheduler's slots (``1..slots``, the same index in
every layer group) -- and folds the greedy tokens back into each request:

- **Prompts.** A trace only has lengths, so request ``r`` gets ``prompt_tokens[r]``
  token ids drawn uniformly from the vocabulary, seeded by ``(run seed, r)``.
- **Inputs.** A prefill chunk feeds its prompt tokens ``[computed, computed + q)``;
  a decode feeds the request's last emitted token; a spec row feeds the last emitted
  token and its ``k = q - 1`` drafts.
- **Drafts.** The engine's prompt-lookup proposer (``propose_drafts``) over the
  request's prompt and output so far; when it finds fewer than ``k`` the rest repeat
  its last draft (or the last token), and are verified like any draft.
- **Verification.** ``a`` = the longest prefix of drafts equal to the model's greedy
  tokens before them; the row emits those drafts and the greedy token after the last
  accepted one (``a + 1`` tokens, as ``Scheduler.commit`` expects). Greedy decoding
  does not depend on the schedule (SPEC §2), so every request's output equals plain
  one-token-at-a-time greedy decoding of its prompt.

Time (``live.time``): ``model`` keeps the cost model's step time, so only acceptance
is live and a run is reproducible on a given backend; ``measured`` replaces the
model, short-conv and launch terms by the model run's wall time (CUDA synchronized
before and after), which varies from run to run. One-time work falls into the step
that first needs it: Triton compiling a kernel variant, and (triton on CUDA) the
capture of a graph bucket's CUDA graph (``live_run.graphs_captured`` counts them).

Only this module and the ``cli`` package touch ``stepplan.executor``, and only when a
stepper is created: a simulation without live mode never imports torch.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from stepplan.planner import ExecutionPlan, PlannerConfig

from .config import ConfigError, LiveConfig, SimConfig
from .scheduler import ScheduledStep

if TYPE_CHECKING:
    from stepplan.executor.engine import ToyModelRunner


@attrs.frozen(eq=False)
class LiveOutcome:
    """One live step's result.

    Attributes:
        accepted: ``[R], int64`` accepted drafts per row (0 off the spec rows).
        wall_s: measured wall time of the model run (device synchronized).
    """

    accepted: np.ndarray
    wall_s: float


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


def _resolved_groups(config: SimConfig) -> int:
    live, groups = config.live, config.scheduler.num_groups
    if live.num_groups is not None and live.num_groups != groups:
        raise ConfigError(
            f"live.num_groups: {live.num_groups} differs from scheduler.num_groups = {groups} "
            "(the toy model's layer groups are the scheduler's)"
        )
    if live.num_layers < groups:
        raise ConfigError(
            f"live.num_layers: {live.num_layers} layers cannot fill "
            f"scheduler.num_groups = {groups} layer groups"
        )
    return groups


def _check_device(live: LiveConfig) -> None:
    import torch

    if live.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("live.device: cuda asked for, but torch sees no CUDA device")
    if live.backend == "triton" and live.device == "cpu" and not os.environ.get("TRITON_INTERPRET"):
        raise ConfigError(
            "live.backend: triton on the CPU needs TRITON_INTERPRET=1 in the environment "
            "(interpreted, slow); use the reference backend or --live-device cuda"
        )


def check_live(config: SimConfig) -> None:
    """Refuse live settings that cannot run, before anything does (``ConfigError``)."""
    if config.live.enabled:
        _resolved_groups(config)
        _check_device(config.live)


def make_runner(config: SimConfig, planner: PlannerConfig) -> ToyModelRunner:
    """The toy model runner ``config.live`` describes, with a slot per scheduler slot."""
    import torch

    from stepplan.executor.engine import ToyModelConfig, ToyModelRunner

    live = config.live
    _check_device(live)
    model = ToyModelConfig(
        vocab_size=live.vocab_size,
        hidden_size=live.hidden_size,
        mlp_size=live.mlp_size,
        num_layers=live.num_layers,
        num_groups=_resolved_groups(config),
        kernel_size=live.kernel_size,
        dilation=live.dilation,
        seed=live.seed,
    )
    try:
        return ToyModelRunner(
            model,
            planner,
            num_slots=config.scheduler.slots + 1,  # slot 0 is NULL
            device=live.device,
            dtype=getattr(torch, live.dtype),
            backend=live.backend,
        )
    except ValueError as exc:
        raise ConfigError(f"live: {exc}") from None


class LiveStepper:
    """Runs the scheduler's steps on a toy model and keeps every request's tokens.

    Args:
        runner: the model; its planner config must be the one the loop compiles
            plans with, its groups the scheduler's, its slots cover ``1..slots``.
        prompt_tokens: ``[N], int64`` prompt length of every request.
        config: the simulation's settings (``live``, ``scheduler`` and ``seed``).
    """

    def __init__(
        self, runner: ToyModelRunner, prompt_tokens: np.ndarray, config: SimConfig
    ) -> None:
        from stepplan.executor.engine import accepted_prefix, propose_drafts

        scheduler = config.scheduler
        if runner.model.num_groups != scheduler.num_groups:
            raise ConfigError(
                f"live: the model has {runner.model.num_groups} layer groups, "
                f"scheduler.num_groups is {scheduler.num_groups}"
            )
        if runner.num_slots <= scheduler.slots:
            raise ConfigError(
                f"live: the model has {runner.num_slots} slots (0 is NULL), the scheduler "
                f"uses 1..{scheduler.slots}"
            )
        self.runner, self.settings = runner, config.live
        self._seed = config.seed
        self._prompt_lens = np.asarray(prompt_tokens, np.int64)
        self._tokens: dict[int, list[int]] = {}  # prompt then output, per started request
        self._propose = functools.partial(propose_drafts, ngram_max=config.live.ngram_max)
        self._verify = accepted_prefix
        self._sync = _synchronizer(runner)
        self.model_wall_s = 0.0

    @classmethod
    def create(
        cls, config: SimConfig, planner: PlannerConfig, prompt_tokens: np.ndarray
    ) -> LiveStepper:
        """A stepper over a fresh :func:`make_runner` model."""
        return cls(make_runner(config, planner), prompt_tokens, config)

    @property
    def measured_time(self) -> bool:
        """Whether the model run's wall time replaces the cost model's GPU terms."""
        return self.settings.time == "measured"

    def prompt(self, request_id: int) -> np.ndarray:
        """``[prompt_tokens], int64`` the request's prompt."""
        length = int(self._prompt_lens[request_id])
        return request_prompt(self._seed, request_id, length, self.runner.model.vocab_size)

    def output(self, request_id: int) -> np.ndarray:
        """``[emitted], int64`` the tokens the request has emitted so far."""
        tokens = self._tokens.get(request_id, [])
        return np.asarray(tokens[int(self._prompt_lens[request_id]) :], np.int64)

    def run(self, step: ScheduledStep, plan: ExecutionPlan) -> LiveOutcome:
        """Run ``step`` (compiled as ``plan``) on the model; verify drafts, emit tokens."""
        inputs, drafts = self._inputs(step)
        ids = np.fromiter((t for row in inputs for t in row), np.int64, plan.num_tokens)
        self._sync()
        start = time.perf_counter()
        greedy = self.runner.run_plan(plan, ids).tolist()
        self._sync()
        wall_s = time.perf_counter() - start
        self.model_wall_s += wall_s
        return LiveOutcome(self._emit(step, inputs, drafts, greedy), wall_s)

    def _stream(self, request_id: int) -> list[int]:
        tokens = self._tokens.get(request_id)
        if tokens is None:
            tokens = self._tokens[request_id] = self.prompt(request_id).tolist()
        return tokens

    def _inputs(self, step: ScheduledStep) -> tuple[list[list[int]], list[list[int] | None]]:
        """Each row's input ids and (spec rows) drafts, in the batch's row order."""
        batch = step.batch
        inputs: list[list[int]] = []
        drafts: list[list[int] | None] = []
        rows = zip(step.request_ids.tolist(), batch.query_lens.tolist(), strict=True)
        for row, (request_id, q) in enumerate(rows):
            tokens = self._stream(request_id)
            computed = int(batch.num_computed_tokens[row])
            if not step.decoding[row]:
                inputs.append(tokens[computed : computed + q])
                drafts.append(None)
                continue
            if computed != len(tokens) - 1:
                raise RuntimeError(
                    f"live: request {request_id} decodes at position {computed}, "
                    f"but has {len(tokens)} tokens"
                )
            row_drafts = pad_drafts(self._propose(tokens, q - 1), q - 1, tokens[-1])
            inputs.append([tokens[-1], *row_drafts])
            drafts.append(row_drafts if step.is_spec[row] else None)
        return inputs, drafts

    def _emit(
        self,
        step: ScheduledStep,
        inputs: list[list[int]],
        drafts: list[list[int] | None],
        greedy: list[int],
    ) -> np.ndarray:
        """Append each row's emitted tokens; ``[R], int64`` accepted drafts per row."""
        accepted = np.zeros(len(inputs), np.int64)
        start = 0
        for row, request_id in enumerate(step.request_ids.tolist()):
            out = greedy[start : start + len(inputs[row])]
            start += len(inputs[row])
            tokens, row_drafts = self._tokens[request_id], drafts[row]
            if row_drafts is not None:
                a = self._verify(row_drafts, out)
                tokens.extend([*row_drafts[:a], out[a]])
                accepted[row] = a
            elif step.decoding[row] or step.emits_first[row]:
                tokens.append(out[-1])
        return accepted

    def summary(self) -> dict[str, Any]:
        """The run's live facts for ``summary.json`` (``live_run``)."""
        return {
            "backend": self.settings.backend,
            "device": str(self.runner.device),
            "device_name": _device_name(self.runner),
            "dtype": self.settings.dtype,
            "time": self.settings.time,
            "reproducible": not self.measured_time,
            "model": attrs.asdict(self.runner.model),
            "slots": self.runner.num_slots,
            "graphs_captured": len(self.runner.captured_graphs),
            "model_wall_s": self.model_wall_s,
        }


def _synchronizer(runner: ToyModelRunner) -> Callable[[], None]:
    """Waits for the runner's device (a no-op off CUDA)."""
    if runner.device.type != "cuda":
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(runner.device)


def _device_name(runner: ToyModelRunner) -> str:
    if runner.device.type != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(runner.device)
