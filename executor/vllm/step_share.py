"""``StepShare``: one plan per step for the builders of every layer group, never a device read.

The first layer group's build of a step packs the plan from host data alone
(``query_start_loc_cpu``, ``num_decode_draft_tokens_cpu``, the engine's counts; a step
whose host data equal the last compiled step's reuses its plan) straight into a staging
entry (:meth:`~stepplan.planner.Planner.pack_host_step`: no batch or plan object is
made), writes a header there and launches one kernel (:mod:`.gather_kernels`) that copies it to
the device, gathers there what only the device knows and derives the seed's fields.
Each further group of the same step launches one kernel for its own slots, or none
when the engine registered its block tables (:meth:`StepShare.register_block_tables`),
and reuses everything else.

**Same step.** A build belongs to the current step when its group has not been built in
that step yet and its host inputs equal the step's (``num_reqs``, ``num_actual_tokens``,
the bytes of ``query_start_loc_cpu`` and of ``num_decode_draft_tokens_cpu``) and its
device inputs (``query_start_loc``, ``seq_lens``, ``num_accepted_tokens``) are the step's
tensors: the same objects, or views of the same memory with the same shape, strides and
dtype (vLLM may slice its persistent buffers anew for each group). Anything else opens a
new step. An engine that numbers its steps passes ``step_id`` instead: then a step is
exactly the builds of one id, and a further group whose host inputs differ from its
first group's is refused. The contract: between the builds of one step the engine does
not change the device inputs in place (the first build read them, in stream order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from stepplan.planner import (
    ExecutionPlan,
    Planner,
    PlannerConfig,
    PlanShape,
    host_step_batch,
    layout_capacity,
)

from .common_metadata import host_only_array
from .device_buffer import DeviceBuffer, plan_regions
from .host_inputs import HostInputs, HostViews, host_types
from .metadata_fields import GraphLimits, ShapeKeys
from .revisions import SEED, Revision, Split, vllm_split


class _Plan:
    """A step's plan as the builder keeps it: packed from host data alone (no StepBatch,
    no ExecutionPlan made), its shape, seed shape keys and counts, and the views a build
    returns (of the buffer's fixed addresses; the row parts' per layer group). The
    :class:`~stepplan.planner.ExecutionPlan` itself is compiled on first access of
    :attr:`plan`, from the same host data: the same bytes, a pure function of them."""

    __slots__ = (
        "_buffer",
        "_plan",
        "_plan_buffer",
        "_planner",
        "_types",
        "counts",
        "key",
        "keys",
        "rows",
        "shape",
        "split",
        "split_key",
        "tokens",
    )

    def __init__(
        self,
        key: tuple,
        planner: Planner,
        types: tuple[np.dtype, np.dtype | None],
        shape: PlanShape,
        counts_and_keys: tuple[tuple[int, ...], ShapeKeys],
        buffer: DeviceBuffer,
        split: Split | None = None,
    ) -> None:
        # key (rows, tokens, (query starts' bytes, drafts' bytes, live tokens)) and the two
        # arrays' dtypes: the host data the plan is a function of.
        self.key, self._planner, self._types = key, planner, types
        self.shape, self._buffer = shape, buffer
        # The revision's counts and part keys of the shape (and of its split by position,
        # where it has one: -1 in the header where not), then its views: the row parts'
        # per group (shared with every plan of these row parts, filled by the group's
        # first build), the token lists'.
        self.counts, self.keys = counts_and_keys
        self.split_key, self.split = split, -1 if split is None else split[0]
        self.rows, self.tokens = buffer.part_views(self.keys)
        self._plan: ExecutionPlan | None = None
        self._plan_buffer: torch.Tensor | None = None

    @property
    def plan_buffer(self) -> torch.Tensor:
        """``[layout.size], int32``: the plan in the buffer, on the device (made at the
        first access: the seed's fields do not need it)."""
        if self._plan_buffer is None:
            self._plan_buffer = self._buffer.plan_buffer(self.shape.layout.size)
        return self._plan_buffer

    def pack(self, out: np.ndarray, summary: np.ndarray) -> None:
        """Write the plan's bytes into ``out`` (``[>= size], int32``) again, and its
        summary into ``summary`` (:meth:`~stepplan.planner.Planner.pack_host_step`)."""
        query_start, drafts, rows, tokens, groups = self._host_data()
        self._planner.pack_host_step(
            out,
            query_start,
            drafts,
            rows,
            num_padded_tokens=tokens,
            num_groups=groups,
            summary=summary,
        )

    @property
    def plan(self) -> ExecutionPlan:
        """The host plan (compiled at the first access, then kept)."""
        if self._plan is None:
            query_start, drafts, rows, tokens, groups = self._host_data()
            batch = host_step_batch(
                query_start, drafts, rows, num_padded_tokens=tokens, num_groups=groups
            )
            self._plan = self._planner.compile(batch)
        return self._plan

    def _host_data(self) -> tuple:
        """The step's host data, as its plan was packed from them: read-only query starts
        ``[R + 1]`` and drafts ``[R]`` (or ``None``) over the key's bytes (the engine's
        tensors change after the build), rows, tokens and layer groups."""
        starts_type, drafts_type = self._types
        rows, tokens, (starts, drafts, _) = self.key
        if drafts is not None:
            drafts = np.frombuffer(drafts, drafts_type)
        groups = self.shape.layout.num_groups
        return np.frombuffer(starts, starts_type), drafts, rows, tokens, groups


class _Step:
    """One step: its plan, what identifies it, and which groups it built."""

    __slots__ = ("built", "device_inputs", "host_key", "index", "record", "step_id")

    def __init__(
        self,
        index: int,
        record: _Plan,
        host_key: tuple,
        device_inputs: tuple,
        step_id: Any,
        group: int,
    ) -> None:
        self.index = index
        self.record = record
        self.host_key = host_key
        self.device_inputs = device_inputs
        self.step_id = step_id
        self.built = 1 << group


def _signature(tensor: Any) -> Any:
    """What makes two device tensors the same input: their memory, shape, strides, dtype."""
    if tensor is None or not isinstance(tensor, torch.Tensor):
        return tensor if tensor is None else id(tensor)
    return (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)


def _same_inputs(new: tuple, old: tuple) -> bool:
    """Whether the device inputs (three) are the same: the same objects (an engine passes
    every group the same ones), or views of the same memory (:func:`_signature`)."""
    if new[0] is old[0] and new[1] is old[1] and new[2] is old[2]:
        return True
    return all(a is b or _signature(a) == _signature(b) for a, b in zip(new, old, strict=True))


_INT32 = torch.int32


class StepShare:
    """The step state the builders of an engine's layer groups share (see the module).

    Owned by the engine: make one, pass it to every group's
    :class:`~.builder.PlanMetadataBuilder`. Instance state only; one engine thread.

    Args:
        config: how plans are compiled.
        device: where the metadata lives (a CUDA device: kernels; else torch operations).
        num_groups: layer groups, each with its own block table (``G`` of the plan).
        max_num_reqs: most request rows a step may pass; defaults to
            ``config.max_num_seqs`` (at least the largest graph size).
        max_num_tokens: most tokens a step may pass (vLLM's ``max_num_batched_tokens``).
        ring_size: staging entries: how many steps the host may run ahead of the device
            before a build waits for one to come back.
        revision: the rules of the metadata fields (:mod:`.revisions`; the seed's by
            default).
        graph_limits: where uniform batches are padded for full graphs (the config's by
            default: :meth:`~.metadata_fields.GraphLimits.of`).
        direct_launches: launch the kernels past Triton's dispatch where Triton allows
            (:class:`~.kernel_launcher.Launcher`); ``False``: through Triton, every launch.
        graph_launches: with ``direct_launches``, replay a launch whose arguments recur
            (the engine's persistent buffers, the ring's entries) as a CUDA graph.
    """

    def __init__(
        self,
        config: PlannerConfig,
        device: torch.device | str,
        *,
        num_groups: int = 1,
        max_num_reqs: int | None = None,
        max_num_tokens: int = 8192,
        ring_size: int = 32,
        revision: Revision = SEED,
        graph_limits: GraphLimits | None = None,
        direct_launches: bool = True,
        graph_launches: bool = True,
    ) -> None:
        if num_groups < 1:
            raise ValueError(f"num_groups: must be positive, got {num_groups}")
        self.config, self.device, self.num_groups = config, torch.device(device), num_groups
        self._planner = Planner(config)
        self.host_bytes = self._planner.host_bytes
        #: The host tensors as the packer reads them (:meth:`.host_inputs.HostViews.view`).
        self.host_views = HostViews(self._planner.native).view
        self.on_cuda = self.device.type == "cuda"
        self.revision = revision
        self._splits = revision.splits_by_position  # read on every new step
        self.graph_limits = graph_limits or GraphLimits.of(config)
        self.max_num_reqs = max(max_num_reqs or config.max_num_seqs, config.sizes[-1])
        rows = self.max_num_reqs
        tokens = max(max_num_tokens, config.sizes[-1], rows * config.query_len_max)
        self.max_plan_layout = layout_capacity(config, tokens, rows, num_groups)
        regions = plan_regions(
            self.max_plan_layout.size, max(rows, self.max_plan_layout.num_rows), tokens, num_groups
        )
        self.buffer = DeviceBuffer(
            regions,
            self.device,
            revision,
            ring_size,
            config.query_len_max,
            direct_launches=direct_launches,
            graph_launches=graph_launches,
        )
        self._last_plan: _Plan | None = None
        self._registered: tuple[tuple[int, int], ...] = ()
        self._step: _Step | None = None
        self._claimed: set[int] = set()
        #: Steps opened so far, and plans compiled for them (a step whose host data
        #: equal the last compiled step's reuses that plan: the plan is a pure function).
        self.num_steps = self.num_compiles = 0

    def claim_group(self, group: int) -> None:
        """Reserve ``group`` for one builder (two builders of one group would mix steps)."""
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group: must be in 0..{self.num_groups - 1}, got {group}")
        if group in self._claimed:
            raise ValueError(f"group: {group} already has a builder on this StepShare")
        self._claimed.add(group)

    def register_block_tables(self, tables: Sequence[torch.Tensor]) -> None:
        """The engine's persistent block table of each layer group, in group order
        (``[max rows, B]`` int32 on the device; vLLM keeps one per KV-cache group).

        Each step's opening launch then gathers every registered group's slots, and a
        further group's build whose ``block_table_tensor`` is its registered table
        (a view of it from row 0, as vLLM slices it) launches nothing. The engine's
        contract: a step's block tables hold their values before the step's first build.
        """
        if len(tables) > self.num_groups:
            raise ValueError(f"tables: {len(tables)} for {self.num_groups} layer groups")
        for group, table in enumerate(tables):
            if (
                table.dtype != torch.int32
                or table.ndim != 2
                or table.device.type != self.device.type
            ):
                raise ValueError(
                    f"tables[{group}]: must be a 2-D int32 tensor on {self.device}, got "
                    f"{list(table.shape)} {table.dtype} on {table.device}"
                )
        self._registered = tuple((t.data_ptr(), t.stride(0)) for t in tables)
        self.buffer.register(tables)
        self.new_step()

    def _gathered(self, group: int, table: Any) -> bool:
        """Whether the opening launch gathered ``group``'s slots from ``table``'s memory."""
        registered = self._registered
        if group >= len(registered):
            return False
        address, stride = registered[group]
        # stride()[0]: half of what stride(0) costs (torch parses the argument).
        return table.data_ptr() == address and table.stride()[0] == stride and table.dtype is _INT32

    def new_step(self) -> None:
        """Make the next build open a new step, whatever its inputs."""
        self._step = None

    def open(self, group: int, m: Any, accepted: Any, drafts: Any, step_id: Any) -> _Step:
        """The step of this build: the current one (then ``group``'s slots are gathered) or
        a new one (compiled, staged and opened). Reads no device tensor on the host.

        ``accepted`` and ``drafts`` are ``None`` when the config does not speculate;
        accepted counts given on the host are uploaded with the step.
        """
        rows = m.num_reqs
        if rows > self.max_num_reqs:
            raise ValueError(
                f"common_attn_metadata.num_reqs: {rows} exceeds the builder's "
                f"max_num_reqs = {self.max_num_reqs}"
            )
        step = self._step
        further = step is not None and not step.built >> group & 1
        if further and self._same_objects(step, m, accepted, drafts, step_id):
            return self._join(step, group, m.block_table_tensor)
        inputs = HostInputs(m, accepted, drafts, self, None if step is None else step.host_key[2])
        device_inputs = (m.query_start_loc, m.seq_lens, inputs.accepted_device)
        if further and self._same(step, inputs.key, device_inputs, step_id):
            return self._join(step, group, m.block_table_tensor)
        return self._compile(group, m, inputs, device_inputs, step_id)

    def _same_objects(self, step: _Step, m: Any, accepted: Any, drafts: Any, step_id: Any) -> bool:
        """:meth:`_same`'s answer where it is yes by the short way: no step ids, the step's
        own device tensors and accepted counts (not the host's) by identity, as an engine
        passes every group the same ones, and its host data byte for byte (False: ask
        :meth:`_same`)."""
        if step_id is not None or step.step_id is not None:
            return False
        device = step.device_inputs
        if not (m.query_start_loc is device[0] and m.seq_lens is device[1]):
            return False
        rows, tokens, host, accepted_bytes = step.host_key
        if accepted is not device[2] or accepted_bytes is not None:
            return False
        if m.num_reqs != rows or m.num_actual_tokens != tokens:
            return False
        starts, drafts = self.host_views(m.query_start_loc_cpu, drafts)
        return self.host_bytes(starts, drafts, rows, host) is host

    def _join(self, step: _Step, group: int, table: Any) -> _Step:
        """``group`` built in ``step``: its slots gathered, unless the opening launch did."""
        if not self._gathered(group, table):
            self.buffer.slots(table, group)
        step.built |= 1 << group
        return step

    def _same(self, step: _Step, host_key: tuple, device_inputs: tuple, step_id: Any) -> bool:
        """Whether a build of a group not yet built belongs to ``step`` (the module says when)."""
        if step_id is not None or step.step_id is not None:
            if step_id != step.step_id:
                return False
            if host_key != step.host_key or not _same_inputs(device_inputs, step.device_inputs):
                raise ValueError(
                    f"step_id {step_id!r}: a further layer group got other inputs than the "
                    "step's first group (query_start_loc_cpu, num_decode_draft_tokens_cpu, "
                    "num_reqs, num_actual_tokens, or the device tensors)"
                )
            return True
        return host_key == step.host_key and _same_inputs(device_inputs, step.device_inputs)

    def _compile(
        self, group: int, m: Any, inputs: HostInputs, device_inputs: tuple, step_id: Any
    ) -> _Step:
        """Open a new step: its plan packed from host data into a staging entry (or the
        last plan, where its host data are the last plan's), the builder's capacity checked
        before anything is written; the entry staged, the gather launched."""
        self._step = None  # a build that fails opens no step
        rows, buffer = m.num_reqs, self.buffer
        plan_key = inputs.key[:3]  # the plan does not depend on the accepted counts
        record = self._last_plan
        index = buffer.claim()
        packed = record is None or record.key != plan_key
        if packed:  # the plan: a pure function of these
            # Every plan of at most these tokens and rows fits the plan space.
            live_tokens = inputs.host[2]
            if live_tokens > buffer.regions.num_tokens:
                raise ValueError(
                    f"common_attn_metadata: the step's {live_tokens} tokens exceed the "
                    f"builder's capacity ({self.max_plan_layout}); raise max_num_tokens"
                )
            # The engine's arrays as they are now: the bytes the key holds.
            query_start, drafts = inputs.starts, inputs.drafts
            plan, summary = buffer.spaces(index)
            shape = self._planner.pack_host_step(
                plan,
                query_start,
                drafts,
                rows,
                num_padded_tokens=m.num_actual_tokens,
                num_groups=self.num_groups,
                summary=summary,
            )
            types = host_types(query_start, drafts)
            split = None
            if self._splits and not shape.num_spec_rows:  # the revision's needs_split
                split = self._split(m, inputs, types[0])
            counts_and_keys = self.revision.counts_and_keys(shape, self.graph_limits, split)
            gather_rows = counts_and_keys[1][3]
            if gather_rows > buffer.regions.rows:
                raise ValueError(
                    f"common_attn_metadata: the step's {gather_rows} rows exceed the builder's "
                    f"{buffer.regions.rows} (raise max_num_reqs)"
                )
            record = _Plan(plan_key, self._planner, types, shape, counts_and_keys, buffer, split)
            self._last_plan = record
            self.num_compiles += 1
        elif self._splits and not record.shape.num_spec_rows:  # a recurring plan's split may not
            record = self._resplit(record, m, inputs)
        buffer.stage(index, record, record.keys[3], inputs.accepted_host, packed=packed)
        accepted = inputs.accepted_device
        if inputs.accepted_host is not None:
            accepted = buffer.accepted_view(rows)
        buffer.open(m.block_table_tensor, m.query_start_loc, m.seq_lens, accepted, group)
        self.num_steps += 1
        step = _Step(self.num_steps, record, inputs.key, device_inputs, step_id, group)
        self._step = step
        return step

    def _resplit(self, record: _Plan, m: Any, inputs: HostInputs) -> _Plan:
        """``record``, or where this step's split differs from its one, a record of the
        same plan with this step's split (it becomes the last plan)."""
        split = self._split(m, inputs, record._types[0])
        if split == record.split_key:
            return record
        shape, types = record.shape, record._types
        counts_and_keys = self.revision.counts_and_keys(shape, self.graph_limits, split)
        record = _Plan(record.key, self._planner, types, shape, counts_and_keys, self.buffer, split)
        self._last_plan = record
        return record

    def _split(self, m: Any, inputs: HostInputs, starts_type: Any) -> Split:
        """The step's split by position (a step the revision splits so,
        :meth:`~.revisions.Revision.needs_split`; :func:`~.revisions.vllm_split`: from the
        query starts the plan was packed from, ``is_prefilling`` and
        ``seq_lens_cpu_upper_bound``, all host data)."""
        prefilling = getattr(m, "is_prefilling", None)
        upper = getattr(m, "seq_lens_cpu_upper_bound", None)
        if prefilling is None or upper is None:
            raise ValueError(
                "common_attn_metadata: is_prefilling and seq_lens_cpu_upper_bound are needed "
                f"by revision {self.revision.name} for a step without spec rows"
            )
        starts = np.frombuffer(inputs.host[0], starts_type)
        return vllm_split(
            starts,
            m.num_reqs,
            m.num_actual_tokens,
            host_only_array("common_attn_metadata.is_prefilling", prefilling),
            host_only_array("common_attn_metadata.seq_lens_cpu_upper_bound", upper),
        )
