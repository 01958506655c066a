"""The executor: one plan upload per step, then every layer's conv, eagerly or by graph replay.

An :class:`Executor` is built once for a layer geometry and a planner config.
Per step it copies the plan's packed int32 buffer to the device once (pinned,
asynchronous) and runs the short conv of every layer, each on its own state
pool, at the slots of its layer group; a backend (:mod:`.backends`) runs the convs.
Plans that carry a graph key replay a CUDA graph captured for that key on first use
(:class:`~stepplan.executor.graphs.StepGraphs`), so a graph step costs the host a write
into pinned memory and one CUDA call, the launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from stepplan.planner import (
    ExecutionPlan,
    GraphKey,
    PlanLayout,
    PlannerConfig,
    largest_graph_layout,
)

from .backends import (
    BACKENDS,
    Backend,
    Prepared,
    check_backend_name,
    import_kernels,
    make_backend,
)
from .graphs import ReplaySignature, StepGraphs

__all__ = ["BACKENDS", "Executor"]


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
        kernel_variant: the triton backend's named block settings, one of
            ``kernels.VARIANTS`` (``None``: ``kernels.DEFAULT_VARIANT``); older ones stay
            for side-by-side runs (``bench/runtime_bench.py --variants``).
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
        kernel_variant: str | None = None,
    ) -> None:
        self.weights = tuple(weights)
        self.layer_groups = tuple(int(g) for g in layer_groups)
        self.conv_states = tuple(conv_states)
        self.dilation = int(dilation)
        self.config = config
        self.backend = backend
        self._check_geometry()
        #: Layer groups ``G``: plans must carry one slot row per group.
        self.num_groups = max(self.layer_groups) + 1
        self.device, self.dtype = self.weights[0].device, self.weights[0].dtype
        self.channels = int(self.weights[0].shape[0])
        self.capacity = largest_graph_layout(config, self.num_groups) or PlanLayout(
            1, 1, 0, self.num_groups
        )
        self._backend: Backend = make_backend(
            backend, self.weights, self.conv_states, self.device, self.capacity, kernel_variant
        )
        self.weights = self._backend.weights
        graphs_on = self._backend.graphs_on(self.device)
        if use_graphs is None:
            use_graphs = graphs_on
        if use_graphs and not graphs_on:
            raise ValueError("use_graphs: CUDA graphs need the triton backend on a CUDA device")
        self.use_graphs = use_graphs
        self._prepared: Prepared | None = None
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
        check_backend_name(self.backend)
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
            launch=import_kernels().launch_shape(plan),
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
        self._prepared = self._backend.prepare(plan)

    def graph_plan_buffer(self, plan: ExecutionPlan, with_ticket: bool = False) -> torch.Tensor:
        """``[layout.size], int32``: the persistent device buffer that graphs of ``plan``'s
        layout read their plan from; its address never changes. ``with_ticket``:
        ``[layout.size + 1]``, the word after the plan too, where a graph's upload puts
        the staging ring's ticket (:class:`StepGraphs`)."""
        self._check_plan(plan)
        upload = self._backend.upload
        if upload is None:
            raise RuntimeError("graph_plan_buffer(): the reference backend has no plan buffer")
        words = plan.packed.size + with_ticket
        if words * 4 > upload.capacity_bytes:
            raise ValueError(
                f"plan: graph {plan.graph} has layout {plan.layout}, larger than the persistent "
                f"buffer sized for {self.capacity}"
            )
        return upload.device_buffer[: words * 4].view(torch.int32)

    def prepare_graphed(self, plan: ExecutionPlan, buffer: torch.Tensor) -> None:
        """Make the next :meth:`conv` calls read a plan of ``plan``'s launch shape from
        ``buffer`` (:meth:`graph_plan_buffer`), whatever it holds when they run: for capture."""
        self._prepared = self._backend.prepare_graphed(plan, buffer, self._side_stream)

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
        self._backend.conv(
            prepared,
            layer,
            x,
            residual,
            self.conv_states[layer],
            dilation=self.dilation,
            group=self.layer_groups[layer],
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
