"""A build's host inputs: the engine's host tensors as the packer reads them, their
bytes, and the key of the step they make (:mod:`.step_share` keys steps and plans by it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stepplan.planner import host_ints

from .common_metadata import host_only_array

if TYPE_CHECKING:
    from .step_share import StepShare


class HostViews:
    """``query_start_loc_cpu`` and ``num_decode_draft_tokens_cpu`` as the packer reads
    them, keeping the last host tensor of each and its view (the further groups of a step
    pass the first group's tensors).

    Args:
        native: the packer is compiled, so it takes :func:`~stepplan.planner.host_ints`
            tuples.
    """

    def __init__(self, native: bool) -> None:
        self._native = native
        # The last host tensors seen and their views (same memory), query starts then
        # drafts.
        self._last: tuple = (None, None, None, None)

    def view(self, starts: Any, drafts: Any) -> tuple[Any, Any]:
        """Both views (``drafts`` ``None``: none): a 1-D int32 contiguous CPU tensor as a
        :func:`~stepplan.planner.host_ints` tuple of its memory (with a compiled packer),
        any other value as numpy (:func:`~.common_metadata.host_only_array`). A kept view shares
        its tensor's memory, so it shows the tensor's values now."""
        last_starts, starts_view, last_drafts, drafts_view = self._last
        native = self._native
        try:  # the engine's host tensors viewed straight; anything else as it asks
            if starts is not last_starts:
                starts_view = _view(0, starts, native)
            if drafts is None:
                drafts_view = None
            elif drafts is not last_drafts:
                drafts_view = _view(1, drafts, native)
        except (TypeError, RuntimeError):  # a tensor on a device, or one that needs grad
            starts_view = _as_array(0, starts)
            drafts_view = None if drafts is None else _as_array(1, drafts)
        # A list's array is a copy: only tensors are kept.
        self._last = (
            starts if starts.__class__ is _TENSOR else None,
            starts_view,
            drafts if drafts.__class__ is _TENSOR else None,
            drafts_view,
        )
        return starts_view, drafts_view


def _view(field: int, value: Any, native: bool) -> Any:
    """One host value as :meth:`HostViews.view` gives it (a tensor on a device raises
    TypeError)."""
    if value.__class__ is not _TENSOR:
        return _as_array(field, value)
    if native and value.dtype is _INT32 and value.is_cpu and value.stride() == _FLAT:
        return (value.data_ptr(), value.numel())
    return value.numpy()


class HostInputs:
    """A build's host inputs (refusing device tensors) as the bytes of their entries, and
    the key they make: what identifies the step, and what its plan is packed from."""

    __slots__ = (
        "accepted_device",
        "accepted_host",
        "drafts",
        "host",
        "key",
        "starts",
    )

    def __init__(
        self, m: Any, accepted: Any, drafts: Any, share: StepShare, last: tuple | None
    ) -> None:
        rows = m.num_reqs
        self.starts, self.drafts = starts, drafts = share.host_views(m.query_start_loc_cpu, drafts)
        # (bytes of starts, of drafts, live tokens): one native call where it can (int32 or
        # int64, contiguous), ``last`` (the current step's) where its bytes are the step's;
        # else read here.
        self.host = host = share.host_bytes(starts, drafts, rows, last) or read_host_arrays(
            starts, drafts, rows
        )
        self.accepted_device = self.accepted_host = None
        accepted_bytes = None
        if isinstance(accepted, torch.Tensor) and (accepted.is_cuda or not share.on_cuda):
            self.accepted_device = accepted  # gathered on the device, never read here
        elif accepted is not None:
            counts = host_only_array("num_accepted_tokens", accepted)[:rows]
            self.accepted_host = np.ascontiguousarray(counts, dtype=np.int32)
            accepted_bytes = self.accepted_host.tobytes()
        self.key = (rows, m.num_actual_tokens, host, accepted_bytes)


def read_host_arrays(
    starts: np.ndarray, drafts: np.ndarray | None, rows: int
) -> tuple[bytes, bytes | None, int]:
    """:attr:`~stepplan.planner.Planner.host_bytes` for any host arrays, each checked
    (1-D, long enough for ``rows``), the error naming its field."""
    starts, drafts = host_ints(starts), host_ints(drafts)
    if starts.ndim != 1:
        _not_flat(0, starts)
    _check_length(0, starts, rows + 1, "num_reqs + 1")
    drafts_bytes = None
    if drafts is not None:
        if drafts.ndim != 1:
            _not_flat(1, drafts)
        _check_length(1, drafts, rows, "num_reqs")
        drafts_bytes = drafts[:rows].tobytes()
    return starts[: rows + 1].tobytes(), drafts_bytes, int(starts[rows]) - int(starts[0])


_HOST_FIELDS = ("common_attn_metadata.query_start_loc_cpu", "num_decode_draft_tokens_cpu")
_INT32 = torch.int32
_INT32_NUMPY = np.dtype(np.int32)
_FLAT = (1,)  # a 1-D tensor's strides when its entries are contiguous
_TENSOR = torch.Tensor


def host_types(starts: Any, drafts: Any) -> tuple[np.dtype, np.dtype | None]:
    """The dtypes of :meth:`HostViews.view`'s two views (a tuple's is int32)."""
    return (
        _INT32_NUMPY if starts.__class__ is tuple else starts.dtype,
        None if drafts is None else _INT32_NUMPY if drafts.__class__ is tuple else drafts.dtype,
    )


def _as_array(field: int, value: Any) -> np.ndarray:
    return host_only_array(_HOST_FIELDS[field], value)


def _not_flat(field: int, array: np.ndarray) -> None:
    raise ValueError(f"{_HOST_FIELDS[field]}: must be 1-D, got shape {list(array.shape)}")


def _check_length(field: int, array: np.ndarray, need: int, what: str) -> None:
    if array.shape[0] < need:
        raise ValueError(f"{_HOST_FIELDS[field]}: {array.shape[0]} entries, {what} = {need} needed")
