"""``compile_plan``: one step's request set to one execution plan (SPEC §3)."""

from __future__ import annotations

import numpy as np

from .batch import DECODE, PADDING, PREFILL, SPEC, StepBatch
from .config import PlannerConfig
from .errors import PlanError
from .layout import FIELDS, PAD_VALUES, PlanLayout
from .plan import ExecutionPlan, GraphKey

# The fields of size R (padded together).
_ROW_FIELDS = tuple(index for index, (_, size, _) in enumerate(FIELDS) if size == "R")
_LOOP_TILES_UP_TO_ROWS = 8


def compile_plan(batch: StepBatch, config: PlannerConfig) -> ExecutionPlan:
    """Compile one step into an :class:`ExecutionPlan`. Pure: equal inputs give equal plans.

    Raises :class:`PlanError` where the batch breaks the config's limits
    (drafts beyond ``num_spec_tokens``, accepted counts outside ``1..Q``,
    more live rows than ``max_num_seqs``).
    """
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    _check_limits(batch, config)
    live = num_spec + num_decode + num_prefill
    order = _group_order(batch)
    lens = batch.query_lens[order]
    tile = config.prefill_tile_tokens
    tiles_per_row = (lens[num_spec + num_decode :] + (tile - 1)) // tile if num_prefill else None
    num_tiles = int(tiles_per_row.sum()) if num_prefill else 0
    num_tokens = int(np.add.reduce(lens))
    graph = _choose_graph(batch, config, num_tokens)
    if graph is None:
        layout = PlanLayout(num_tokens, live, num_tiles, batch.num_groups)
    else:
        layout = PlanLayout(graph.num_tokens, graph.num_rows, graph.num_tiles, batch.num_groups)
    packer = _Packer(batch, order, lens, num_tokens, config.query_len_max)
    packed = packer.pack(layout, tiles_per_row, num_tiles, tile)
    spec_tokens = int(packed[layout.num_tokens + num_spec])  # row_query_start[num_spec]
    prefill_tokens = num_tokens - spec_tokens - num_decode
    return ExecutionPlan(
        batch=batch,
        config=config,
        num_spec_rows=num_spec,
        num_decode_rows=num_decode,
        num_prefill_rows=num_prefill,
        num_spec_tokens=spec_tokens,
        num_decode_tokens=num_decode,
        num_prefill_tokens=prefill_tokens,
        max_prefill_query_len=int(lens[num_spec + num_decode :].max()) if num_prefill else 0,
        num_tiles=num_tiles,
        graph=graph,
        layout=layout,
        packed=packed,
    )


def _group_order(batch: StepBatch) -> np.ndarray | slice:
    """Engine rows in group order, padding rows dropped.

    A slice for uniform batches without padding rows (the engine's order is
    the group order then), so that every gather below is a free view.
    """
    num_spec, num_decode, num_prefill, num_padding = batch.kind_counts
    rows = batch.num_rows
    if num_spec == rows or num_decode == rows or num_prefill == rows:
        return slice(0, rows)
    return np.argsort(batch.kinds, kind="stable")[: rows - num_padding]


def _check_limits(batch: StepBatch, config: PlannerConfig) -> None:
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    if num_spec:
        drafts = batch.num_draft_tokens
        if np.maximum.reduce(drafts) > config.num_spec_tokens:
            row = int(np.argmax(drafts))
            raise PlanError(
                "num_draft_tokens",
                row,
                f"{drafts[row]} drafts, num_spec_tokens is {config.num_spec_tokens}",
            )
    live = num_spec + num_decode + num_prefill
    if live > config.max_num_seqs:
        row = int(np.flatnonzero(batch.kinds != PADDING)[config.max_num_seqs])
        raise PlanError(
            "query_lens", row, f"{live} live rows exceed max_num_seqs = {config.max_num_seqs}"
        )


