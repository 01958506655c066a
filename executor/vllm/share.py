"""``StepShare``: one plan per step for the builders of every layer group, never a device read.

The first layer group's build of a step compiles the plan from host data alone
(``query_start_loc_cpu``, ``num_decode_draft_tokens_cpu``, the engine's counts; a step
whose host data equal the last compiled step's reuses its plan), writes it with a
header into a staging entry and launches one kernel (:mod:`.door`) that copies it to
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

from stepplan.planner import ExecutionPlan, Planner, PlannerConfig, layout_capacity

from .bridge import host_only_array, host_step_batch
from .seed import PartKey, seed_counts, shape_keys
from .stage import DeviceBuffer, plan_regions

_CACHE_LIMIT = 4096  # entries of a shape-keyed cache; all are let go past it


class _Plan:
    """A compiled plan and what builds derive from it, each a pure function of the plan:
    its seed shape keys and counts, and per layer group the counts and views a build
    returns (views of the buffer's fixed addresses)."""

    __slots__ = ("counts", "fields", "key", "keys", "plan", "plan_buffer")

    def __init__(
        self,
        key: tuple,
        plan: ExecutionPlan,
        keys: tuple[PartKey, PartKey, PartKey, int],
        plan_buffer: torch.Tensor,
    ) -> None:
        self.key, self.plan, self.keys = key, plan, keys
        self.counts = seed_counts(plan)
        self.plan_buffer = plan_buffer
        self.fields: dict[int, tuple] = {}


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
    for a, b in zip(new, old, strict=True):
        if a is not b and _signature(a) != _signature(b):
            return False
    return True


class _HostInputs:
    """A build's host inputs as numpy (refusing device tensors) and the key they make."""

    __slots__ = ("accepted_device", "accepted_host", "drafts", "key", "query_start")

    def __init__(self, m: Any, accepted: Any, drafts: Any, share: StepShare) -> None:
        rows = m.num_reqs
        self.query_start = share.host_view(0, m.query_start_loc_cpu)
        self.drafts = None if drafts is None else share.host_view(1, drafts)
        self.accepted_device = self.accepted_host = None
        if isinstance(accepted, torch.Tensor) and (accepted.is_cuda or not share.on_cuda):
            self.accepted_device = accepted  # gathered on the device, never read here
        elif accepted is not None:
            counts = host_only_array("num_accepted_tokens", accepted)[:rows]
            self.accepted_host = np.ascontiguousarray(counts, dtype=np.int32)
        self.key = (
            rows,
            m.num_actual_tokens,
            self.query_start[: rows + 1].tobytes(),
            None if self.drafts is None else self.drafts[:rows].tobytes(),
            None if self.accepted_host is None else self.accepted_host.tobytes(),
        )


_HOST_FIELDS = ("common_attn_metadata.query_start_loc_cpu", "num_decode_draft_tokens_cpu")


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
        ring_size: staging entries used in turn: how many steps the host may run ahead
            of the device before a build waits for one to come back.
        direct_launches: launch the kernels past Triton's dispatch where Triton allows
            (:class:`~.door.Launcher`); ``False``: through Triton, every launch.
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
        direct_launches: bool = True,
    ) -> None:
        if num_groups < 1:
            raise ValueError(f"num_groups: must be positive, got {num_groups}")
        self.config, self.device, self.num_groups = config, torch.device(device), num_groups
        self._planner = Planner(config)
        self.on_cuda = self.device.type == "cuda"
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
            ring_size,
            config.query_len_max,
            direct_launches=direct_launches,
        )
        # The last host tensor seen per host field and its numpy view (same memory).
        self._host_views: list[tuple[Any, np.ndarray | None]] = [(None, None), (None, None)]
        self._last_plan: _Plan | None = None
        self._registered: tuple[tuple[int, int], ...] = ()
        self._cache: dict[tuple, Any] = {}  # seed shapes and placeholders, per step shape
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
        return (
            group < len(registered)
            and table.dtype == torch.int32
            and (table.data_ptr(), table.stride(0)) == registered[group]
        )

    def host_view(self, field: int, value: Any) -> np.ndarray:
        """``value`` as numpy (:func:`~.bridge.host_only_array`), the view kept for the
        same tensor as last time: it shares the tensor's memory, so it shows its values."""
        last, view = self._host_views[field]
        if last is value:
            return view
        view = host_only_array(_HOST_FIELDS[field], value)
        self._host_views[field] = (value, view)
        return view

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
        inputs = _HostInputs(m, accepted, drafts, self)
        device_inputs = (m.query_start_loc, m.seq_lens, inputs.accepted_device)
        step = self._step
        if (
            step is not None
            and not step.built >> group & 1
            and self._same(step, inputs.key, device_inputs, step_id)
        ):
            table = m.block_table_tensor
            if not self._gathered(group, table):
                self.buffer.slots(table, group)
            step.built |= 1 << group
            return step
        return self._compile(group, m, inputs, device_inputs, step_id)

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
        self, group: int, m: Any, inputs: _HostInputs, device_inputs: tuple, step_id: Any
    ) -> _Step:
        """Open a new step: compile from host data, stage, launch the opening gather."""
        self._step = None  # a build that fails opens no step
        rows = m.num_reqs
        plan_key = inputs.key[:4]  # the plan does not depend on the accepted counts
        record = self._last_plan
        if record is None or record.key != plan_key:  # the plan: a pure function of these
            batch = host_step_batch(
                inputs.query_start,
                inputs.drafts,
                rows,
                m.num_actual_tokens,
                self._placeholders(rows),
            )
            plan = self._planner.compile(batch)
            keys = self._shape_keys(plan)
            plan_buffer = self.buffer.plan_buffer(plan.packed.shape[0])
            record = self._last_plan = _Plan(plan_key, plan, keys, plan_buffer)
            self.num_compiles += 1
        buffer = self.buffer
        buffer.stage(record.plan, record.keys[3], inputs.accepted_host)
        accepted = inputs.accepted_device
        if inputs.accepted_host is not None:
            accepted = buffer.accepted_view(rows)
        buffer.open(m.block_table_tensor, m.seq_lens, accepted, group)
        self.num_steps += 1
        step = _Step(self.num_steps, record, inputs.key, device_inputs, step_id, group)
        self._step = step
        return step

    def _placeholders(self, rows: int) -> tuple[np.ndarray, ...]:
        """``host_step_batch``'s placeholders for ``rows`` rows (``StepBatch`` copies them)."""
        key = ("placeholders", rows)
        found = self._cache.get(key)
        if found is None:
            found = self._remember(
                key,
                (
                    np.zeros(rows, np.int32),
                    np.zeros((self.num_groups, rows), np.int32),
                    np.ones(rows, np.int32),
                    np.full(rows, -1, np.int32),
                ),
            )
        return found

    def _remember(self, key: tuple, value: Any) -> Any:
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = value
        return value

    def _shape_keys(self, plan: ExecutionPlan) -> tuple[PartKey, PartKey, PartKey, int]:
        """``shape_keys(plan)``; refuses a step beyond the builder's capacity."""
        self._check_capacity(plan)
        keys = shape_keys(plan)
        rows = self.buffer.regions.rows
        if keys[3] > rows:
            raise ValueError(
                f"common_attn_metadata: the step's {keys[3]} rows exceed the builder's "
                f"{rows} (raise max_num_reqs)"
            )
        return keys

    def _check_capacity(self, plan: ExecutionPlan) -> None:
        too_many_tokens = plan.num_tokens > self.buffer.regions.num_tokens
        if plan.packed.size > self.max_plan_layout.size or too_many_tokens:
            raise ValueError(
                f"common_attn_metadata: the step's plan ({plan.layout}) exceeds the builder's "
                f"capacity ({self.max_plan_layout}); raise max_num_tokens"
            )
