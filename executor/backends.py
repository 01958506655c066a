"""How an :class:`~stepplan.executor.Executor` runs a layer's conv: one class per backend.

A backend owns what differs between running on the Triton kernels and on the PyTorch
reference: the form it keeps the weights in, what :meth:`Backend.prepare` holds for the
step's convs (a launch shape and a device plan buffer, or just the plan), the conv
itself, and whether CUDA graphs may capture it. The executor keeps the geometry checks,
the staging buffers and the graphs, which are the same for every backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import attrs
import torch

from stepplan.planner import ExecutionPlan, PlanLayout

from . import reference
from .upload import PinnedUpload


def import_kernels() -> Any:
    """The Triton kernels package, imported on use: the reference backend runs where
    Triton can't."""
    from . import kernels

    return kernels


@attrs.frozen
class Prepared:
    """The plan the next :meth:`Backend.conv` calls run."""

    plan: ExecutionPlan | None  # None when the buffer is filled at replay (graph capture)
    launch: Any  # kernels.LaunchShape, or None on the reference backend
    buffer: torch.Tensor | None  # [layout.size] int32 on the device
    # Rows beside tiles on the executor's side stream (kernels.launch_short_conv): free in a
    # replayed graph, four stream calls per layer on the host when eager, so graphs only.
    side_stream: torch.cuda.Stream | None = None


class Backend(Protocol):
    """What the executor asks of a backend (:class:`TritonBackend`, :class:`ReferenceBackend`).

    Attributes:
        name: the name ``Executor(backend=...)`` takes, one of :data:`BACKENDS`.
        weights: one ``[C, K]`` tensor per layer, in the form the backend's conv reads.
        upload: the persistent device plan buffer's upload, ``None`` where the backend
            reads the plan on the host.
    """

    name: str
    weights: tuple[torch.Tensor, ...]
    upload: PinnedUpload | None

    def graphs_on(self, device: torch.device) -> bool:
        """Whether CUDA graphs can capture this backend's convs on ``device``."""
        ...

    def prepare(self, plan: ExecutionPlan) -> Prepared:
        """What the next convs of ``plan`` need: at most one host→device copy."""
        ...

    def prepare_graphed(
        self, plan: ExecutionPlan, buffer: torch.Tensor, side_stream: torch.cuda.Stream | None
    ) -> Prepared:
        """Convs of ``plan``'s launch shape that read their plan from ``buffer`` at run time."""
        ...

    def conv(
        self,
        prepared: Prepared,
        layer: int,
        x: torch.Tensor,
        residual: torch.Tensor,
        state: torch.Tensor,
        *,
        dilation: int,
        group: int,
    ) -> None:
        """Layer ``layer``'s conv over ``prepared``: ``residual += y``, ``state`` updated.

        ``x`` and ``residual`` are ``[engine_tokens, C]``; ``state`` ``[num_slots, C, W]``.
        """
        ...