def _choose_graph(batch: StepBatch, config: PlannerConfig, num_tokens: int) -> GraphKey | None:
    """The smallest bucket that fits, or ``None`` (eager) where none does."""
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    live = num_spec + num_decode + num_prefill
    if config.graph_mode == "none" or live == 0:
        return None
    need_tokens = max(num_tokens, batch.num_padded_tokens or 0)
    if num_spec == live or num_decode == live:
        per_row = config.query_len_max if num_spec else 1
        rows = config.smallest_size(max(live, -(-need_tokens // per_row)), rows=True)
        if rows is not None:
            return GraphKey("spec" if num_spec else "decode", rows * per_row, rows, 0)
    if config.graph_mode != "mixed":
        return None
    tokens = config.smallest_size(need_tokens)
    rows = config.smallest_size(live, rows=True)
    if tokens is None or rows is None:
        return None
    return GraphKey("mixed", tokens, rows, _tile_capacity(tokens, rows, config))


def _tile_capacity(tokens: int, rows: int, config: PlannerConfig) -> int:
    """Prefill tiles any batch of a mixed bucket can need.

    Prefill rows have q >= 2, so a bucket holds at most ``min(rows, tokens / 2)``
    of them, and ``sum(ceil(q / tile)) <= prefill rows + tokens / tile``.
    """
    return min(rows, tokens // 2) + tokens // config.prefill_tile_tokens


def layout_capacity(
    config: PlannerConfig, num_tokens: int, num_rows: int, num_groups: int
) -> PlanLayout:
    """A layout at least as large, field by field, as that of any plan (graph or
    eager) of at most ``num_tokens`` tokens and ``num_rows`` live rows."""
    return PlanLayout(
        num_tokens, num_rows, _tile_capacity(num_tokens, num_rows, config), num_groups
    )


def largest_graph_layout(config: PlannerConfig, num_groups: int) -> PlanLayout | None:
    """A layout at least as large, field by field, as that of any graph plan of ``config``.

    What an executor sizes its persistent plan buffer by; ``None`` when the
    config captures no graphs.
    """
    sizes, rows = config.sizes, config.row_sizes
    if config.graph_mode == "none" or not rows:
        return None
    spec_tokens = rows[-1] * config.query_len_max
    if config.graph_mode == "full":
        return PlanLayout(spec_tokens, rows[-1], 0, num_groups)
    return layout_capacity(config, max(spec_tokens, sizes[-1]), rows[-1], num_groups)


class _Packer:
    """Writes one plan's arrays into a fresh int32 buffer; used once, inside compile_plan.

    Rows arrive in group order, so each group is a contiguous range and most
    fields are filled per range instead of gathered per row; entries past the
    live part get their field's padding value (``layout.FIELDS``).
    """

    def __init__(
        self,
        batch: StepBatch,
        order: np.ndarray | slice,
        lens: np.ndarray,
        num_tokens: int,
        query_len_max: int,
    ) -> None:
        self.batch, self.order, self.lens = batch, order, lens
        self.live, self.num_tokens, self.query_len_max = len(lens), num_tokens, query_len_max

    def pack(
        self, layout: PlanLayout, tiles_per_row: np.ndarray | None, num_tiles: int, tile: int
    ) -> np.ndarray:
        sizes = layout.sizes()
        packed = np.empty(layout.size, dtype=np.int32)
        views, offset = [], 0
        for size in sizes:
            views.append(packed[offset : offset + size])
            offset += size
        self._tokens(*views[:3], views[7])
        self._rows(*views[3:7])
        self._slots(views[8].reshape(layout.num_groups, -1))
        if tiles_per_row is not None:
            self._tiles(tiles_per_row, num_tiles, tile, *views[9:])
        self._pad(views, layout, num_tiles)
        packed.flags.writeable = False
        return packed

    def _pad(self, views: list[np.ndarray], layout: PlanLayout, num_tiles: int) -> None:
        """Give the entries past the live part their fields' padding values."""
        live, tokens = self.live, self.num_tokens
        if tokens < layout.num_tokens:
            views[0][tokens:] = PAD_VALUES[0]
        if live < layout.num_rows:  # row_query_start is padded in _tokens
            for index in _ROW_FIELDS:
                views[index][live:] = PAD_VALUES[index]
            views[8].reshape(layout.num_groups, -1)[:, live:] = PAD_VALUES[8]
        if num_tiles < layout.num_tiles:
            views[9][num_tiles:] = PAD_VALUES[9]
            views[10][num_tiles:] = PAD_VALUES[10]

    def _slots(self, slots: np.ndarray) -> None:
        """``slots``: ``[G, R]`` view of the buffer."""
        order, live = self.order, self.live
        if isinstance(order, slice):
            slots[:, :live] = self.batch.slots[:, order]
        else:
            np.take(self.batch.slots, order, axis=1, out=slots[:, :live])

    def _tokens(self, token_map: np.ndarray, query_start: np.ndarray, token_start: np.ndarray,
                request: np.ndarray) -> None:  # fmt: skip
        """The token permutation and where each row's tokens sit, logically and in the engine."""
        order, live, tokens = self.order, self.live, self.num_tokens
        query_start[0] = 0
        np.add.accumulate(self.lens, out=query_start[1 : live + 1])
        query_start[live + 1 :] = tokens
        if isinstance(order, slice):  # already in group order: identity permutation
            token_start[:live] = query_start[:live]
            token_map[:tokens] = np.arange(tokens, dtype=np.int32)
            request[:live] = np.arange(live, dtype=np.int32)
        else:
            engine_start = np.zeros(self.batch.num_rows + 1, dtype=np.int32)
            np.add.accumulate(self.batch.query_lens, out=engine_start[1:])
            token_start[:live] = engine_start[order]
            token_map[:tokens] = np.repeat(token_start[:live] - query_start[:live], self.lens)
            token_map[:tokens] += np.arange(tokens, dtype=np.int32)
            request[:live] = order

    def _rows(self, kind: np.ndarray, state_offset: np.ndarray, reads_state: np.ndarray,
              accepted: np.ndarray) -> None:  # fmt: skip
        """Per-row kind, state offset, has-state flag and accepted count, group by group."""
        batch, order, live = self.batch, self.order, self.live
        spec, decode, _, _ = batch.kind_counts
        kind[:spec] = SPEC
        kind[spec : spec + decode] = DECODE
        kind[spec + decode : live] = PREFILL
        accepted[spec:] = 1  # non-spec rows; also the padding value
        state_offset[spec:] = 0
        if spec:
            accepted[:spec] = batch.num_accepted_tokens[order][:spec]
            np.subtract(accepted[:spec], 1, out=state_offset[:spec])
            # One unsigned compare tests 1 <= accepted <= Q (accepted - 1 wraps below 1).
            if np.count_nonzero(state_offset[:spec].view(np.uint32) >= self.query_len_max):
                self._raise_accepted()
            reads_state[:spec] = 1
        if spec < live:
            computed = batch.num_computed_tokens[order][spec:]
            np.greater(computed, 0, out=reads_state[spec:live], casting="unsafe")

    def _raise_accepted(self) -> None:
        accepted, q_max = self.batch.num_accepted_tokens, self.query_len_max
        bad = (self.batch.kinds == SPEC) & ((accepted < 1) | (accepted > q_max))
        row = int(np.argmax(bad))
        raise PlanError("num_accepted_tokens", row, f"{accepted[row]} is outside 1..Q = 1..{q_max}")

    def _tiles(self, tiles_per_row: np.ndarray, num_tiles: int, tile: int, tile_row: np.ndarray,
               tile_start: np.ndarray) -> None:  # fmt: skip
        """Prefill work tiles: which row each covers and its first token.

        Steps rarely carry more than a few prefill rows; a plain loop over them
        costs a third of the six numpy calls it would take, so the vectorized
        form is kept for many rows only.
        """
        first_prefill = self.live - len(tiles_per_row)
        if len(tiles_per_row) <= _LOOP_TILES_UP_TO_ROWS:
            rows: list[int] = []
            starts: list[int] = []
            for row, count in enumerate(tiles_per_row.tolist(), first_prefill):
                rows += [row] * count
                starts += range(0, count * tile, tile)
            tile_row[:num_tiles] = rows
            tile_start[:num_tiles] = starts
            return
        prefill_rows = np.arange(first_prefill, self.live, dtype=np.int32)
        tile_row[:num_tiles] = np.repeat(prefill_rows, tiles_per_row)
        first_tile = np.add.accumulate(tiles_per_row) - tiles_per_row
        tile_index = np.arange(num_tiles, dtype=np.int32) - np.repeat(first_tile, tiles_per_row)
        tile_start[:num_tiles] = tile_index * tile
