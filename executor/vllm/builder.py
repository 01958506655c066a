"""A drop-in for the seed's vLLM metadata builder that never waits for the device.

:class:`PlanMetadataBuilder` has the seed builder's ``build`` and
``build_for_cudagraph_capture``. A build packs the step's plan from host data only,
or reuses the plan its step already has when another layer group's builder compiled it
(:class:`~.step_share.StepShare`), and returns the seed's metadata fields as views of one
persistent device buffer: slots, accepted counts and has-initial-state flags are
gathered on the device by one kernel launch (:mod:`.gather_kernels`), never read back.
Duck-typed: vLLM is never imported.

Every field lives at a fixed offset of the buffer, so a CUDA graph captured over one
step's metadata reads the next step's values there. Each step overwrites the previous
step's values, as the seed's persistent buffers do. Not supported: vLLM's mamba prefix
caching (the slot is always column 0 of the block table), and the seed's
``causal_conv1d`` fields (``nums_dict``, ``batch_ptr``, ``token_chunk_offset_ptr``),
which vLLM's own kernels read: they stay ``None``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch

from stepplan.planner import ExecutionPlan, PlannerConfig, PlanShape

from .common_metadata import host_only_array
from .metadata_fields import ARRAY_FIELDS, seed_graph_limits
from .step_share import StepShare

# Where the engine's own non_spec_query_start_loc goes (without spec rows), in a build's
# row views.
_PASS_AT = ARRAY_FIELDS.index("non_spec_query_start_loc")


# A NamedTuple, not a frozen attrs class: made on every build, it costs 0.8 µs against
# 2.2 µs for the attrs class's 39 fields (this machine).
class _Fields(NamedTuple):
    """The seed's ``PleShortConvAttentionMetadata`` fields, plus the plan.

    Counts are ints. Arrays are device tensors over the builder's persistent buffer,
    valid until the next step's build, with the seed's dtypes (``int32``; masks
    ``bool``; a mixed step's ``spec_token_indx`` and ``non_spec_token_indx`` ``int64``),
    ``None`` where the seed leaves a field unset and empty where the seed's is.
    ``query_start_loc``, ``seq_lens`` and ``num_decode_draft_tokens_cpu`` are the
    engine's own (so is ``non_spec_query_start_loc`` in a step without spec rows).

    ``plan`` is the host plan (:class:`~stepplan.planner.ExecutionPlan`, compiled at
    its first access: a build packs the plan's bytes without making it) and
    ``plan_shape`` its counts and layout (:class:`~stepplan.planner.PlanShape`, free):
    its structure is the step's, but the fields only the device knows (``row_slot``,
    ``row_num_accepted``, ``row_state_offset``, the non-spec rows' ``row_reads_state``)
    hold placeholders (NULL slots, one accepted token, no initial state);
    ``plan_buffer`` (``[plan.layout.size], int32``, a view made at its first access)
    holds the real plan, on the device, for the kernels. ``group`` is
    the layer group these slots are of, ``step`` the step's number on its
    :class:`~.step_share.StepShare` (groups of one step share it). ``plan_record`` is the
    share's record of the plan (not part of the contract).
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
    has_initial_states_d: torch.Tensor | None
    has_initial_states_p: torch.Tensor | None
    spec_sequence_masks: torch.Tensor | None
    spec_state_indices_tensor: torch.Tensor | None
    spec_query_start_loc: torch.Tensor | None
    num_accepted_tokens: torch.Tensor | None
    spec_token_indx: torch.Tensor | None
    non_spec_token_indx: torch.Tensor | None
    query_start_loc: Any
    seq_lens: Any
    num_decode_draft_tokens_cpu: Any
    plan_record: Any
    group: int
    step: int
    nums_dict: None = None
    batch_ptr: None = None
    token_chunk_offset_ptr: None = None
    block_idx_last_scheduled_token: None = None
    block_idx_first_scheduled_token_p: None = None
    block_idx_last_computed_token: None = None
    block_idx_last_scheduled_token_prev_step: None = None


class PlanMetadata(_Fields):
    __doc__ = _Fields.__doc__
    __slots__ = ()

    @property
    def plan(self) -> ExecutionPlan:
        """The host plan (see the class)."""
        return self.plan_record.plan

    @property
    def plan_shape(self) -> PlanShape:
        """The host plan's counts and layout, without its arrays."""
        return self.plan_record.shape

    @property
    def plan_buffer(self) -> torch.Tensor:
        """``[plan.layout.size], int32``: the packed plan on the device (see the class)."""
        return self.plan_record.plan_buffer


_UNSET = (None,) * 7  # the fields stepplan leaves unset (PlanMetadata's last seven)
# tuple.__new__ straight: a third of what PlanMetadata(...) costs with 39 fields (and
# less than _make, a Python function).
_new_metadata = functools.partial(tuple.__new__, PlanMetadata)


class PlanMetadataBuilder:
    """The seed builder's contract for the PLE short conv, for one layer group.

    Args:
        config: how plans are compiled (``num_spec_tokens``, graph sizes, ...).
        device: where the metadata lives.
        max_num_reqs: most request rows a step may pass (padding rows included);
            defaults to ``config.max_num_seqs``. With ``share``, set it there.
        max_num_tokens: most tokens a step may pass (vLLM's ``max_num_batched_tokens``).
            With ``share``, set it there.
        share: the :class:`~.step_share.StepShare` of the engine's layer groups, whose builds
            of one step share one compile; ``None`` makes this builder its own (one group).
        group: this builder's layer group on ``share`` (one builder per group).
    """

    def __init__(
        self,
        config: PlannerConfig,
        device: torch.device | str,
        *,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        share: StepShare | None = None,
        group: int = 0,
    ) -> None:
        if share is None:
            share = StepShare(
                config, device, max_num_reqs=max_num_reqs, max_num_tokens=max_num_tokens or 8192
            )
        else:
            _check_share(share, config, device, max_num_reqs, max_num_tokens)
        share.claim_group(group)
        self.config, self.share, self.group = config, share, group
        self.max_num_reqs = share.max_num_reqs
        self.max_plan_layout = share.max_plan_layout
        # Largest uniform batch the seed captures full graphs for.
        self.decode_cudagraph_max_bs, self.decode_cudagraph_max_tokens = seed_graph_limits(config)
        self._speculates = config.num_spec_tokens > 0

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        *,
        num_accepted_tokens: Any | None = None,
        num_decode_draft_tokens_cpu: Any | None = None,
        step_id: Any | None = None,
    ) -> PlanMetadata:
        """The metadata of one step for this group; ``common_prefix_len`` and
        ``fast_build`` are unused. Never waits for the device.

        Args:
            common_attn_metadata: vLLM's ``CommonAttentionMetadata``: read on the host
                are ``num_reqs``, ``num_actual_tokens`` and ``query_start_loc_cpu``
                ``[num_reqs + 1]``; on the device, through the plan,
                ``block_table_tensor`` ``[num_reqs, B]`` (column 0) and ``seq_lens``.
            num_accepted_tokens: ``[num_reqs]`` accepted counts of the spec rows' previous
                step, a device tensor (or host values, uploaded with the step); ``None``:
                all 1. Ignored when the config has no speculative tokens.
            num_decode_draft_tokens_cpu: ``[num_reqs]`` on the host, ``>= 0`` on spec rows.
            step_id: the engine's number for this step, if it numbers them: then the
                builds of one id are one step (see :class:`~.step_share.StepShare`).
        """
        del common_prefix_len, fast_build
        m = common_attn_metadata
        accepted, drafts = num_accepted_tokens, num_decode_draft_tokens_cpu
        if not self._speculates:
            accepted = drafts = None
        step = self.share.open(self.group, m, accepted, drafts, step_id)
        record, group = step.record, self.group
        rows = record.rows.get(group)
        if rows is None:  # made once per row-part keys and group
            rows = self.share.buffer.row_views(record.keys, group, record.rows)
        if record.keys[1] is None:  # no spec rows: the engine's own non-spec starts
            rows = (*rows[:_PASS_AT], m.query_start_loc, *rows[_PASS_AT + 1 :])
        return _new_metadata(
            (
                *record.counts,
                *rows,
                *record.tokens,
                m.query_start_loc,
                m.seq_lens,
                num_decode_draft_tokens_cpu,
                record,
                group,
                step.index,
                *_UNSET,
            )
        )

    def build_for_cudagraph_capture(
        self, common_attn_metadata: Any, *, step_id: Any | None = None
    ) -> PlanMetadata:
        """Metadata for capturing a uniform (decode or spec) full CUDA graph.

        When the config speculates, every row with tokens counts as a spec row with all
        of them accepted, as the seed does (drafts ``q - 1``, accepted ``q``, from
        ``query_start_loc_cpu``).
        """
        m = common_attn_metadata
        rows, tokens = m.num_reqs, m.num_actual_tokens
        if rows > self.decode_cudagraph_max_bs or tokens > self.decode_cudagraph_max_tokens:
            raise ValueError(
                f"common_attn_metadata: full graphs are captured for at most "
                f"{self.decode_cudagraph_max_bs} requests and "
                f"{self.decode_cudagraph_max_tokens} tokens, got {rows} and {tokens}"
            )
        if not self._speculates:
            return self.build(0, m, step_id=step_id)
        starts = host_only_array("common_attn_metadata.query_start_loc_cpu", m.query_start_loc_cpu)
        query_lens = np.diff(starts[: rows + 1]).astype(np.int32)
        return self.build(
            0,
            m,
            num_accepted_tokens=query_lens,
            num_decode_draft_tokens_cpu=torch.from_numpy(query_lens - 1),
            step_id=step_id,
        )


def _check_share(
    share: StepShare,
    config: PlannerConfig,
    device: torch.device | str,
    max_num_reqs: int | None,
    max_num_tokens: int | None,
) -> None:
    """A builder joins a share of its own config and device; capacities are the share's."""
    if share.config is not config and share.config != config:
        raise ValueError("share: was made for another PlannerConfig")
    if share.device != torch.device(device):
        raise ValueError(f"share: lives on {share.device}, the builder on {device}")
    if max_num_reqs is not None or max_num_tokens is not None:
        raise ValueError("max_num_reqs, max_num_tokens: set them on the StepShare")