class TritonBackend:
    """The Triton kernels: the plan read from a persistent device buffer, graph-capturable.

    Keeps a channel-contiguous copy of each weight (``[K, C]`` memory) where it is not
    channel-contiguous already, so the taps load as vectors like the activations, and
    the block sizes of each layer, which depend only on C, its state's memory layout and
    the kernel variant.

    Args:
        weights: one ``[C, K]`` tensor per layer.
        conv_states: one ``[num_slots, C, W]`` view per layer.
        device: where the plan buffer lives.
        capacity: the largest plan layout uploaded into the persistent buffer.
        variant: one of ``kernels.VARIANTS``; ``None``: ``kernels.DEFAULT_VARIANT``.
    """

    name = "triton"

    def __init__(
        self,
        weights: Sequence[torch.Tensor],
        conv_states: Sequence[torch.Tensor],
        device: torch.device,
        capacity: PlanLayout,
        variant: str | None = None,
    ) -> None:
        self._kernels = import_kernels()
        variant = variant or self._kernels.DEFAULT_VARIANT
        self._kernels.check_variant(variant)
        self.weights = tuple(w if w.stride(0) == 1 else w.t().contiguous().t() for w in weights)
        channels = int(self.weights[0].shape[0])
        self._blocks = tuple(
            self._kernels.default_blocks(channels, state.stride(2) == 1, variant)
            for state in conv_states
        )
        self._device = device
        # One int32 more than the largest plan: the ticket word of a graph's upload.
        self.upload: PinnedUpload | None = PinnedUpload(4 * (capacity.size + 1), device)

    def graphs_on(self, device: torch.device) -> bool:
        """CUDA graphs capture the kernels on a CUDA device."""
        return device.type == "cuda"

    def prepare(self, plan: ExecutionPlan) -> Prepared:
        """The plan's launch shape and its packed buffer on the device, in one copy.

        Plans larger than the largest graph (eager only) go through one plain copy
        into a fresh device buffer instead of the persistent one.
        """
        assert self.upload is not None
        launch = self._kernels.launch_shape(plan)
        if plan.packed.size * 4 <= self.upload.capacity_bytes:
            buffer = self.upload.upload_int32(plan.packed)
        else:
            buffer = torch.from_numpy(plan.packed.copy()).to(self._device)
        return Prepared(plan, launch, buffer)

    def prepare_graphed(
        self, plan: ExecutionPlan, buffer: torch.Tensor, side_stream: torch.cuda.Stream | None
    ) -> Prepared:
        """``plan``'s launch shape over ``buffer``, whatever it holds when the convs run."""
        return Prepared(None, self._kernels.launch_shape(plan), buffer, side_stream)

    def conv(
        self,
        prepared: Prepared,
        layer: int,
        x: torch.Tensor,
        residual: torch.Tensor,
        state: torch.Tensor,
        *,
        dilation: int,
        group: int,
    ) -> None:
        """:func:`~stepplan.executor.kernels.launch_short_conv` with the layer's blocks."""
        self._kernels.launch_short_conv(
            prepared.launch,
            prepared.buffer,
            x,
            residual,
            state,
            self.weights[layer],
            dilation=dilation,
            group=group,
            blocks=self._blocks[layer],
            side_stream=prepared.side_stream,
        )


class ReferenceBackend:
    """The PyTorch reference (:mod:`stepplan.executor.reference`): any device, never graphed,
    the plan read on the host.

    Takes the arguments of :class:`TritonBackend`; keeps the weights as they are and
    needs nothing else (it has no kernel variants).
    """

    name = "reference"

    def __init__(
        self,
        weights: Sequence[torch.Tensor],
        conv_states: Sequence[torch.Tensor],
        device: torch.device,
        capacity: PlanLayout,
        variant: str | None = None,
    ) -> None:
        del conv_states, device, capacity, variant
        self.weights = tuple(weights)
        self.upload: PinnedUpload | None = None

    def graphs_on(self, device: torch.device) -> bool:
        """Never: the reference reads the plan on the host."""
        del device
        return False

    def prepare(self, plan: ExecutionPlan) -> Prepared:
        """Just the plan: nothing goes to the device."""
        return Prepared(plan, None, None)

    def prepare_graphed(
        self, plan: ExecutionPlan, buffer: torch.Tensor, side_stream: torch.cuda.Stream | None
    ) -> Prepared:
        """Refused: the reference cannot read a plan from a device buffer."""
        raise RuntimeError("prepare_graphed(): the reference backend is never graphed")

    def conv(
        self,
        prepared: Prepared,
        layer: int,
        x: torch.Tensor,
        residual: torch.Tensor,
        state: torch.Tensor,
        *,
        dilation: int,
        group: int,
    ) -> None:
        """:func:`~stepplan.executor.reference.short_conv` on the prepared plan."""
        reference.short_conv(
            prepared.plan, x, residual, state, self.weights[layer], dilation=dilation, group=group
        )


_CLASSES: Mapping[str, type[TritonBackend] | type[ReferenceBackend]] = MappingProxyType(
    {backend.name: backend for backend in (TritonBackend, ReferenceBackend)}
)
#: The names ``Executor(backend=...)`` takes.
BACKENDS = tuple(_CLASSES)


def make_backend(
    name: str,
    weights: Sequence[torch.Tensor],
    conv_states: Sequence[torch.Tensor],
    device: torch.device,
    capacity: PlanLayout,
    variant: str | None = None,
) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`) for these layers, running
    kernel ``variant`` (the triton backend's; ``None``: its default)."""
    check_backend_name(name)
    return _CLASSES[name](weights, conv_states, device, capacity, variant)


def check_backend_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is one of :data:`BACKENDS`."""
    if name not in _CLASSES:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {name!r}")
