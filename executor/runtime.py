"""The executor: one plan upload per step, then every layer's conv, eagerly or by graph replay.

An :class:`Executor` is built once for a layer geometry and a planner config.
Per step it copies the plan's packed int32 buffer to the device once (pinned,
asynchronous) and runs the short conv of every layer, each on its own state
pool, at the slots of its layer group. Plans that carry a graph key replay a CUDA graph captured
for that key on first use (:class:`StepGraphs`); the graph's first node is a
kernel that pulls the plan from pinned memory and then writes a ticket back there,
which tells the host when that staging memory may be written again. So a graph
step costs the host a write into pinned memory and one CUDA call, the launch. Before a replay the
plan's :class:`ReplaySignature` must equal the captured one, so a plan never
replays a graph recorded for another shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from stepplan.planner import (
    ExecutionPlan,
    GraphKey,
    PlanLayout,
    PlannerConfig,
    largest_graph_layout,
)

from .upload import PinnedUpload, StagingRing

BACKENDS = ("triton", "reference")


class ReplayMismatchError(RuntimeError):
    """A plan's signature differs from the one its CUDA graph was captured with."""


@attrs.frozen
class ReplaySignature:
    """Everything a captured step depends on besides the plan buffer's contents."""

    graph: GraphKey | None
    layout: PlanLayout
    query_len_max: int
    tile_tokens: int
    launch: Any  # the kernels' LaunchShape: grids and constexprs baked into the graph
    dtype: torch.dtype
    channels: int
    backend: str

    def differences(self, other: ReplaySignature) -> list[str]:
        """``name: captured A, plan has B`` for every field that differs."""
        return [
            f"{field.name}: captured {getattr(self, field.name)}, plan has "
            f"{getattr(other, field.name)}"
            for field in attrs.fields(ReplaySignature)
            if getattr(self, field.name) != getattr(other, field.name)
        ]


def check_replay(captured: ReplaySignature, wanted: ReplaySignature) -> None:
    """Raise :class:`ReplayMismatchError` naming every field where ``wanted`` differs."""
    if captured != wanted:  # attrs compares field by field: some field differs
        raise ReplayMismatchError(
            f"the plan does not fit the CUDA graph captured for {captured.graph}: "
            + "; ".join(captured.differences(wanted))
        )


def _import_kernels() -> Any:
    """The Triton kernels module, imported on use: the reference backend runs where
    Triton can't."""
    from . import kernels

    return kernels


@attrs.frozen
class _Prepared:
    """The plan the next :meth:`Executor.conv` calls run."""

    plan: ExecutionPlan | None  # None when the buffer is filled at replay (graph capture)
    launch: Any  # kernels.LaunchShape, or None on the reference backend
    buffer: torch.Tensor | None  # [layout.size] int32 on the device
    # Rows beside tiles on the executor's side stream (kernels.launch_short_conv): free in a
    # replayed graph, four stream calls per layer on the host when eager, so graphs only.
    side_stream: torch.cuda.Stream | None = None


