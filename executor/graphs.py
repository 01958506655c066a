"""CUDA graphs of a step, one per graph key, and the signature a replay must match.

:class:`StepGraphs` captures a forward function once per graph key (and staging-ring
entry) and replays it; the graph's first node is a kernel that pulls the plan from
pinned memory and then writes a ticket back there, which tells the host when that
staging memory may be written again. Before a replay the plan's
:class:`ReplaySignature` must equal the captured one, so a plan never replays a graph
recorded for another shape.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from stepplan.planner import ExecutionPlan, GraphKey, PlanLayout, PlannerConfig

from .upload import StagingRing

if TYPE_CHECKING:
    from .runtime import Executor


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


@attrs.frozen
class _Captured:
    """The graphs of one key, one per staging-ring entry, and what a replay must match."""

    signature: ReplaySignature
    # A plan of this config and layout has this signature (see StepGraphs.entry): checked
    # with an identity and one attrs comparison instead of building its signature.
    config: PlannerConfig
    layout: PlanLayout
    graphs: tuple[Any, ...]  # torch.cuda.CUDAGraph per ring entry


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection inside the block; the collector as it was after it (left
    off if the caller had it off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


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
        ring_size: staging buffers (and graphs per key).
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
        inert = plan.layout.inert_buffer()
        ring.write(0, inert)
        executor.prepare_graphed(plan, plan_buffer)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compiles every kernel; the inert plan changes nothing
            self._upload_with_ticket(0, with_ticket)
            self._forward(tokens)
        torch.cuda.current_stream().wait_stream(side)
        side.synchronize()  # the warm-up's ticket is back: every entry is free
        graphs = []
        # torch.cuda.graph collects garbage before it begins; a collection inside the
        # capture could free a dead engine's pinned memory, which invalidates the capture.
        with paused_gc():
            for index in range(ring.ring_size):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    self._upload_with_ticket(index, with_ticket)
                    self._forward(tokens)
                graphs.append(graph)
        # A graph's first launch costs the GPU more than its next ones: replay each once
        # on the inert plan now, so that no step pays for it.
        for index, graph in enumerate(graphs):
            ring.write(index, inert)
            graph.replay()
        ring.wait_all()
        executor.forget_prepared()
        return _Captured(executor.signature(plan), plan.config, plan.layout, tuple(graphs))

    def _upload_with_ticket(self, index: int, with_ticket: torch.Tensor) -> None:
        """Entry ``index``'s plan and ticket into ``with_ticket`` (``[size + 1], int32`` on
        the device), then the ticket back into the entry's ``done`` word: one kernel that
        reads and writes the pinned memory itself, the graph's first node."""
        from .staging_kernel import pull_plan  # Triton: CUDA graphs only

        size = with_ticket.numel() - 1
        pull_plan(self._ring.graph_source(index, size), with_ticket, self._ring.done_word(index))
