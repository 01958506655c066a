"""``HybridModelRunner``: one step of the hybrid model per call, on the planner's plan.

The host plans the step (``Planner.compile``), builds the model's metadata with vectorized
numpy (:mod:`.metadata`), uploads it in one copy into a persistent device buffer
(``PinnedUpload``), then runs the forward eagerly or replays the CUDA graph of the plan's
bucket (``StepGraphs``: the plan's own upload is the graph's first node, then the whole
forward). A graph plan has its bucket's sizes either way, so eager and graphed steps of
one plan run the same shapes.

Under tensor parallelism one runner runs in each rank's process; each holds its shard of
the weights, KV cache and conv state (:mod:`.parallel`) and runs every step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import numpy as np
import torch

from stepplan.executor import Executor, StepGraphs
from stepplan.executor.graphs import paused_gc
from stepplan.executor.upload import PinnedUpload
from stepplan.planner import (
    ExecutionPlan,
    GraphKey,
    Planner,
    PlannerConfig,
    StepBatch,
    largest_graph_layout,
)

from . import metadata
from .attention import ATTENTION_BACKENDS
from .forward import ModelForward
from .kv_cache import KVCache, MemoryNeed, check_memory, device_free_bytes, kv_cache_bytes
from .metadata import LiveRows, StepHost, StepShape, StepTensors
from .parallel import process_group_shard
from .shape import ModelShape
from .weights import make_weights

_GIB = 2**30
_EAGER_TOKENS = 8192  # eager steps up to this many tokens upload through pinned memory


@attrs.frozen
class StepTiming:
    """One timed step.

    Attributes:
        wall_s: host wall time of the whole call, the stream synchronized at both ends.
        gpu_s: CUDA-event time from before the metadata upload to the end of the
            forward (``None`` off CUDA).
        host_s: host time until the step's GPU work was all launched.
    """

    wall_s: float
    gpu_s: float | None
    host_s: float


@attrs.frozen(eq=False)
class _Step:
    """One prepared step: its metadata on both sides and how it runs."""

    plan: ExecutionPlan
    meta: StepTensors
    host: StepHost
    replay: bool


class HybridModelRunner:
    """Runs a :class:`ModelShape`'s model one planned step at a time.

    Conv layers run through the :class:`Executor` (conv layer ``i`` in layer group
    ``i * num_groups // conv layers``); attention reads the KV cache at the slot of
    layer group 0.

    Args:
        shape: the model (dimensions and weight seed).
        planner: how steps are planned; its ``Q`` sizes the conv state.
        num_slots: slots per pool, slot 0 (NULL) included.
        max_len: KV-cache positions per slot (``<= shape.max_model_len``).
        num_groups: conv layer groups (rows of a batch's ``slots``).
        device: where the model runs.
        backend: the executor's, ``"triton"`` or ``"reference"``.
        use_graphs: replay a CUDA graph of the whole forward per bucket; default on for
            triton with flash attention on CUDA.
        attention: ``"flash"`` (CUDA, bf16/fp16) or ``"sdpa"`` (per-row reference);
            default flash on CUDA for a bf16/fp16 model, else sdpa.
        tensor_parallel: ranks the model is split over; above 1 each rank's process builds
            its runner inside an initialised ``torch.distributed`` process group of that
            many processes (NCCL on GPUs, gloo on the CPU) and runs the same plans with the
            same inputs; every rank returns the same greedy tokens.
    """

    def __init__(
        self,
        shape: ModelShape,
        planner: PlannerConfig,
        *,
        num_slots: int,
        max_len: int,
        num_groups: int = 1,
        device: torch.device | str = "cpu",
        backend: str = "reference",
        use_graphs: bool | None = None,
        attention: str | None = None,
        tensor_parallel: int = 1,
    ) -> None:
        self.shape, self.num_slots, self.max_len = shape, num_slots, max_len
        #: This process's rank among ``tensor_parallel`` and the dimensions it holds.
        self.shard = process_group_shard(shape, tensor_parallel)
        self.rank_shape = self.shard.rank_shape(shape)
        self.device = torch.device(device)
        on_cuda = self.device.type == "cuda"
        # FlashAttention needs half precision: a float32 model takes the reference on CUDA too.
        flash_ok = on_cuda and shape.dtype != "float32"
        self.attention = attention or ("flash" if flash_ok else "sdpa")
        if use_graphs is None:
            use_graphs = backend == "triton" and on_cuda and self.attention == "flash"
        self._check_arguments(planner, num_groups, backend, use_graphs)
        self.planner = Planner(planner)
        self._graph_capacity = self._largest_graph(planner, num_groups)
        check_memory(
            self.memory_need(planner, num_groups),
            device_free_bytes(self.device),
            num_slots=num_slots,
            max_len=max_len,
        )
        self._allocate_model(planner, num_groups, backend, use_graphs)
        self.forward = ModelForward(
            self.rank_shape,
            self.weights,
            self.executor,
            self.cache,
            self.attention,
            max_len,
            self.shard,
        )
        upload_bytes = max(self._graph_capacity.nbytes, _eager_capacity(planner).nbytes)
        self._upload = PinnedUpload(upload_bytes, self.device)
        self._views: dict[StepShape, StepTensors] = {}
        self._graph_shapes: dict[GraphKey, StepShape] = {}
        self._graphs = StepGraphs(self.executor, self._graph_forward) if use_graphs else None
        self._captured: set[GraphKey] = set()
        self._capturing: StepTensors | None = None
        self._greedy_out = torch.zeros(
            max(self._graph_capacity.num_samples, 1), dtype=torch.int64, device=self.device
        )
        self._events = (
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if on_cuda
            else None
        )

    def _allocate_model(
        self, planner: PlannerConfig, num_groups: int, backend: str, use_graphs: bool
    ) -> None:
        """This rank's weights, KV cache, conv state and the executor over it (memory checked
        already)."""
        shape = self.rank_shape
        self.weights = make_weights(self.shape, self.device, self.shard)
        self.cache = KVCache(
            num_layers=len(shape.attention_layers),
            num_slots=self.num_slots,
            max_len=self.max_len,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=shape.torch_dtype,
            device=self.device,
        )
        #: ``[conv layers, num_slots, W, C]``: every conv layer's state, one allocation.
        self.conv_state_memory = self._conv_state_memory(planner.query_len_max)
        #: Per conv layer the executor's ``[num_slots, C, W]`` view of it.
        self.conv_states = tuple(layer.permute(0, 2, 1) for layer in self.conv_state_memory)
        conv_layers = len(shape.conv_layers)
        self.executor = Executor(
            weights=[self.weights.layers[i].mixer.conv for i in shape.conv_layers],
            layer_groups=[i * num_groups // conv_layers for i in range(conv_layers)],
            conv_states=self.conv_states,
            dilation=shape.conv_dilation,
            config=planner,
            backend=backend,
            use_graphs=use_graphs,
        )

    def _check_arguments(
        self, planner: PlannerConfig, num_groups: int, backend: str, use_graphs: bool
    ) -> None:
        shape, on_cuda = self.shape, self.device.type == "cuda"
        if self.num_slots < 2:
            raise ValueError(f"num_slots: needs slot 0 (NULL) and one more, got {self.num_slots}")
        if not 1 <= self.max_len <= shape.max_model_len:
            raise ValueError(
                f"max_len: must be in 1..max_model_len = {shape.max_model_len}, got {self.max_len}"
            )
        if self.num_slots * self.max_len >= 2**31:
            raise ValueError(
                f"num_slots x max_len: {self.num_slots} x {self.max_len} KV entries exceed "
                "int32 offsets; lower num_slots or max_len"
            )
        if not 1 <= num_groups <= len(shape.conv_layers):
            raise ValueError(
                f"num_groups: must be in 1..{len(shape.conv_layers)} (the conv layers), "
                f"got {num_groups}"
            )
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention: must be one of {ATTENTION_BACKENDS}, got {self.attention!r}"
            )
        if self.attention == "flash":
            if not on_cuda or shape.dtype == "float32":
                raise ValueError(
                    f"attention: flash needs CUDA and bfloat16 or float16, got {shape.dtype} on "
                    f"{self.device}; use attention='sdpa'"
                )
            if shape.head_dim % 8 or shape.head_dim > 256:
                raise ValueError(
                    f"head_dim: flash attention needs a multiple of 8 up to 256, got "
                    f"{shape.head_dim}"
                )
        if use_graphs and not (backend == "triton" and on_cuda and self.attention == "flash"):
            raise ValueError("use_graphs: CUDA graphs need the triton backend and flash attention")

    def _largest_graph(self, planner: PlannerConfig, num_groups: int) -> StepShape:
        layout = largest_graph_layout(planner, num_groups)
        if layout is None:
            return StepShape(0, 0, 0, 0, 0)
        tokens, rows = layout.num_tokens, layout.num_rows
        samples = min(tokens, rows * planner.query_len_max)
        return StepShape(tokens, rows, samples, tokens, self.max_len)

    def memory_need(self, planner: PlannerConfig, num_groups: int) -> MemoryNeed:
        """Bytes this runner allocates (the workspace an estimate for the largest graph);
        one rank's under tensor parallelism."""
        shape, graph = self.rank_shape, self._largest_graph(planner, num_groups)
        tokens = max(graph.num_tokens, 1)
        per_token = 4 * shape.hidden_size + 3 * shape.conv_channels + 3 * shape.mlp_size
        activations = tokens * (per_token + shape.qkv_size) * shape.dtype_bytes
        logits = 2 * max(graph.num_samples, 1) * shape.vocab_size * shape.dtype_bytes
        staging = 2 * tokens * shape.conv_channels * shape.dtype_bytes  # the executor's
        kv = kv_cache_bytes(
            len(shape.attention_layers),
            self.num_slots,
            self.max_len,
            shape.num_kv_heads,
            shape.head_dim,
            shape.dtype_bytes,
        )
        return MemoryNeed(
            weights=shape.weight_bytes,
            kv_cache=kv,
            conv_state=self.num_slots * shape.conv_state_bytes_per_slot(planner.query_len_max),
            workspace=activations + logits + staging + _GIB,  # + allocator and library slack
        )

    def _conv_state_memory(self, query_len_max: int) -> torch.Tensor:
        """Zeroed conv state in vLLM's default ``[slot, W, C]`` memory layout (``C`` this
        rank's channels)."""
        shape = self.rank_shape
        return torch.zeros(
            len(shape.conv_layers),
            self.num_slots,
            shape.state_window(query_len_max),
            shape.conv_channels,
            dtype=shape.torch_dtype,
            device=self.device,
        )

    @property
    def num_groups(self) -> int:
        """Conv layer groups: rows of a batch's ``slots``."""
        return self.executor.num_groups

    @property
    def captured_graphs(self) -> tuple[GraphKey, ...]:
        """Graph keys whose forward has been captured so far."""
        return self._graphs.captured if self._graphs else ()

    def warm_up(self, plans: Sequence[ExecutionPlan]) -> None:
        """Capture the graphs of ``plans``' buckets now (no state changes; eager plans and
        captured buckets are skipped)."""
        if self._graphs is None:
            return
        with torch.no_grad():
            for plan in plans:
                if plan.graph is not None:
                    self._ensure_captured(plan, self._graph_shape(plan.graph))

    def greedy_tokens(
        self, batch: StepBatch, token_ids: np.ndarray, sample_index: np.ndarray
    ) -> np.ndarray:
        """Plan ``batch`` and run it: :meth:`run_plan` of ``self.planner.compile(batch)``."""
        # Every tensor-parallel rank compiles this plan itself, with no broadcast: the plan
        # is a pure function of a batch that every rank derives from the same tokens.
        return self.run_plan(self.planner.compile(batch), token_ids, sample_index)

    def run_plan(
        self, plan: ExecutionPlan, token_ids: np.ndarray, sample_index: np.ndarray
    ) -> np.ndarray:
        """One step: ``[S], int64`` greedy next token after each sampled token.

        Args:
            plan: the step, compiled by a planner of this runner's ``Q`` and groups.
            token_ids: ``[plan.num_tokens], int64`` input ids in the engine's token order.
            sample_index: ``[S], int64`` token indices whose next token is wanted
                (:func:`~.metadata.sample_positions`); a graph bucket computes at most
                ``min(tokens, rows * Q)``.
        """
        with torch.no_grad():
            return self._launch(plan, token_ids, sample_index).cpu().numpy()

    def timed_run(
        self, plan: ExecutionPlan, token_ids: np.ndarray, sample_index: np.ndarray
    ) -> tuple[np.ndarray, StepTiming]:
        """:meth:`run_plan`, timed: the stream synchronized before and after, so ``wall_s``
        holds the whole call and nothing queued before it; what profiles and live runs
        both call."""
        events = self._events
        if events is not None:
            # The stream, not the device: a device-wide synchronize costs the host more
            # with every CUDA graph instantiated (bench/results/history/, fidelity, 2026-12-03).
            torch.cuda.current_stream(self.device).synchronize()
        # A collection of the caller's objects is not the step's time: none runs inside.
        with paused_gc():
            return self._timed(plan, token_ids, sample_index)

    def _timed(
        self, plan: ExecutionPlan, token_ids: np.ndarray, sample_index: np.ndarray
    ) -> tuple[np.ndarray, StepTiming]:
        events = self._events
        start = time.perf_counter()
        with torch.no_grad():
            if events is not None:
                events[0].record()
            greedy = self._launch(plan, token_ids, sample_index)
            if events is not None:
                events[1].record()
            host_s = time.perf_counter() - start
            tokens = greedy.cpu().numpy()
        if events is not None:
            events[1].synchronize()
        wall_s = time.perf_counter() - start
        gpu_s = events[0].elapsed_time(events[1]) / 1e3 if events is not None else None
        return tokens, StepTiming(wall_s=wall_s, gpu_s=gpu_s, host_s=host_s)

    def logits(
        self, plan: ExecutionPlan, token_ids: np.ndarray, sample_index: np.ndarray
    ) -> torch.Tensor:
        """``[S, V]`` logits of the sampled tokens, the step run eagerly (graph plans with
        their bucket's sizes); advances the state like :meth:`run_plan`."""
        with torch.no_grad():
            step = self._prepare(plan, token_ids, sample_index, allow_replay=False)
            if step is None:
                return torch.zeros(0, self.shape.vocab_size, device=self.device)
            self.executor.prepare(plan)
            return self.forward.logits(step.meta, step.host)[: step.host.num_samples]

    def _launch(
        self, plan: ExecutionPlan, token_ids: np.ndarray, sample_index: np.ndarray
    ) -> torch.Tensor:
        """Upload and launch the step; ``[S], int64`` greedy tokens on the device."""
        step = self._prepare(plan, token_ids, sample_index, allow_replay=True)
        if step is None:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        samples = step.host.num_samples
        if step.replay:
            assert self._graphs is not None
            self._graphs.run(plan)
            return self._greedy_out[:samples]
        self.executor.prepare(plan)
        return self.forward.greedy(step.meta, step.host)[:samples]

    def _prepare(
        self,
        plan: ExecutionPlan,
        token_ids: np.ndarray,
        sample_index: np.ndarray,
        *,
        allow_replay: bool,
    ) -> _Step | None:
        """Check the inputs, capture the bucket if new, upload the metadata; ``None`` for a
        step without tokens (nothing to run)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        samples = np.asarray(sample_index, dtype=np.int64)
        rows, key = LiveRows.of(plan.batch), plan.graph
        if key is not None:
            shape = self._graph_shape(key)
        else:
            shape = metadata.eager_shape(rows, plan.num_tokens, samples.size)
        metadata.check_inputs(
            rows,
            plan.batch,
            ids,
            samples,
            vocab_size=self.shape.vocab_size,
            num_slots=self.num_slots,
            max_len=self.max_len,
            max_samples=None if key is None else shape.num_samples,
        )
        if plan.num_tokens == 0:
            return None
        replay = allow_replay and key is not None and self._graphs is not None
        if replay and shape.nbytes > self._upload.capacity_bytes:
            raise ValueError(
                f"plan: graph {key} is larger than this runner's graphs; compile plans with "
                "its planner config (runner.planner)"
            )
        if replay:
            self._ensure_captured(plan, shape)
        meta, host = self._upload_step(shape, rows, ids, samples)
        return _Step(plan, meta, host, replay)

    def _graph_shape(self, key: GraphKey) -> StepShape:
        shape = self._graph_shapes.get(key)
        if shape is None:
            q = self.planner.config.query_len_max
            shape = self._graph_shapes[key] = metadata.graph_shape(key, q, self.max_len)
        return shape

    def _upload_step(
        self, shape: StepShape, rows: LiveRows, ids: np.ndarray, samples: np.ndarray
    ) -> tuple[StepTensors, StepHost]:
        """Fill the metadata on the host and copy it to the device in one copy."""
        upload = self._upload
        if shape.nbytes > upload.capacity_bytes:  # a large eager step: a buffer of its own
            buffer = np.empty(shape.nbytes, np.uint8)
            host = metadata.fill(buffer, shape, rows, ids, samples, self.max_len)
            return metadata.device_views(torch.from_numpy(buffer).to(self.device), shape), host
        host = metadata.fill(upload.host_bytes(), shape, rows, ids, samples, self.max_len)
        upload.commit(shape.nbytes)
        return self._device_views(shape), host

    def _device_views(self, shape: StepShape) -> StepTensors:
        """Views of the persistent buffer, kept per shape (a captured graph holds their
        addresses, not these objects, so dropping them is safe)."""
        views = self._views.get(shape)
        if views is None:
            if len(self._views) >= 512:  # eager steps bring ever new shapes
                self._views.clear()
            views = self._views[shape] = metadata.device_views(self._upload.device_buffer, shape)
        return views

    def _ensure_captured(self, plan: ExecutionPlan, shape: StepShape) -> None:
        """Capture ``plan``'s bucket unless done: the metadata buffer first holds an inert
        step (all zeros: no token, row or sample touches a live slot), which the capture's
        warm-up pass runs."""
        assert self._graphs is not None and plan.graph is not None
        if plan.graph in self._captured:
            return
        self._upload.host_bytes()[: shape.nbytes] = 0
        self._upload.commit(shape.nbytes)
        self._capturing = self._device_views(shape)
        try:
            self._graphs.warm_up([plan])
        finally:
            self._capturing = None
        self._captured.add(plan.graph)

    def _graph_forward(self, num_tokens: int) -> None:
        """The forward StepGraphs captures: the bucket's metadata views, greedy tokens into
        the persistent output."""
        meta = self._capturing
        assert meta is not None and meta.shape.num_tokens == num_tokens
        greedy = self.forward.greedy(meta, None)
        self._greedy_out[: meta.shape.num_samples].copy_(greedy)


def _eager_capacity(planner: PlannerConfig) -> StepShape:
    """The metadata of an eager step of :data:`_EAGER_TOKENS` tokens in as many rows."""
    tokens = max(_EAGER_TOKENS, planner.max_num_seqs)
    return StepShape(tokens, tokens, tokens, 0, 0)
