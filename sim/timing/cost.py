"""Step time as named terms (:class:`StepCost`): a roofline of the model, the short-conv
kernels, host time and launch overhead -- or one measured engine's time.

``duration = model_s + conv_s + host_s + launch_s + engine_s + allreduce_s`` (the host
plans the step before the GPU runs it; vLLM v1 without async scheduling serializes the
two). Each term is a field of :class:`StepCost` and a ``<term>_s`` column of
``steps.csv``; a new term is a new field here and its meaning in ``schema.py``.

**engine_s** -- with ``cost.profile`` (an engine profile, :mod:`.engine_profile`), a step
the profile covers takes what its fit predicts for the profiled engine, and only that;
other steps keep the modelled terms.

**model_s** -- a roofline of everything but the short convolution:
``max(bytes / memory_bw, flops / peak_flops)`` with
``bytes = params * dtype_bytes`` (weights, read once per step)
``+ kv_bytes_per_token * (sum(num_computed + q) + num_tokens)`` (KV read and written;
activations ignored) and ``flops = 2 * params * graph_tokens`` (a CUDA graph computes
its padding too) ``+ 4 * hidden * attention_layers * sum(q * (num_computed + (q+1)/2))``.

With ``parallel.tensor = n`` (``parallel.py``) every term is one rank's: the roofline
reads that rank's weights and KV share and does ``1 / n`` of the FLOPs (its ``params``
share; attention's query heads split), and the short conv runs on ``C / n`` channels.

**allreduce_s** -- tensor parallelism's all-reduces: two per layer, each a ring over
the GPU's link (``gpu.link_bw_bytes_s`` per direction, ``gpu.link_latency_us`` per
step) of the padded batch's ``[graph_tokens, hidden]`` output; 0 on one rank.

**conv_s** -- the short conv of every conv layer, from a kernel profile table
(:class:`KernelProfile`): per batch kind, time is interpolated piecewise-linearly
in the bytes the kind moves (SPEC §4's floor: per token ``x`` read and residual read
and written, ``3 * C * dtype_bytes``; per decode/prefill row the window read and
written, ``2 * L * C * dtype_bytes``; per spec row ``L`` read and ``L + q - 1``
written), extrapolated along the last segment past the largest point and held at
the smallest time below it. A step with several kinds costs the table's ``mixed``
entry when it has one (a kernel that fuses kinds), else the sum over kinds (one
launch per kind, as the public kernel does).
A profile measured on another GPU than the simulated one (its ``device`` names
a preset of ``gpus.py``) has its times scaled by the two GPUs' bandwidth ratio.

**host_s** -- the short conv's metadata preparation for the step, by
``cost.host_cost``:

- ``model`` (default, deterministic): ``host_base_us + host_per_row_us * rows``, plus
  ``host_mixed_us`` when the step mixes kinds or has prefills. Defaults 8 µs,
  0.02 µs per row and 3.5 µs: a fit to ``bench/planner_bench.py``'s p50 (``StepBatch``
  validation + ``Planner.compile``, both compiled) over pure spec, pure decode and mixed
  steps. Layer groups add little and are not modelled. The H200 host's CPU runs the
  compiled planner as fast as the machine of the fit, so the defaults hold for the
  default GPU. Without the compiled packer (numpy packing) the planner is slower: set
  the three terms to the numpy fit. Both fits and their figures: ``bench/RESULTS.md``.
- ``measured``: the planner's measured time of this very step.
- ``seed``: the seed builder's SPEC §4 figures, 250 µs per layer group for a
  uniform (pure spec or pure decode) batch and 900 µs otherwise.

**launch_s** -- a graph replay costs ``graph_launch_us``; an eager step launches
``eager_launches_per_layer`` kernels per layer at ``kernel_launch_us`` each, and
only the part not hidden behind the GPU's work is charged:
``max(0, launches * kernel_launch_us - model_s - conv_s - allreduce_s)``.
"""

from __future__ import annotations

import bisect
import json
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import attrs
import numpy as np

from stepplan.planner import ExecutionPlan, PlanShape

from ..settings.config import CostConfig, GpuConfig, ModelConfig
from ..settings.config_values import read_text
from ..settings.gpus import profile_scale
from .engine_fit import step_shape
from .engine_profile import EngineProfile, read_engine_profile
from .parallel import ALLREDUCES_PER_LAYER, RankShare, ring_allreduce_s, split_model