class Executor:
    """Runs the short conv of every layer of a model for one plan per step.

    Args:
        weights: one ``[C, K]`` tensor per layer, all of one dtype and device. The
            triton backend keeps a channel-contiguous copy (``[K, C]`` memory), made
            here once where they are not channel-contiguous already: its taps then load as
            vectors, like the activations; later in-place changes to the caller's
            tensors may not be seen.
        layer_groups: ``[num_layers]`` layer group of each layer; groups are
            numbered ``0..G-1`` and a layer reads the slots of its group.
        conv_states: one ``[num_slots, C, W]`` logical view (any strides) per
            layer, ``W >= (K - 1) * dilation + Q - 1``, the weights' dtype. Layers
            of a group share slot numbers, never state (as vLLM's layers of one
            KV-cache group share a block table).
        dilation: ``D``.
        config: the planner config plans are compiled with; it sizes the
            persistent buffers for the largest graph.
        backend: ``"triton"`` (the kernels, plan read from the device buffer)
            or ``"reference"`` (plain PyTorch, any device, never graphed).
        use_graphs: replay CUDA graphs for plans with a graph key; default:
            on for the triton backend on a CUDA device.
    """

    def __init__(
        self,
        *,
        weights: Sequence[torch.Tensor],
        layer_groups: Sequence[int],
        conv_states: Sequence[torch.Tensor],
        dilation: int,
        config: PlannerConfig,
        backend: str = "triton",
        use_graphs: bool | None = None,
    ) -> None:
        self.weights = tuple(weights)
        self.layer_groups = tuple(int(g) for g in layer_groups)
        self.conv_states = tuple(conv_states)
        self.dilation = int(dilation)
        self.config = config
        self.backend = backend
        self._check_geometry()
        if backend == "triton":
            self.weights = tuple(w if w.stride(0) == 1 else w.t().contiguous().t() for w in weights)
        #: Layer groups ``G``: plans must carry one slot row per group.
        self.num_groups = max(self.layer_groups) + 1
        self.device, self.dtype = self.weights[0].device, self.weights[0].dtype
        self.channels = int(self.weights[0].shape[0])
        on_cuda = self.device.type == "cuda"
        if use_graphs is None:
            use_graphs = backend == "triton" and on_cuda
        if use_graphs and not (backend == "triton" and on_cuda):
            raise ValueError("use_graphs: CUDA graphs need the triton backend on a CUDA device")
        self.use_graphs = use_graphs
        self._kernels: Any = None
        self._blocks: tuple[Any, ...] = ()  # kernels.Blocks per layer
        if backend == "triton":
            self._kernels = _import_kernels()
            # Chosen once, not per launch: they depend only on C and the state's memory layout.
            self._blocks = tuple(
                self._kernels.default_blocks(self.channels, state.stride(2) == 1)
                for state in self.conv_states
            )
        self.capacity = largest_graph_layout(config, self.num_groups) or PlanLayout(
            1, 1, 0, self.num_groups
        )
        # One int32 more than the largest plan: the ticket word of a graph's upload.
        self._upload = (
            PinnedUpload(4 * (self.capacity.size + 1), self.device) if backend == "triton" else None
        )
        self._prepared: _Prepared | None = None
        self._staging: tuple[torch.Tensor, torch.Tensor] | None = None
        self._side_stream = torch.cuda.Stream(self.device) if use_graphs else None
        self._staging_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # id(x view) -> (x view, residual view, tokens) for step's no-copy, no-check path
        self._staged_by_id: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._step_graphs: StepGraphs | None = None
        if use_graphs:
            shape = (self.capacity.num_tokens, self.channels)
            x = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self._staging = (x, torch.zeros_like(x))
            self._step_graphs = StepGraphs(self, self._run_staged)

    @property
    def num_layers(self) -> int:
        """Layers, one conv each per step."""
        return len(self.weights)

    @property
    def captured_graphs(self) -> tuple[GraphKey, ...]:
        """Graph keys :meth:`step` has captured so far."""
        return self._step_graphs.captured if self._step_graphs else ()

    def warm_up(self, plans: Sequence[ExecutionPlan]) -> None:
        """Capture :meth:`step`'s graphs for the keys of ``plans`` ahead of the first step."""
        if self._step_graphs is not None:
            self._step_graphs.warm_up(plans)

    def _check_geometry(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {BACKENDS}, got {self.backend!r}")
        if not self.weights:
            raise ValueError("weights: needs at least one layer")
        first = self.weights[0]
        if first.ndim != 2:
            raise ValueError(f"weights[0]: must be [C, K], got {list(first.shape)}")
        for layer, weight in enumerate(self.weights):
            if weight.shape != first.shape or weight.dtype != first.dtype:
                raise ValueError(
                    f"weights[{layer}]: must be {list(first.shape)} {first.dtype} like layer 0, "
                    f"got {list(weight.shape)} {weight.dtype}"
                )
            if weight.device != first.device:
                raise ValueError(f"weights[{layer}]: on {weight.device}, layer 0 on {first.device}")
        for name, values in (
            ("layer_groups", self.layer_groups),
            ("conv_states", self.conv_states),
        ):
            if len(values) != len(self.weights):
                raise ValueError(
                    f"{name}: has {len(values)} entries for {len(self.weights)} layers"
                )
        used = set(self.layer_groups)
        if used != set(range(len(used))):
            raise ValueError(f"layer_groups: must number groups 0..G-1, got {sorted(used)}")
        if self.dilation < 1:
            raise ValueError(f"dilation: must be positive, got {self.dilation}")
        for layer in range(len(self.conv_states)):
            self._check_state(layer, self.config.query_len_max)

    def _check_state(self, layer: int, query_len_max: int) -> None:
        state, weight = self.conv_states[layer], self.weights[0]
        channels, taps = weight.shape
        need = (taps - 1) * self.dilation + query_len_max - 1
        if state.ndim != 3 or state.shape[1] != channels or state.shape[2] < need:
            raise ValueError(
                f"conv_states[{layer}]: must be a [num_slots, C={channels}, W >= {need}] view "
                f"for Q = {query_len_max}, got {list(state.shape)}"
            )
        if state.dtype != weight.dtype or state.device != weight.device:
            raise ValueError(
                f"conv_states[{layer}]: must be {weight.dtype} on {weight.device} like the "
                f"weights, got {state.dtype} on {state.device}"
            )

    def signature(self, plan: ExecutionPlan) -> ReplaySignature:
        """What a CUDA graph of ``plan`` depends on (the triton backend only)."""
        return ReplaySignature(
            graph=plan.graph,
            layout=plan.layout,
            query_len_max=plan.query_len_max,
            tile_tokens=plan.tile_tokens,
            launch=(self._kernels or _import_kernels()).launch_shape(plan),
            dtype=self.dtype,
            channels=self.channels,
            backend=self.backend,
        )

    def prepare(self, plan: ExecutionPlan) -> None:
        """Make ``plan`` the one the next :meth:`conv` calls run: one host→device copy.

        Plans larger than the largest graph (eager only) go through one plain
        copy into a fresh device buffer instead of the persistent one.
        """
        self._check_plan(plan)
        if self.backend == "reference":
            self._prepared = _Prepared(plan, None, None)
            return
        assert self._upload is not None
        launch = self._kernels.launch_shape(plan)
        if plan.packed.size * 4 <= self._upload.capacity_bytes:
            buffer = self._upload.upload_int32(plan.packed)
        else:
            buffer = torch.from_numpy(plan.packed.copy()).to(self.device)
        self._prepared = _Prepared(plan, launch, buffer)

    def graph_plan_buffer(self, plan: ExecutionPlan, with_ticket: bool = False) -> torch.Tensor:
        """``[layout.size], int32``: the persistent device buffer that graphs of ``plan``'s
        layout read their plan from; its address never changes. ``with_ticket``:
        ``[layout.size + 1]``, the word after the plan too, where a graph's upload puts
        the staging ring's ticket (:class:`StepGraphs`)."""
        self._check_plan(plan)
        if self._upload is None:
            raise RuntimeError("graph_plan_buffer(): the reference backend has no plan buffer")
        words = plan.packed.size + with_ticket
        if words * 4 > self._upload.capacity_bytes:
            raise ValueError(
                f"plan: graph {plan.graph} has layout {plan.layout}, larger than the persistent "
                f"buffer sized for {self.capacity}"
            )
        return self._upload.device_buffer[: words * 4].view(torch.int32)

    def prepare_graphed(self, plan: ExecutionPlan, buffer: torch.Tensor) -> None:
        """Make the next :meth:`conv` calls read a plan of ``plan``'s launch shape from
        ``buffer`` (:meth:`graph_plan_buffer`), whatever it holds when they run: for capture."""
        self._prepared = _Prepared(
            None, self._kernels.launch_shape(plan), buffer, self._side_stream
        )

    def forget_prepared(self) -> None:
        """No plan is prepared: :meth:`conv` refuses to run until the next :meth:`prepare`.

        A graph replay overwrites the plan buffer, so a plan prepared before it is gone.
        """
        self._prepared = None

    def _check_plan(self, plan: ExecutionPlan) -> None:
        if plan.num_groups != self.num_groups:
            raise ValueError(
                f"plan: has {plan.num_groups} layer groups, the executor has {self.num_groups}"
            )
        if plan.query_len_max > self.config.query_len_max:  # the windows were checked for this Q
            for layer in range(self.num_layers):
                self._check_state(layer, plan.query_len_max)

    def conv(self, layer: int, x: torch.Tensor, residual: torch.Tensor) -> None:
        """Layer ``layer``'s conv over the prepared plan: ``residual += y``, its state updated.

        Args:
            x: ``[engine_tokens, C]`` in the engine's token order, the executor's dtype.
            residual: ``[engine_tokens, C]``, like ``x``.
        """
        prepared = self._prepared
        if prepared is None:
            raise RuntimeError("conv() before prepare(): no plan to run")
        group = self.layer_groups[layer]
        state, weight = self.conv_states[layer], self.weights[layer]
        if self.backend == "reference":
            from . import reference

            reference.short_conv(
                prepared.plan, x, residual, state, weight, dilation=self.dilation, group=group
            )
            return
        self._kernels.launch_short_conv(
            prepared.launch,
            prepared.buffer,
            x,
            residual,
            state,
            weight,
            dilation=self.dilation,
            group=group,
            blocks=self._blocks[layer],
            side_stream=prepared.side_stream,
        )

    def run_layers(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """Every layer's conv over the prepared plan, all on the same ``x`` and ``residual``."""
        for layer in range(self.num_layers):
            self.conv(layer, x, residual)

    def staging(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``[num_tokens, C]`` of the persistent ``x`` and ``residual`` graphs read.

        Passing these very views to :meth:`step` saves the copies in and out and the
        operand checks (the executor made them).
        """
        views = self._staging_views.get(num_tokens)
        if views is not None:
            return views
        if self._staging is None:
            raise RuntimeError("staging(): the executor runs without graphs")
        x, residual = self._staging
        if not 0 <= num_tokens <= x.shape[0]:
            raise ValueError(f"num_tokens: {num_tokens} is outside 0..{x.shape[0]}")
        if len(self._staging_views) >= 256:
            self._staging_views.clear()
            self._staged_by_id.clear()
        views = self._staging_views[num_tokens] = (x[:num_tokens], residual[:num_tokens])
        # Keyed by id: the cached views stay alive, so their ids are not reused meanwhile.
        self._staged_by_id[id(views[0])] = (*views, num_tokens)
        return views

    def step(self, plan: ExecutionPlan, x: torch.Tensor, residual: torch.Tensor) -> None:
        """One step: upload ``plan``, then every layer's conv on ``x`` into ``residual``.

        Replays the CUDA graph of ``plan.graph`` when graphs are on and the plan
        has one; else runs eagerly.

        Args:
            x: ``[engine_tokens >= plan tokens, C]``, the executor's dtype, engine token order.
            residual: ``[engine_tokens, C]``, like ``x``; every layer adds into it.
        """
        graphs = self._step_graphs
        if graphs is None or plan.graph is None:
            self._check_activations(plan, x, residual)
            self.prepare(plan)
            self.run_layers(x, residual)
            return
        staged = self._staged_by_id.get(id(x))
        if staged is not None and staged[1] is residual and staged[0] is x:
            if staged[2] < plan.num_tokens:
                self._check_activations(plan, x, residual)  # raises: too few rows
            graphs.run(plan)  # the graph reads exactly these buffers: nothing to copy
            return
        self._step_copied(graphs, plan, x, residual)

    def _step_copied(
        self, graphs: StepGraphs, plan: ExecutionPlan, x: torch.Tensor, residual: torch.Tensor
    ) -> None:
        """A graph step on the caller's own tensors: copied into the staging buffers and back."""
        self._check_activations(plan, x, residual)
        assert plan.graph is not None
        tokens = plan.num_tokens
        staged_x, staged_residual = self.staging(plan.graph.num_tokens)
        # Only live tokens are staged: the plan names no other row, so stale rows are inert.
        if x.data_ptr() != staged_x.data_ptr():
            staged_x[:tokens].copy_(x[:tokens])
        if residual.data_ptr() != staged_residual.data_ptr():
            staged_residual[:tokens].copy_(residual[:tokens])
        graphs.run(plan)
        if residual.data_ptr() != staged_residual.data_ptr():
            residual[:tokens].copy_(staged_residual[:tokens])

    def _run_staged(self, num_tokens: int) -> None:
        x, residual = self.staging(num_tokens)
        self.run_layers(x, residual)

    def _check_activations(self, plan: ExecutionPlan, x: torch.Tensor, r: torch.Tensor) -> None:
        tokens = plan.num_tokens
        for name, tensor in (("x", x), ("residual", r)):
            if tensor.dtype != self.dtype or tensor.device != self.device:
                raise ValueError(
                    f"{name}: must be {self.dtype} on {self.device}, "
                    f"got {tensor.dtype} on {tensor.device}"
                )
            if tensor.ndim != 2 or tensor.shape[1] != self.channels or tensor.shape[0] < tokens:
                raise ValueError(
                    f"{name}: must be [engine_tokens >= {tokens}, C={self.channels}], "
                    f"got {list(tensor.shape)}"
                )


@attrs.frozen
class _Captured:
    """The graphs of one key, one per staging-ring entry, and what a replay must match."""

    signature: ReplaySignature
    # A plan of this config and layout has this signature (see StepGraphs.entry): checked
    # with an identity and one attrs comparison instead of building its signature.
    config: PlannerConfig
    layout: PlanLayout
    graphs: tuple[Any, ...]  # torch.cuda.CUDAGraph per ring entry


class StepGraphs:
    """CUDA graphs of one forward function, one per graph key, captured on first use.

    ``forward(num_tokens)`` runs a whole step on persistent tensors, reading
    the plan only through ``executor.conv``; an engine passes its model's
    forward, :meth:`Executor.step` its layer loop. A key is captured once per
    entry of a :class:`StagingRing` (each graph pulls from its own entry), so
    the host can write step ``n + 1``'s plan while step ``n``'s graph is still
    queued. Each graph starts with one upload kernel
    (:func:`~stepplan.executor.staging_kernel.pull_plan`), then the forward. The
    kernel loads the entry's plan and ticket, ``[size + 1], int32``, from pinned
    memory into the executor's persistent plan buffer and the word right after
    it, and once every thread's load is over, stores the ticket into the entry's
    pinned ``done`` word. One kernel node, not two copy nodes: each copy node made a
    graph launch cost the host more than a kernel node does
    (``bench/graph_launch_bench.py``).

    So a replay is: claim an entry (a load from pinned memory), write plan and
    a fresh ticket into it, launch. Seeing the ticket in ``done`` proves the
    entry's only reader is done with it. The host thus never calls CUDA to learn
    when it may rewrite an entry.

    Before capture the forward runs once on an inert plan (padding only), after
    the same upload kernel, so every kernel is compiled outside the capture and
    no state changes.

    Replays go through :meth:`run` on one stream, the one eager steps use too:
    the executor's device plan buffer and ticket word (shared by every
    ``StepGraphs`` of the executor and by eager steps) are ordered by it, and
    :meth:`StagingRing.claim` synchronizes that stream when a ticket is late.

    Args:
        executor: runs the convs; built with graphs.
        forward: the step on persistent tensors, ``forward(num_tokens)``.
        ring_size: staging buffers (and graphs per key) used in turn.
    """

    def __init__(
        self, executor: Executor, forward: Callable[[int], None], ring_size: int = 2
    ) -> None:
        if not executor.use_graphs:
            raise ValueError("executor: built without graphs (use_graphs=False)")
        self._executor = executor
        self._forward = forward
        self._graphs: dict[GraphKey, _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self._ring = StagingRing(4 * executor.capacity.size, executor.device, ring_size)

    @property
    def captured(self) -> tuple[GraphKey, ...]:
        """Keys of the graphs captured so far."""
        return tuple(self._graphs)

    def warm_up(self, plans: Sequence[ExecutionPlan]) -> None:
        """Capture the graphs of ``plans``' keys now (eager plans and known keys are skipped).

        Capture runs nothing on the state: the plans only lend their shapes.
        """
        for plan in plans:
            if plan.graph is not None and plan.graph not in self._graphs:
                self._graphs[plan.graph] = self._capture(plan)

    def run(self, plan: ExecutionPlan) -> None:
        """Upload ``plan`` and replay its graph (captured now if new); needs ``plan.graph``.

        Nothing waits for the GPU unless the staging entry to write is still
        read by a replay queued two steps ago (a ring of two); the launch is the
        only CUDA call.
        """
        captured = self.entry(plan)
        index = self._ring.claim()
        self._ring.write(index, plan.packed)
        self._executor.forget_prepared()
        captured.graphs[index].replay()

    def entry(self, plan: ExecutionPlan) -> _Captured:
        """The captured graphs ``plan`` replays (captured now if new), its signature checked.

        Raises :class:`ReplayMismatchError` naming every field that differs.
        """
        key = plan.graph
        if key is None:
            raise ValueError("plan: has no graph key (an eager plan); run it eagerly")
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._graphs[key] = self._capture(plan)
        elif (plan.config is not captured.config and plan.config != captured.config) or (
            plan.layout is not captured.layout and plan.layout != captured.layout
        ):
            # The signature is a function of the key, the layout and the config's Q and
            # tile size (a graph plan's launch shape reads no live count; a CPU test pins
            # this): equal config and layout mean an equal signature. Anything else is
            # checked in full, which names every differing field.
            check_replay(captured.signature, self._executor.signature(plan))
        return captured

    def _capture(self, plan: ExecutionPlan) -> _Captured:
        assert plan.graph is not None
        executor, ring, tokens = self._executor, self._ring, plan.graph.num_tokens
        with_ticket = executor.graph_plan_buffer(plan, with_ticket=True)
        plan_buffer = with_ticket[:-1]
        ring.wait_all()  # queued replays may still read the entries the graphs pull from
        ring.write(0, plan.layout.inert_buffer())
        executor.prepare_graphed(plan, plan_buffer)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiles every kernel; the inert plan changes nothing
            self._upload_with_ticket(0, with_ticket)
            self._forward(tokens)
        torch.cuda.current_stream().wait_stream(side)
        side.synchronize()  # the warm-up's ticket is back: every entry is free
        graphs = []
        for index in range(ring.ring_size):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self._upload_with_ticket(index, with_ticket)
                self._forward(tokens)
            graphs.append(graph)
        executor.forget_prepared()
        return _Captured(executor.signature(plan), plan.config, plan.layout, tuple(graphs))

    def _upload_with_ticket(self, index: int, with_ticket: torch.Tensor) -> None:
        """Entry ``index``'s plan and ticket into ``with_ticket`` (``[size + 1], int32`` on
        the device), then the ticket back into the entry's ``done`` word: one kernel that
        reads and writes the pinned memory itself, the graph's first node."""
        from .staging_kernel import pull_plan  # Triton: CUDA graphs only

        size = with_ticket.numel() - 1
        pull_plan(self._ring.graph_source(index, size), with_ticket, self._ring.done_word(index))
