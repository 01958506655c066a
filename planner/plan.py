"""The execution plan: one step, compiled on the host, immutable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import numpy as np

from .batch import StepBatch
from .config import PlannerConfig
from .layout import FIELDS, PlanLayout

if TYPE_CHECKING:
    import networkx as nx


@attrs.frozen
class GraphKey:
    """The CUDA graph a plan replays (which one a step gets: :mod:`.buckets`).

    Attributes:
        kind: ``spec`` or ``decode`` (uniform batches, the seed's graphs) or
            ``mixed`` (any batch in a (tokens, rows) bucket).
        num_tokens: padded token count the graph was captured for.
        num_rows: padded row count.
        num_tiles: padded prefill tile count.
    """

    kind: str
    num_tokens: int
    num_rows: int
    num_tiles: int

    def __str__(self) -> str:
        return (
            f"{self.kind}(tokens={self.num_tokens}, rows={self.num_rows}, tiles={self.num_tiles})"
        )

    def layout(self, num_groups: int) -> PlanLayout:
        """The buffer layout of every plan that replays this graph with ``num_groups``
        layer groups."""
        return PlanLayout(self.num_tokens, self.num_rows, self.num_tiles, num_groups)


@attrs.frozen
class Op:
    """One step of the plan's op graph: a launch or a copy over named buffers.

    ``per_layer`` ops run once for every layer of layer group ``group``.
    """

    name: str
    kernel: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    grid: tuple[int, ...] = ()
    group: int | None = None
    per_layer: bool = False

    def equation(self) -> str:
        """The op as one jaxpr-like line: ``writes = kernel[grid](reads)``."""
        grid = f"[grid={'x'.join(map(str, self.grid))}]" if self.grid else ""
        scope = f"  # every layer of group {self.group}" if self.per_layer else ""
        return f"{', '.join(self.writes)} = {self.kernel}{grid}({', '.join(self.reads)}){scope}"


class _PackedArray:
    """A read-only view of one field of the plan's packed buffer."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, plan: ExecutionPlan | None, owner: type) -> Any:
        if plan is None:
            return self
        return plan.array(self.name)


class PlanCounts:
    """What a plan's counts, config, graph and layout decide: the rules
    :class:`PlanShape` and :class:`ExecutionPlan` share. Each holds the fields these
    read: ``config``, ``graph``, ``layout`` and the rows and tokens per kind."""

    __slots__ = ()

    @property
    def num_rows(self) -> int:
        """Live rows (padding rows excluded)."""
        return self.num_spec_rows + self.num_decode_rows + self.num_prefill_rows

    @property
    def num_tokens(self) -> int:
        """Live tokens."""
        return self.num_spec_decode_tokens + self.num_decode_tokens + self.num_prefill_tokens

    @property
    def query_len_max(self) -> int:
        """``Q``: the longest spec query."""
        return self.config.query_len_max

    @property
    def tile_tokens(self) -> int:
        """Tokens per prefill tile."""
        return self.config.prefill_tile_tokens

    @property
    def num_groups(self) -> int:
        """Layer groups."""
        return self.layout.num_groups

    @property
    def padded_tokens(self) -> int:
        """Token capacity of the plan (the graph's, or the live count when eager)."""
        return self.layout.num_tokens

    @property
    def padded_rows(self) -> int:
        """Row capacity of the plan."""
        return self.layout.num_rows

    @property
    def launch_grids(self) -> tuple[int, int]:
        """``(rows, tiles)``: programs of the row kernel (spec and decode rows; every
        padded row in a graph) and of the prefill-tile kernel; 0 skips a launch."""
        if self.graph:
            return self.layout.num_rows, self.layout.num_tiles
        return self.num_spec_rows + self.num_decode_rows, self.layout.num_tiles


# A NamedTuple, not a frozen attrs class: Planner.pack_host_step makes one per step, where
# its 13 fields cost a third of an attrs instance's. A NamedTuple class takes no other
# base, so its fields are one class and PlanShape adds PlanCounts' rules to them.
class _PlanShapeFields(NamedTuple):
    config: PlannerConfig
    graph: GraphKey | None
    layout: PlanLayout
    num_reqs: int
    num_padded_tokens: int | None
    num_spec_rows: int
    num_decode_rows: int
    num_prefill_rows: int
    num_spec_decode_tokens: int
    num_decode_tokens: int
    num_prefill_tokens: int
    max_prefill_query_len: int
    num_tiles: int


class PlanShape(_PlanShapeFields, PlanCounts):
    """A plan without its arrays: its config, graph, layout and counts.

    What :meth:`~stepplan.planner.Planner.pack_host_step` returns for the bytes it packs, and
    :attr:`ExecutionPlan.shape` of a plan. Fields as :class:`ExecutionPlan`'s, plus its
    batch's ``num_reqs`` (``R``, padding rows included) and ``num_padded_tokens``.
    """

    __slots__ = ()


#: The words of a plan's summary (:func:`plan_summary`), in order: rows per kind, spec and
#: live tokens, the layout's row capacity, then where each field of the packed buffer
#: starts (:data:`~.layout.FIELDS` order) and the buffer's size. A consumer that ships the
#: bytes reads the plan's counts and fields from these words, which the packer writes.
SUMMARY: tuple[str, ...] = (
    "num_spec_rows",
    "num_decode_rows",
    "num_prefill_rows",
    "num_spec_decode_tokens",
    "num_tokens",
    "layout.num_rows",
    *[f"start:{name}" for name, _, _ in FIELDS],
    "layout.size",
)


def plan_summary(shape: PlanShape) -> tuple[int, ...]:
    """The :data:`SUMMARY` words of a plan of this shape (what
    :meth:`~.planner.Planner.pack_host_step` writes into its ``summary``)."""
    return (
        shape.num_spec_rows,
        shape.num_decode_rows,
        shape.num_prefill_rows,
        shape.num_spec_decode_tokens,
        shape.num_tokens,
        shape.layout.num_rows,
        *shape.layout.starts(),
    )


@attrs.frozen(eq=False)
class ExecutionPlan(PlanCounts):
    """Everything the kernels need for one step (SPEC §3), as a value.

    Rows are in group order ``[spec | decode | prefill | padding]``, each group
    in the engine's relative order. Arrays are read-only views into
    :attr:`packed`, padded to the graph's capacity (see
    :mod:`stepplan.planner.layout` for padding values). The live part of a row
    array is ``[:num_rows]``, of a token array ``[:num_tokens]``.

    Attributes:
        batch: the input the plan was compiled from.
        config: the configuration it was compiled with.
        num_spec_rows, num_decode_rows, num_prefill_rows: rows per group.
        num_spec_decode_tokens, num_decode_tokens, num_prefill_tokens: tokens per group
            (vLLM's name for the spec tokens; drafts per request are
            ``config.num_spec_tokens``).
        max_prefill_query_len: longest prefill query (0 without prefills).
        num_tiles: live prefill tiles (of ``config.prefill_tile_tokens`` tokens).
        graph: the CUDA graph to replay, or ``None`` to run eagerly.
        layout: offsets of every array in :attr:`packed`.
        packed: ``[layout.size], int32`` the one buffer the executor uploads.
    """

    batch: StepBatch
    config: PlannerConfig
    num_spec_rows: int
    num_decode_rows: int
    num_prefill_rows: int
    num_spec_decode_tokens: int
    num_decode_tokens: int
    num_prefill_tokens: int
    max_prefill_query_len: int
    num_tiles: int
    graph: GraphKey | None
    layout: PlanLayout
    packed: np.ndarray

    token_map = _PackedArray()  # [T] int32
    row_query_start = _PackedArray()  # [R + 1] int32
    row_token_start = _PackedArray()  # [R] int32
    row_kind = _PackedArray()  # [R] int32
    row_state_offset = _PackedArray()  # [R] int32
    row_reads_state = _PackedArray()  # [R] int32
    row_num_accepted = _PackedArray()  # [R] int32
    row_request = _PackedArray()  # [R] int32
    row_slot = _PackedArray()  # [G, R] int32
    tile_row = _PackedArray()  # [P] int32
    tile_start = _PackedArray()  # [P] int32

    def array(self, name: str) -> np.ndarray:
        """The read-only view of field ``name`` (``row_slot`` comes as ``[G, R]``)."""
        offset, size = self.layout.span(name)
        view = self.packed[offset : offset + size]
        return view.reshape(self.layout.num_groups, -1) if name == "row_slot" else view

    @property
    def shape(self) -> PlanShape:
        """The plan without its arrays."""
        return PlanShape(
            self.config,
            self.graph,
            self.layout,
            self.batch.num_rows,
            self.batch.num_padded_tokens,
            self.num_spec_rows,
            self.num_decode_rows,
            self.num_prefill_rows,
            self.num_spec_decode_tokens,
            self.num_decode_tokens,
            self.num_prefill_tokens,
            self.max_prefill_query_len,
            self.num_tiles,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExecutionPlan):
            return NotImplemented
        return (
            self.graph == other.graph
            and self.layout == other.layout
            and self._counts() == other._counts()
            and np.array_equal(self.packed, other.packed)
        )

    def __hash__(self) -> int:
        return hash((self.graph, self.layout, self._counts(), self.packed.tobytes()))

    def _counts(self) -> tuple[object, ...]:
        return (
            self.config,
            self.num_spec_rows,
            self.num_decode_rows,
            self.num_prefill_rows,
            self.num_spec_decode_tokens,
            self.num_decode_tokens,
            self.num_prefill_tokens,
            self.max_prefill_query_len,
            self.num_tiles,
        )

    @property
    def ops(self) -> tuple[Op, ...]:
        """The op graph in launch order: one upload, then per layer group the
        kernel over spec and decode rows and the kernel over prefill tiles
        (each skipped when the plan can have no such work)."""
        rows, tiles = self.launch_grids
        ops = [Op("upload", "copy_host_to_device", ("plan_host",), ("plan",))]
        for g in range(self.num_groups):
            state = f"conv_state[{g}]"
            reads = ("plan", "x", "weight", "residual", state)
            if rows:
                ops.append(
                    Op(
                        f"rows[{g}]",
                        "short_conv_rows",
                        reads,
                        ("residual", state),
                        (rows,),
                        g,
                        per_layer=True,
                    )
                )
            if tiles:
                ops.append(
                    Op(
                        f"tiles[{g}]",
                        "short_conv_prefill_tiles",
                        reads,
                        ("residual", state),
                        (tiles,),
                        g,
                        per_layer=True,
                    )
                )
        return tuple(ops)

    def op_graph(self) -> nx.DiGraph:
        """The ops and buffers as a bipartite networkx ``DiGraph``.

        Buffer nodes have ``kind="buffer"``, op nodes ``kind="op"``; an edge
        ``buffer -> op`` is a read, ``op -> buffer`` a write.
        """
        import networkx as nx

        graph = nx.DiGraph()
        for op in self.ops:
            graph.add_node(op.name, kind="op", kernel=op.kernel, grid=op.grid, group=op.group)
            for buffer in op.reads:
                graph.add_node(buffer, kind="buffer")
                graph.add_edge(buffer, op.name, access="read")
            for buffer in op.writes:
                graph.add_node(buffer, kind="buffer")
                graph.add_edge(op.name, buffer, access="write")
        return graph

    def describe(self, max_values: int = 8) -> str:
        """The plan as text: counts, graph, every buffer, then the ops as equations."""
        graph = str(self.graph) if self.graph else "eager"
        lines = [
            f"plan {graph}  Q={self.query_len_max}  groups={self.num_groups}",
            f"  rows   spec={self.num_spec_rows} decode={self.num_decode_rows} "
            f"prefill={self.num_prefill_rows} (padded to {self.padded_rows})",
            f"  tokens spec={self.num_spec_decode_tokens} decode={self.num_decode_tokens} "
            f"prefill={self.num_prefill_tokens} (padded to {self.padded_tokens}), "
            f"max prefill query {self.max_prefill_query_len}, tiles {self.num_tiles}"
            f" x {self.tile_tokens}",
            f"  buffer plan: i32[{self.layout.size}] =",
        ]
        for field in self.layout.fields:
            values = self.packed[field.offset : field.offset + field.size]
            shown = " ".join(str(v) for v in values[:max_values])
            more = " ..." if field.size > max_values else ""
            lines.append(
                f"    {field.name:<17} i32[{field.size}] @{field.offset:<6} [{shown}{more}]"
            )
        lines.append("  ops:")
        lines.extend(f"    {op.equation()}" for op in self.ops)
        return "\n".join(lines)