KINDS = ("spec", "decode", "prefill", "mixed")
#: The seed builder's host time per step per layer group (SPEC §4): a uniform batch (pure
#: spec; pure decode is taken as uniform too), and any other batch.
SEED_UNIFORM_US = 250.0
SEED_MIXED_US = 900.0
_MEMO_SIZE = 4096  # plan shapes kept; all are let go when this many are kept


def seed_host_us(
    num_rows: np.ndarray | int, num_spec_rows: np.ndarray | int, num_decode_rows: np.ndarray | int
) -> np.ndarray:
    """The seed builder's host time per layer group of each step, in µs: the one rule
    that ``host_cost = "seed"`` charges and the host-time figure draws (through
    ``SimResult.seed_host_us``). Arguments: ``[S], int64`` each (or one step's ints)."""
    uniform = (num_rows == num_spec_rows) | (num_rows == num_decode_rows)
    return np.where(uniform, SEED_UNIFORM_US, SEED_MIXED_US)


class ProfileError(ValueError):
    """A kernel profile is malformed; the message names the file and entry."""


@attrs.frozen
class Curve:
    """Piecewise-linear time (µs) over bytes, from measured points (sorted by bytes)."""

    bytes: tuple[float, ...]
    us: tuple[float, ...]

    def __call__(self, nbytes: float) -> float:
        xs, ys = self.bytes, self.us
        if nbytes <= xs[0]:
            return ys[0]
        if len(xs) == 1:
            return ys[0] * nbytes / xs[0]
        index = min(bisect.bisect_left(xs, nbytes), len(xs) - 1)
        x0, x1, y0, y1 = xs[index - 1], xs[index], ys[index - 1], ys[index]
        return max(y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0), ys[0])


@attrs.frozen
class ConvGeometry:
    """The conv layer's shape, for the byte counts."""

    channels: int
    kernel_size: int
    dilation: int
    dtype_bytes: int

    @property
    def reach(self) -> int:
        """``L = (K - 1) * D``: history entries a token reads."""
        return (self.kernel_size - 1) * self.dilation

    def bytes(self, kind: str, rows: int, tokens: int) -> float:
        """Fewest bytes a ``spec``, ``decode`` or ``prefill`` batch of ``rows`` rows and
        ``tokens`` tokens moves (a spec row writes ``L + q - 1`` window entries)."""
        if kind == "spec":
            state_entries = (2 * self.reach - 1) * rows + tokens
        else:
            state_entries = 2 * self.reach * rows
        return float(self.channels * self.dtype_bytes * (3 * tokens + state_entries))


@attrs.frozen
class KernelProfile:
    """Measured short-conv times per batch kind (one conv layer, one step).

    JSON layout (written by the kernel benchmark; ``bytes`` optional, computed from
    ``geometry`` when absent)::

        {"source": "...", "device": "...", "kernel": "...",  # free text
         "geometry": {"channels": 8192, "kernel_size": 4, "dilation": 3,
                      "dtype_bytes": 2},
         "entries": [{"kind": "spec", "rows": 64, "tokens": 256, "us": 21.1}, ...]}

    ``kind`` is ``spec``, ``decode``, ``prefill`` or ``mixed`` (a whole mixed step in
    one kernel; such entries give ``bytes``). ``decode`` and ``prefill`` are required;
    without ``spec`` entries spec batches use the ``decode`` curve.
    """

    source: str
    geometry: ConvGeometry
    curves: dict[str, Curve]
    device: str = ""  # the GPU it was measured on (the JSON's "device")

    def time_us(self, rows: tuple[int, int, int], tokens: tuple[int, int, int]) -> float:
        """Conv µs of one layer for (spec, decode, prefill) rows and tokens, with this
        profile's geometry."""
        present = [k for k in range(3) if rows[k]]
        if not present:
            return 0.0
        names = KINDS[:3]
        per_kind = [self.geometry.bytes(names[k], rows[k], tokens[k]) for k in present]
        if len(present) > 1 and "mixed" in self.curves:
            return self.curves["mixed"](sum(per_kind))
        return sum(self._curve(names[k])(b) for k, b in zip(present, per_kind, strict=True))

    def _curve(self, kind: str) -> Curve:
        if kind in self.curves:
            return self.curves[kind]
        return self.curves["decode" if kind == "spec" else "prefill"]

    def rescaled(self, geometry: ConvGeometry) -> KernelProfile:
        """The profile applied to another geometry: same curves over bytes."""
        return attrs.evolve(self, geometry=geometry)


