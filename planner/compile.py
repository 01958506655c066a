"""``compile_plan``: one step's request set to one execution plan (SPEC §3)."""

from __future__ import annotations

import bisect

import numpy as np

from .batch import DECODE, PADDING, PREFILL, SPEC, StepBatch
from .config import PlannerConfig
from .errors import PlanError
from .layout import FIELDS, PlanLayout
from .plan import ExecutionPlan, GraphKey


def compile_plan(batch: StepBatch, config: PlannerConfig) -> ExecutionPlan:
    """Compile one step into an :class:`ExecutionPlan`. Pure: equal inputs give equal plans.

    Raises :class:`PlanError` where the batch breaks the config's limits
    (drafts beyond ``num_spec_tokens``, accepted counts outside ``1..Q``,
    more live rows than ``max_num_seqs``).
    """
    kinds = batch.kinds
    counts = np.bincount(kinds, minlength=4).tolist()
    _check_limits(batch, config, counts)
    order = np.argsort(kinds, kind="stable")
    num_live = len(kinds) - counts[PADDING]
    order = order[:num_live]
    q = batch.query_lens
    lens = q[order]
    tile = config.prefill_tile_tokens
    first_prefill = counts[SPEC] + counts[DECODE]
    tiles_per_row = (lens[first_prefill:] + (tile - 1)) // tile
    num_tokens = int(lens.sum())
    num_tiles = int(tiles_per_row.sum())
    graph = _choose_graph(batch, config, counts, num_tokens)
    if graph is None:
        layout = PlanLayout(num_tokens, num_live, num_tiles, batch.num_groups)
    else:
        layout = PlanLayout(graph.num_tokens, graph.num_rows, graph.num_tiles, batch.num_groups)
    packed = _pack(batch, config, layout, order, lens, tiles_per_row, first_prefill)
    spec_tokens = int(lens[: counts[SPEC]].sum())
    prefill_lens = lens[first_prefill:]
    return ExecutionPlan(
        batch=batch,
        config=config,
        num_spec_rows=counts[SPEC],
        num_decode_rows=counts[DECODE],
        num_prefill_rows=counts[PREFILL],
        num_spec_tokens=spec_tokens,
        num_decode_tokens=counts[DECODE],
        num_prefill_tokens=num_tokens - spec_tokens - counts[DECODE],
        max_prefill_query_len=int(prefill_lens.max()) if prefill_lens.size else 0,
        num_tiles=num_tiles,
        graph=graph,
        layout=layout,
        packed=packed,
    )


def _check_limits(batch: StepBatch, config: PlannerConfig, counts: list[int]) -> None:
    if counts[SPEC]:
        spec = batch.kinds == SPEC
        drafts, accepted = batch.num_draft_tokens, batch.num_accepted_tokens
        too_many = spec & (drafts > config.num_spec_tokens)
        if too_many.any():
            row = int(np.argmax(too_many))
            raise PlanError(
                "num_draft_tokens",
                row,
                f"{drafts[row]} drafts, num_spec_tokens is {config.num_spec_tokens}",
            )
        bad = spec & ((accepted < 1) | (accepted > config.query_len_max))
        if bad.any():
            row = int(np.argmax(bad))
            raise PlanError(
                "num_accepted_tokens",
                row,
                f"{accepted[row]} is outside 1..Q = 1..{config.query_len_max}",
            )
    num_live = len(batch.kinds) - counts[PADDING]
    if num_live > config.max_num_seqs:
        row = int(np.flatnonzero(batch.kinds != PADDING)[config.max_num_seqs])
        raise PlanError(
            "query_lens", row, f"{num_live} live rows exceed max_num_seqs = {config.max_num_seqs}"
        )


def _smallest_fitting(sizes: tuple[int, ...], need: int) -> int | None:
    index = bisect.bisect_left(sizes, need)
    return sizes[index] if index < len(sizes) else None


