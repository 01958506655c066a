"""A drop-in for vLLM's PLE metadata builder that never waits for the device.

:class:`PlanMetadataBuilder` has the builder's ``build`` and
``build_for_cudagraph_capture``. A build packs the step's plan from host data only,
or reuses the plan its step already has when another layer group's builder compiled it
(:class:`~.step_share.StepShare`), and returns the metadata fields of a revision of
vLLM's builder (:mod:`.revisions`: the seed's by default) as views of one persistent
device buffer: slots, accepted counts and has-initial-state flags are gathered on the
device by one kernel launch (:mod:`.gather_kernels`), never read back. Duck-typed: vLLM
is never imported (:mod:`.vllm_builder` is the same builder as vLLM's own subclass).

Every field lives at a fixed offset of the buffer, so a CUDA graph captured over one
step's metadata reads the next step's values there. Each step overwrites the previous
step's values, as vLLM's persistent buffers do. Not supported: vLLM's mamba prefix
caching (the slot is always column 0 of the block table), and the fields of the
``causal_conv1d`` kernels and of the base mamba builder's other kernels, which vLLM's
PLE builder leaves unset too (the seed set ``nums_dict``, ``batch_ptr`` and
``token_chunk_offset_ptr`` on a GPU; they stay ``None``).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stepplan.planner import ExecutionPlan, PlannerConfig, PlanShape

from .common_metadata import host_only_array
from .device_buffer import MARKERS
from .metadata_fields import PASS_THROUGH, GraphLimits
from .revisions import SEED, VLLM_0_33, Revision
from .step_share import StepShare

#: What a build adds after a revision's fields: the share's plan record, the layer group
#: and the step's number.
PLAN_FIELDS = ("plan_record", "group", "step")


class _PlanAccess:
    """The plan of a metadata tuple, through its ``plan_record`` field."""

    __slots__ = ()

    @property
    def plan(self) -> ExecutionPlan:
        """The host plan (compiled at its first access: a build packs the plan's bytes
        without making it). Its structure is the step's, but the fields only the device
        knows (``row_slot``, ``row_num_accepted``, ``row_state_offset``, the non-spec rows'
        ``row_reads_state``) hold placeholders (NULL slots, one accepted token, no
        initial state)."""
        return self.plan_record.plan

    @property
    def plan_shape(self) -> PlanShape:
        """The host plan's counts and layout, without its arrays (free)."""
        return self.plan_record.shape

    @property
    def plan_buffer(self) -> torch.Tensor:
        """``[plan.layout.size], int32``: the real plan on the device, for the kernels (a
        view made at its first access)."""
        return self.plan_record.plan_buffer


def _metadata_type(name: str, revision: Revision) -> type:
    """A named tuple of ``revision``'s fields, :data:`PLAN_FIELDS` and its unset fields
    (defaults ``None``), with :class:`_PlanAccess`'s properties."""
    fields = revision.field_names + PLAN_FIELDS + revision.unset_fields
    base = collections.namedtuple(
        f"_{name}Fields", fields, defaults=(None,) * len(revision.unset_fields)
    )
    doc = f"""The fields of revision ``{revision.name}``'s ``PleShortConvAttentionMetadata``,
    plus the plan.

    Counts are ints. Arrays are device tensors over the builder's persistent buffer,
    valid until the next step's build, with vLLM's dtypes (``int32``; masks ``bool``; a
    mixed step's ``spec_token_indx`` and ``non_spec_token_indx`` ``int64``), ``None``
    where the revision leaves a field unset and empty where its builder gives an empty
    tensor. ``query_start_loc``, ``seq_lens`` and ``num_decode_draft_tokens_cpu`` are the
    engine's own (so are the fields the revision takes from the engine's tensors as they
    are). ``plan_record`` is the share's record of the plan (not part of the contract);
    ``group`` is the layer group these slots are of, ``step`` the step's number on its
    :class:`~.step_share.StepShare` (groups of one step share it)."""
    return type(name, (_PlanAccess, base), {"__slots__": (), "__doc__": doc})


#: The seed's metadata fields, plus the plan (a named tuple: made on every build, it
#: costs a third of a frozen attrs class of these 41 fields).
PlanMetadata = _metadata_type("PlanMetadata", SEED)
#: vLLM 0.33's fields, plus the plan (without vLLM; :mod:`.vllm_builder` makes vLLM's own
#: dataclass).
Vllm033PlanMetadata = _metadata_type("Vllm033PlanMetadata", VLLM_0_33)
_METADATA_TYPES = {SEED.name: PlanMetadata, VLLM_0_33.name: Vllm033PlanMetadata}


def tuple_maker(metadata_type: type) -> Callable[[tuple], Any]:
    """A metadata tuple of ``metadata_type`` from its values in field order:
    ``tuple.__new__`` straight, a third of what calling the type costs."""
    return functools.partial(tuple.__new__, metadata_type)


