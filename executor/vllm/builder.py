"""A drop-in for the seed's vLLM metadata builder, built by the planner, uploaded in one copy.

:class:`PlanMetadataBuilder` has the seed builder's ``build`` and
``build_for_cudagraph_capture``; it compiles the step with
:func:`~stepplan.executor.vllm.plan_from_common_metadata`, lays the plan out as
the seed's fields with :func:`~stepplan.executor.vllm.seed_view`, and copies
every array, plus the packed plan for stepplan's kernels, to the device in one
copy. Duck-typed: vLLM is never imported.

Every array field lives at a fixed offset of one persistent device buffer, so
a CUDA graph captured over one step's metadata reads the next step's values
there. Each ``build`` overwrites the previous step's values, as the seed's
persistent buffers do.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch

from stepplan.planner import ExecutionPlan, Planner, PlannerConfig, layout_capacity

from ..upload import PinnedUpload
from .bridge import host_array, plan_from_common_metadata
from .seed import seed_graph_limits, seed_view

#: Seed fields that are int32 arrays (``None`` where the seed leaves them unset).
INT32_FIELDS = (
    "state_indices_tensor",
    "state_indices_tensor_d",
    "state_indices_tensor_p",
    "num_computed_tokens_p",
    "query_start_loc_d",
    "query_start_loc_p",
    "non_spec_query_start_loc",
    "spec_state_indices_tensor",
    "spec_query_start_loc",
    "num_accepted_tokens",
)
#: Seed fields that are bool masks.
BOOL_FIELDS = ("has_initial_states_d", "has_initial_states_p", "spec_sequence_masks")
#: Seed fields that are slices of the plan's token map (they live in its region).
TOKEN_FIELDS = ("spec_token_indx", "non_spec_token_indx")
#: Seed fields that are host ints.
COUNT_FIELDS = (
    "num_reqs",
    "num_actual_tokens",
    "num_spec_decodes",
    "num_spec_decode_tokens",
    "num_decodes",
    "num_decode_tokens",
    "num_prefills",
    "num_prefill_tokens",
    "spec_query_len",
    "max_prefill_query_len",
)


@attrs.frozen
class PlanMetadata:
    """The seed's ``PleShortConvAttentionMetadata`` fields, plus the plan itself.

    Arrays are device tensors over the builder's persistent buffer (``int32``;
    masks ``bool``), valid until the builder's next ``build``; counts are ints.
    ``query_start_loc``, ``seq_lens`` and ``num_decode_draft_tokens_cpu`` pass
    through from the input. The seed's ``causal_conv1d`` fields (``nums_dict``,
    ``batch_ptr``, ``token_chunk_offset_ptr``) and prefix-caching block
    indices are ``None``: stepplan's kernels read ``plan_buffer`` instead.
    """

    num_reqs: int
    num_actual_tokens: int
    num_spec_decodes: int
    num_spec_decode_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    spec_query_len: int
    max_prefill_query_len: int
    state_indices_tensor: torch.Tensor | None
    state_indices_tensor_d: torch.Tensor | None
    state_indices_tensor_p: torch.Tensor | None
    num_computed_tokens_p: torch.Tensor | None
    query_start_loc_d: torch.Tensor | None
    query_start_loc_p: torch.Tensor | None
    non_spec_query_start_loc: torch.Tensor | None
    spec_state_indices_tensor: torch.Tensor | None
    spec_query_start_loc: torch.Tensor | None
    num_accepted_tokens: torch.Tensor | None
    has_initial_states_d: torch.Tensor | None
    has_initial_states_p: torch.Tensor | None
    spec_sequence_masks: torch.Tensor | None
    spec_token_indx: torch.Tensor | None
    non_spec_token_indx: torch.Tensor | None
    query_start_loc: Any
    seq_lens: Any
    num_decode_draft_tokens_cpu: Any
    plan: ExecutionPlan
    plan_buffer: torch.Tensor  # [plan.layout.size] int32, the packed plan on the device
    nums_dict: None = None
    batch_ptr: None = None
    token_chunk_offset_ptr: None = None
    block_idx_last_scheduled_token: None = None
    block_idx_first_scheduled_token_p: None = None
    block_idx_last_computed_token: None = None
    block_idx_last_scheduled_token_prev_step: None = None


@attrs.frozen
class _Region:
    """Bytes ``[offset, offset + capacity)`` of the buffer, holding one field."""

    offset: int
    capacity: int  # elements
    dtype: torch.dtype


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // 4) * 4


class PlanMetadataBuilder:
    """The seed builder's contract for the PLE short conv, one upload per step.

    Args:
        config: how plans are compiled (``num_spec_tokens``, graph sizes, ...).
        device: where the metadata lives.
        max_num_reqs: most request rows a step may pass (padding rows
            included); defaults to ``config.max_num_seqs``.
        max_num_tokens: most tokens a step may pass (vLLM's
            ``max_num_batched_tokens``).
    """

    def __init__(
        self,
        config: PlannerConfig,
        device: torch.device | str,
        *,
        max_num_reqs: int | None = None,
        max_num_tokens: int = 8192,
    ) -> None:
        self.config = config
        self._planner = Planner(config)
        sizes = config.sizes
        self.max_num_reqs = max(max_num_reqs or config.max_num_seqs, sizes[-1])
        rows = self.max_num_reqs
        tokens = max(max_num_tokens, sizes[-1], rows * config.query_len_max)
        self.max_plan_layout = layout_capacity(config, tokens, rows, 1)
        self._regions: dict[str, _Region] = {}
        self._views: dict[tuple[str, int], torch.Tensor] = {}
        offset = 0
        for names, dtype, item in ((INT32_FIELDS, torch.int32, 4), (BOOL_FIELDS, torch.bool, 1)):
            for name in names:
                self._regions[name] = _Region(offset, rows + 1, dtype)
                offset += _aligned((rows + 1) * item)
        self._plan_offset = offset
        self._upload = PinnedUpload(offset + 4 * self.max_plan_layout.size, torch.device(device))
        # Largest uniform batch the seed captures full graphs for.
        self.decode_cudagraph_max_bs, self.decode_cudagraph_max_tokens = seed_graph_limits(config)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        *,
        num_accepted_tokens: Any | None = None,
        num_decode_draft_tokens_cpu: Any | None = None,
    ) -> PlanMetadata:
        """The metadata of one step; ``common_prefix_len`` and ``fast_build`` are unused.

        ``num_decode_draft_tokens_cpu`` ``[num_reqs]`` marks spec rows (``>= 0``)
        and ``num_accepted_tokens`` ``[num_reqs]`` gives their accepted counts;
        both are ignored when the config has no speculative tokens.
        """
        del common_prefix_len, fast_build
        m = common_attn_metadata
        if int(m.num_reqs) > self.max_num_reqs:
            raise ValueError(
                f"common_attn_metadata.num_reqs: {m.num_reqs} exceeds the builder's "
                f"max_num_reqs = {self.max_num_reqs}"
            )
        if self.config.num_spec_tokens == 0:
            num_accepted_tokens = num_decode_draft_tokens_cpu = None
        if num_accepted_tokens is None:  # read on spec rows only; int32 keeps the planner happy
            num_accepted_tokens = np.ones(int(m.num_reqs), dtype=np.int32)
        plan = plan_from_common_metadata(
            m,
            num_accepted_tokens=num_accepted_tokens,
            num_decode_draft_tokens_cpu=num_decode_draft_tokens_cpu,
            config=self.config,
            planner=self._planner,
        )
        return self._upload_view(plan, m, num_decode_draft_tokens_cpu)

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> PlanMetadata:
        """Metadata for capturing a uniform (decode or spec) full CUDA graph.

        Every row counts as a spec row with all its tokens accepted when the
        config speculates, as the seed does.
        """
        m = common_attn_metadata
        rows, tokens = int(m.num_reqs), int(m.num_actual_tokens)
        if rows > self.decode_cudagraph_max_bs or tokens > self.decode_cudagraph_max_tokens:
            raise ValueError(
                f"common_attn_metadata: full graphs are captured for at most "
                f"{self.decode_cudagraph_max_bs} requests and "
                f"{self.decode_cudagraph_max_tokens} tokens, got {rows} and {tokens}"
            )
        if self.config.num_spec_tokens == 0:
            return self.build(0, m)
        query_lens = np.diff(host_array(m.query_start_loc_cpu).astype(np.int64)[: rows + 1])
        return self.build(
            0, m, num_accepted_tokens=query_lens, num_decode_draft_tokens_cpu=query_lens - 1
        )

    def _upload_view(self, plan: ExecutionPlan, m: Any, drafts: Any) -> PlanMetadata:
        view = seed_view(plan)
        self._check_capacity(plan, view)
        plan_end = self._plan_offset + 4 * plan.packed.size
        host = self._upload.host_bytes()
        host[self._plan_offset : plan_end].view(np.int32)[:] = plan.packed
        for name, region in self._regions.items():
            value = view[name]
            if value is not None:
                stop = region.offset + value.size * region.dtype.itemsize
                target = host[region.offset : stop]
                target.view(np.int32 if region.dtype == torch.int32 else np.bool_)[:] = value
        device = self._upload.commit(plan_end)
        plan_buffer = device[self._plan_offset : plan_end].view(torch.int32)
        return PlanMetadata(
            **{name: view[name] for name in COUNT_FIELDS},
            **self._device_fields(view, plan, plan_buffer),
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            num_decode_draft_tokens_cpu=drafts,
            plan=plan,
            plan_buffer=plan_buffer,
        )

    def _check_capacity(self, plan: ExecutionPlan, view: dict[str, Any]) -> None:
        """Refuse a step that overflows a region, before anything is written."""
        if plan.packed.size > self.max_plan_layout.size:
            raise ValueError(
                f"common_attn_metadata: the step's plan ({plan.layout}) exceeds the builder's "
                f"capacity ({self.max_plan_layout}); raise max_num_tokens"
            )
        for name, region in self._regions.items():
            value = view[name]
            if value is not None and value.size > region.capacity:
                raise ValueError(
                    f"{name}: {value.size} entries exceed the builder's {region.capacity} "
                    "(raise max_num_reqs)"
                )

    def _device_view(self, name: str, size: int) -> torch.Tensor:
        """``[size]`` of field ``name`` in the persistent device buffer, made once per size:
        slicing and viewing a tensor costs microseconds per field per step."""
        key = (name, size)
        cached = self._views.get(key)
        if cached is None:
            if len(self._views) >= 4096:  # ever new sizes: start over rather than grow
                self._views.clear()
            region = self._regions[name]
            stop = region.offset + size * region.dtype.itemsize
            persistent = self._upload.device_buffer
            cached = self._views[key] = persistent[region.offset : stop].view(region.dtype)
        return cached

    def _device_fields(
        self,
        view: dict[str, Any],
        plan: ExecutionPlan,
        plan_buffer: torch.Tensor,
    ) -> dict[str, torch.Tensor | None]:
        """Device views of every array field; the token lists are slices of the plan's map."""
        fields: dict[str, torch.Tensor | None] = {}
        for name in self._regions:
            value = view[name]
            fields[name] = None if value is None else self._device_view(name, value.size)
        token_map, _ = plan.layout.span("token_map")
        spec_tokens, tokens = plan.num_spec_decode_tokens, plan.num_tokens
        spans = ((0, spec_tokens), (spec_tokens, tokens))
        for name, (start, stop) in zip(TOKEN_FIELDS, spans, strict=True):
            live = plan_buffer[token_map + start : token_map + stop]
            fields[name] = None if view[name] is None else live
        return fields