def _choose_graph(
    batch: StepBatch, config: PlannerConfig, counts: list[int], num_tokens: int
) -> GraphKey | None:
    """The smallest bucket that fits, or ``None`` (eager) where none does."""
    num_live = counts[SPEC] + counts[DECODE] + counts[PREFILL]
    if config.graph_mode == "none" or num_live == 0:
        return None
    sizes = config.sizes
    row_sizes = sizes[: bisect.bisect_right(sizes, config.max_num_seqs)]
    need_tokens = max(num_tokens, batch.num_padded_tokens or 0)
    uniform = counts[SPEC] == num_live or counts[DECODE] == num_live
    if uniform:
        per_row = config.query_len_max if counts[SPEC] else 1
        rows = _smallest_fitting(row_sizes, max(num_live, -(-need_tokens // per_row)))
        if rows is not None:
            kind = "spec" if counts[SPEC] else "decode"
            return GraphKey(kind, rows * per_row, rows, 0)
    if config.graph_mode != "mixed":
        return None
    tokens = _smallest_fitting(sizes, need_tokens)
    rows = _smallest_fitting(row_sizes, num_live)
    if tokens is None or rows is None:
        return None
    tiles = min(rows, tokens // 2) + tokens // config.prefill_tile_tokens
    return GraphKey("mixed", tokens, rows, tiles)


def _pack(
    batch: StepBatch,
    config: PlannerConfig,
    layout: PlanLayout,
    order: np.ndarray,
    lens: np.ndarray,
    tiles_per_row: np.ndarray,
    first_prefill: int,
) -> np.ndarray:
    """Write every plan array, padding included, into one int32 buffer."""
    packed = np.empty(layout.size, dtype=np.int32)
    views, offset = [], 0
    for size in layout.sizes():
        views.append(packed[offset : offset + size])
        offset += size
    (
        token_map,
        query_start,
        token_start,
        kind,
        state_offset,
        reads_state,
        accepted,
        request,
        slot,
        tile_row,
        tile_start,
    ) = views
    live, num_tokens = len(order), int(lens.sum())

    query_start[0] = 0
    np.cumsum(lens, out=query_start[1 : live + 1])
    query_start[live + 1 :] = num_tokens
    engine_start = np.cumsum(batch.query_lens) - batch.query_lens
    token_start[:live] = engine_start[order]
    token_map[:num_tokens] = np.repeat(token_start[:live] - query_start[:live], lens)
    token_map[:num_tokens] += np.arange(num_tokens, dtype=np.int32)

    kind[:live] = batch.kinds[order]
    is_spec = kind[:live] == SPEC
    accepted[:live] = np.where(is_spec, batch.num_accepted_tokens[order], 1)
    state_offset[:live] = accepted[:live] - 1
    reads_state[:live] = is_spec | (batch.num_computed_tokens[order] > 0)
    request[:live] = order
    slot.reshape(layout.num_groups, -1)[:, :live] = batch.slots[:, order]

    num_tiles = int(tiles_per_row.sum())
    prefill_rows = np.arange(first_prefill, live, dtype=np.int32)
    tile_row[:num_tiles] = np.repeat(prefill_rows, tiles_per_row)
    first_tile = np.cumsum(tiles_per_row) - tiles_per_row
    tile_index = np.arange(num_tiles, dtype=np.int32) - np.repeat(first_tile, tiles_per_row)
    tile_start[:num_tiles] = tile_index * config.prefill_tile_tokens

    _fill_padding(views, live, num_tokens, num_tiles, layout)
    packed.flags.writeable = False
    return packed


def _fill_padding(
    views: list[np.ndarray], live: int, num_tokens: int, num_tiles: int, layout: PlanLayout
) -> None:
    """Give every slot past the live part its field's padding value (see ``FIELDS``)."""
    first_padded = {"T": num_tokens, "R": live, "P": num_tiles}
    for view, (name, size_name, pad) in zip(views, FIELDS, strict=True):
        if size_name in first_padded:
            view[first_padded[size_name] :] = pad
        elif name == "row_slot":
            view.reshape(layout.num_groups, -1)[:, live:] = pad