class PlanMetadataBuilder:
    """vLLM's PLE metadata builder's contract, for one layer group.

    Args:
        config: how plans are compiled (``num_spec_tokens``, graph sizes, ...).
        device: where the metadata lives.
        max_num_reqs: most request rows a step may pass (padding rows included);
            defaults to ``config.max_num_seqs``. With ``share``, set it there.
        max_num_tokens: most tokens a step may pass (vLLM's ``max_num_batched_tokens``).
            With ``share``, set it there.
        share: the :class:`~.step_share.StepShare` of the engine's layer groups, whose
            builds of one step share one compile; ``None`` makes this builder its own
            (one group).
        group: this builder's layer group on ``share`` (one builder per group).
        revision: whose fields a build gives (:mod:`.revisions`); with ``share``, set it
            there.
        graph_limits: where uniform batches are padded for full graphs (the config's by
            default); with ``share``, set it there.
        make_metadata: makes a build's metadata from its values in the order of
            ``revision.field_names`` then :data:`PLAN_FIELDS` (default: the revision's
            named tuple, :data:`PlanMetadata` for the seed).
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
        revision: Revision | None = None,
        graph_limits: GraphLimits | None = None,
        make_metadata: Callable[[tuple], Any] | None = None,
    ) -> None:
        if share is None:
            share = StepShare(
                config,
                device,
                max_num_reqs=max_num_reqs,
                max_num_tokens=max_num_tokens or 8192,
                revision=revision or SEED,
                graph_limits=graph_limits,
            )
        else:
            _check_share(share, config, device, (max_num_reqs, max_num_tokens, revision))
            if graph_limits is not None:
                raise ValueError("graph_limits: set them on the StepShare")
        share.claim_group(group)
        self.config, self.share, self.group = config, share, group
        self.revision = share.revision
        self.max_num_reqs = share.max_num_reqs
        self.max_plan_layout = share.max_plan_layout
        # Largest uniform batch captured in a full graph.
        limits = share.graph_limits
        self.decode_cudagraph_max_bs = limits.max_rows
        self.decode_cudagraph_max_tokens = limits.max_tokens
        self._speculates = config.num_spec_tokens > 0
        self._make = make_metadata or tuple_maker(_METADATA_TYPES[self.revision.name])
        # The named tuple's last fields, the unset ones (None): appended to a build's own.
        self._unset = () if make_metadata else (None,) * len(self.revision.unset_fields)
        self._table_columns = 1 + config.num_spec_tokens

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        *,
        num_accepted_tokens: Any | None = None,
        num_decode_draft_tokens_cpu: Any | None = None,
        step_id: Any | None = None,
    ) -> Any:
        """The metadata of one step for this group; ``common_prefix_len`` and
        ``fast_build`` are unused. Never waits for the device.

        Args:
            common_attn_metadata: vLLM's ``CommonAttentionMetadata``: read on the host
                are ``num_reqs``, ``num_actual_tokens`` and ``query_start_loc_cpu``
                ``[num_reqs + 1]`` (and, for a step that a revision splits by position,
                ``is_prefilling`` and ``seq_lens_cpu_upper_bound``); on the device,
                through the plan, ``block_table_tensor`` ``[num_reqs, B]`` (column 0),
                ``seq_lens`` and ``query_start_loc``.
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
        markers = record.rows[MARKERS]
        if markers:  # fields that are the engine's own tensors
            rows = self._engine_fields(rows, markers, m, record.counts[4])
        return self._make(
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
                *self._unset,
            )
        )

    def _engine_fields(self, rows: tuple, markers: tuple, m: Any, decodes: int) -> tuple:
        """``rows`` with each marked field the engine's: its ``query_start_loc``, or its
        block table's first ``decodes`` rows and ``1 + num_spec_tokens`` columns."""
        rows = list(rows)
        for at, marker in markers:
            if marker is PASS_THROUGH:
                rows[at] = m.query_start_loc
            else:
                rows[at] = m.block_table_tensor[:decodes, : self._table_columns]
        return tuple(rows)

    def build_for_cudagraph_capture(
        self, common_attn_metadata: Any, *, step_id: Any | None = None
    ) -> Any:
        """Metadata for capturing a uniform (decode or spec) full CUDA graph.

        When the config speculates, every row with tokens counts as a spec row with all
        of them accepted, as vLLM does (drafts ``q - 1``, accepted ``q``, from
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
    share: StepShare, config: PlannerConfig, device: torch.device | str, own: tuple
) -> None:
    """A builder joins a share of its own config and device; capacities and the revision
    are the share's."""
    if share.config is not config and share.config != config:
        raise ValueError("share: was made for another PlannerConfig")
    if share.device != torch.device(device):
        raise ValueError(f"share: lives on {share.device}, the builder on {device}")
    if any(value is not None for value in own):
        raise ValueError("max_num_reqs, max_num_tokens, revision: set them on the StepShare")