def _entry_points(path: str, document: object) -> tuple[ConvGeometry, dict[str, list]]:
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise ProfileError(f"{path}: must be a JSON object with 'geometry' and an 'entries' list")
    names = [field.name for field in attrs.fields(ConvGeometry)]
    values = document.get("geometry")
    if not isinstance(values, dict) or not all(
        type(values.get(name)) is int and values[name] > 0 for name in names
    ):
        raise ProfileError(f"{path}: geometry: needs positive integers {', '.join(names)}")
    geometry = ConvGeometry(**{name: values[name] for name in names})
    entries = document["entries"]
    points: dict[str, list] = {}
    for index, entry in enumerate(entries):
        try:
            kind, us = entry["kind"], float(entry["us"])
            if "bytes" in entry or kind == "mixed":  # a mixed entry must give its bytes
                nbytes = float(entry["bytes"])
            else:
                nbytes = geometry.bytes(kind, int(entry["rows"]), int(entry["tokens"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{path}: entries[{index}]: bad entry ({exc})") from None
        if kind not in KINDS or us <= 0 or nbytes <= 0:
            raise ProfileError(f"{path}: entries[{index}]: kind in {KINDS}, positive us")
        points.setdefault(kind, []).append((float(nbytes), us))
    if "decode" not in points or "prefill" not in points:
        raise ProfileError(f"{path}: needs at least decode and prefill entries")
    return geometry, points


#: Profiles shipped with the package, by name: stepplan's kernels as measured on an
#: H200 by ``bench/kernel_bench.py`` (the default), and SPEC §4's public kernel.
PACKAGED_PROFILES = {"stepplan": "kernel_profile.json", "public": "kernel_profile_public.json"}


def load_profile(path: str | Path | None = None) -> KernelProfile:
    """Read a kernel profile JSON: a path, a name of :data:`PACKAGED_PROFILES`, or
    ``None`` for the packaged default (stepplan's kernels)."""
    name = "stepplan" if path is None else str(path)
    if name in PACKAGED_PROFILES:
        file = PACKAGED_PROFILES[name]
        text = resources.files("stepplan.sim").joinpath("data", file).read_text()
        path = f"stepplan/sim/data/{file}"
    else:
        text = read_text(path, ProfileError)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    geometry, points = _entry_points(str(path), document)
    curves = {}
    for kind, pairs in points.items():
        pairs.sort()
        curves[kind] = Curve(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
    device = str(document.get("device", ""))
    return KernelProfile(str(document.get("source", path)), geometry, curves, device)


@attrs.frozen
class StepLoad:
    """What the step asks of the model beyond the plan's counts.

    Attributes:
        kv_tokens: ``sum(num_computed + q)`` over rows: KV entries attention reads.
        attention_pairs: ``sum(q * (num_computed + (q + 1) / 2))``: query-key pairs.
    """

    kv_tokens: int
    attention_pairs: float


@attrs.frozen
class StepCost:
    """One step's time, by term (seconds; see the module docstring)."""

    model: float = 0.0
    conv: float = 0.0
    host: float = 0.0
    launch: float = 0.0
    engine: float = 0.0
    allreduce: float = 0.0

    @property
    def total(self) -> float:
        """The step's duration: every term added, in field order."""
        return sum(attrs.astuple(self))

    def terms(self) -> tuple[float, ...]:
        """The terms in field order (:data:`COST_TERMS`)."""
        return attrs.astuple(self)


class PlanTerms(NamedTuple):
    """What a step's time reads of its plan alone (:meth:`CostModel.plan_terms`): its
    live and padded tokens, the terms the plan decides, and ``host_s`` and ``launch_s``
    where they read nothing else (``None``: the measured planner time, or the GPU's busy
    time that hides an eager step's launches, decides them per step)."""

    num_tokens: int
    padded_tokens: int
    conv_s: float
    allreduce_s: float
    host_s: float | None
    launch_s: float | None


#: What the cost model reads of a step: its compiled plan, or the plan's shape alone (the
#: same counts, without the arrays: what the simulation loop compiles when nothing reads them).
PlanCounts = ExecutionPlan | PlanShape

#: The cost terms, in :class:`StepCost` field order; ``steps.csv`` has a ``<term>_s`` each.
COST_TERMS: tuple[str, ...] = tuple(field.name for field in attrs.fields(StepCost))


@attrs.frozen
class CostModel:
    """Turns a compiled plan into the four time terms of the step."""

    model: ModelConfig
    gpu: GpuConfig
    cost: CostConfig
    profile: KernelProfile
    num_groups: int = 1
    conv_scale: float = 1.0  # profile times -> the simulated GPU's (bandwidth ratio)
    engine: EngineProfile | None = None
    # one tensor-parallel rank's part of the model (by default the whole model, one rank)
    share: RankShare = attrs.field(
        default=attrs.Factory(lambda self: split_model(self.model, 1), takes_self=True)
    )
    # plan_terms by the plan's counts: a run repeats a few thousand shapes, and the
    # profile's interpolation is the dear part
    _plan_memo: dict[tuple[int, ...], PlanTerms] = attrs.field(
        factory=dict, init=False, eq=False, repr=False
    )
    # the roofline's factors, multiplied once (in the order its formula multiplies them)
    _two_params: float = attrs.field(init=False, eq=False, repr=False)
    _pair_flops: float = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        m = self.model
        object.__setattr__(self, "_two_params", 2.0 * self.share.params)
        object.__setattr__(self, "_pair_flops", 4.0 * m.hidden_size * (m.layers - m.conv_layers))

    @classmethod
    def create(
        cls,
        model: ModelConfig,
        gpu: GpuConfig,
        cost: CostConfig,
        num_groups: int = 1,
        tensor: int = 1,
    ) -> CostModel:
        """The cost model with the profile ``cost.kernel_profile`` names, applied to
        ``model``'s conv geometry (one of ``tensor`` ranks' channels) and, when it was
        measured on another GPU than ``gpu`` (resolved to its figures), scaled by their
        memory-bandwidth ratio."""
        gpu, model = gpu.resolved(), model.resolved()
        share = split_model(model, tensor)
        geometry = ConvGeometry(
            share.conv_channels,
            model.conv_kernel_size,  # type: ignore[arg-type]
            model.conv_dilation,  # type: ignore[arg-type]
            model.dtype_bytes,  # type: ignore[arg-type]
        )
        profile = load_profile(cost.kernel_profile).rescaled(geometry)
        scale = profile_scale(profile.device, gpu.memory_bw_bytes_s)  # type: ignore[arg-type]
        engine = None if cost.profile is None else read_engine_profile(cost.profile)
        return cls(model, gpu, cost, profile, num_groups, scale, engine, share)

    def model_s(self, plan: PlanCounts, load: StepLoad) -> float:
        """Roofline time of the model's non-conv work for the step."""
        return self._roofline(
            plan.num_tokens, plan.padded_tokens, load.kv_tokens, load.attention_pairs
        )

    def _roofline(
        self, tokens: int, padded_tokens: int, kv_tokens: int, attention_pairs: float
    ) -> float:
        share = self.share
        memory = share.weights_bytes + share.kv_bytes_per_token * (kv_tokens + tokens)
        flops = self._two_params * padded_tokens  # 2 * params FLOPs per (padded) token
        # attention: 4 * hidden * attention layers per query-key pair; query heads split
        # over the ranks (a copied KV head adds no query-key pairs)
        flops += self._pair_flops * attention_pairs / share.ranks
        return max(memory / self.gpu.memory_bw_bytes_s, flops / self.gpu.peak_flops)

    def allreduce_s(self, plan: PlanCounts) -> float:
        """The step's tensor-parallel all-reduces: two per layer of the padded batch's
        ``[padded_tokens, hidden]`` output, each a ring over the GPU's link; 0 on one rank."""
        ranks = self.share.ranks
        if ranks == 1:
            return 0.0
        m, gpu = self.model, self.gpu
        message = plan.padded_tokens * m.hidden_size * m.dtype_bytes
        one = ring_allreduce_s(message, ranks, gpu.link_bw_bytes_s, gpu.link_latency_us)
        return ALLREDUCES_PER_LAYER * m.layers * one

    def conv_s(self, plan: PlanCounts) -> float:
        """Short-conv time of every conv layer."""
        rows = (plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows)
        tokens = (plan.num_spec_decode_tokens, plan.num_decode_tokens, plan.num_prefill_tokens)
        return self.profile.time_us(rows, tokens) * self.model.conv_layers * 1e-6 * self.conv_scale

    def host_s(self, plan: PlanCounts, plan_us: float) -> float:
        """Host time of the step's conv metadata under ``cost.host_cost``."""
        cost = self.cost
        if cost.host_cost == "measured":
            return plan_us * 1e-6
        if cost.host_cost == "seed":
            rows = (plan.num_rows, plan.num_spec_rows, plan.num_decode_rows)
            return float(seed_host_us(*rows)) * self.num_groups * 1e-6
        uniform = plan.num_rows in (plan.num_spec_rows, plan.num_decode_rows)
        mixed_us = 0.0 if uniform else cost.host_mixed_us
        return (cost.host_base_us + cost.host_per_row_us * plan.num_rows + mixed_us) * 1e-6

    def launch_s(self, plan: PlanCounts, busy_s: float) -> float:
        """Launch overhead not hidden behind ``busy_s`` of GPU work."""
        if plan.graph is not None:
            return self.gpu.graph_launch_us * 1e-6
        launches = self.model.layers * self.gpu.eager_launches_per_layer
        return max(0.0, launches * self.gpu.kernel_launch_us * 1e-6 - busy_s)

    def step(self, plan: PlanCounts, load: StepLoad, plan_us: float) -> StepCost:
        """The step's :class:`StepCost`: the engine profile's prediction where it covers
        the step, else the four modelled terms."""
        return StepCost(*self.terms(plan, load.kv_tokens, load.attention_pairs, plan_us))

    def terms(
        self, plan: PlanCounts, kv_tokens: int, attention_pairs: float, plan_us: float
    ) -> tuple[float, float, float, float, float, float]:
        """:meth:`step`'s terms in :data:`COST_TERMS` order, for the simulation loop (one
        call, no :class:`StepLoad` or :class:`StepCost` to build)."""
        if self.engine is not None:
            predicted_us = self.engine.fit.predict_us(step_shape(plan))
            if predicted_us is not None:
                return 0.0, 0.0, 0.0, 0.0, predicted_us * 1e-6, 0.0
        return self.step_terms(self.plan_terms(plan), plan, kv_tokens, attention_pairs, plan_us)

    def plan_terms(self, plan: PlanCounts) -> PlanTerms:
        """What the step's time reads of ``plan`` alone (:class:`PlanTerms`), kept by its
        counts."""
        key = (
            plan.num_spec_rows,
            plan.num_decode_rows,
            plan.num_prefill_rows,
            plan.num_spec_decode_tokens,
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            plan.padded_tokens,
            plan.graph is None,
        )
        fixed = self._plan_memo.get(key)
        if fixed is None:
            if len(self._plan_memo) >= _MEMO_SIZE:
                self._plan_memo.clear()
            measured = self.cost.host_cost == "measured"
            fixed = self._plan_memo[key] = PlanTerms(
                plan.num_tokens,
                plan.padded_tokens,
                self.conv_s(plan),
                self.allreduce_s(plan),
                None if measured else self.host_s(plan, 0.0),
                None if plan.graph is None else self.launch_s(plan, 0.0),
            )
        return fixed

    def step_terms(
        self,
        fixed: PlanTerms,
        plan: PlanCounts,
        kv_tokens: int,
        attention_pairs: float,
        plan_us: float,
    ) -> tuple[float, float, float, float, float, float]:
        """:meth:`terms` without an engine profile, from ``fixed``
        (``plan_terms(plan)``, which a caller may keep)."""
        tokens, padded, conv_s, allreduce_s, host_s, launch_s = fixed
        model_s = self._roofline(tokens, padded, kv_tokens, attention_pairs)
        if host_s is None:
            host_s = self.host_s(plan, plan_us)
        busy_s = model_s + conv_s + allreduce_s
        if launch_s is None:
            launch_s = self.launch_s(plan, busy_s)
        return model_s, conv_s, host_s, launch_s, 0.0, allreduce_s
