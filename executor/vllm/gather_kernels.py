"""The device half of the drop-in builder: one launch per step, no host read-back.

The host writes a step into a staging entry (pinned memory on a CUDA device): a header
that says where everything lies, and the plan. :func:`_open_step` is one kernel, one
program, that

1. copies the entry's header, plan and accepted counts (where the host gave them) into
   the builder's persistent device buffer;
2. gathers, through the plan's index maps, what only the device knows: every row's slot
   from the block table (the building group's, and those of the groups the engine
   registered, :class:`~.step_share.StepShare`), a spec row's accepted count, a decode or
   prefill row's computed tokens ``seq_lens - query_lens`` and so its has-initial-state
   flag; it writes them into the plan (``row_slot``, ``row_num_accepted``,
   ``row_state_offset``, ``row_reads_state``) and into the seed's row sources
   (:data:`~.metadata_fields.ROW_SOURCES`);
3. derives the plan sources (:data:`~.metadata_fields.PLAN_SOURCES`: query starts per
   group, the spec mask by engine row, the token lists as int64) from the plan it copied;
4. in a step split by position (vLLM 0.33 without spec rows: the header's split word is
   vLLM's decode rows, else -1), fills the engine-ordered sources
   (:data:`~.metadata_fields.ENGINE_SOURCES` and the ``engine`` slots) from the engine's
   own query starts, ``seq_lens`` and block tables;
5. hands the entry's ticket back (:class:`~stepplan.executor.upload.StagingRing`).

A further layer group whose slots were not gathered so runs :func:`_group_slots`. The
kernels take no per-step integers (the header has them), so each compiles once.
:mod:`.gather_reference` does the same in torch operations: the CPU builder's device half, and
the specification the kernels are tested against. :mod:`.kernel_launcher` launches the kernels.
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from stepplan.planner import SUMMARY

# Header words (int32). Per step: the plan's summary, which the planner's packer writes
# (stepplan.planner.SUMMARY: its counts, and where each plan field starts relative to the
# plan), then what the builder writes. Fixed for the buffer's life: where the plan and the
# sources lie (int32 words, except where a comment says bytes or int64).
_SPEC_ROWS = tl.constexpr(SUMMARY.index("num_spec_rows"))  # group order: the first rows
_DECODE_ROWS = tl.constexpr(SUMMARY.index("num_decode_rows"))
_PREFILL_ROWS = tl.constexpr(SUMMARY.index("num_prefill_rows"))
_SPEC_TOKENS = tl.constexpr(SUMMARY.index("num_spec_decode_tokens"))
_TOKENS = tl.constexpr(SUMMARY.index("num_tokens"))  # live tokens
_ROWS = tl.constexpr(SUMMARY.index("layout.num_rows"))  # R: the plan's row capacity
_SIZE = tl.constexpr(SUMMARY.index("layout.size"))  # the plan's words


def _start(field: str) -> tl.constexpr:
    return tl.constexpr(SUMMARY.index(f"start:{field}"))


_TOKEN_MAP = _start("token_map")
_QUERY_START = _start("row_query_start")
_KIND = _start("row_kind")
_STATE_OFFSET = _start("row_state_offset")
_READS_STATE = _start("row_reads_state")
_ACCEPTED = _start("row_num_accepted")
_REQUEST = _start("row_request")
_SLOT = _start("row_slot")  # group 0's (group g: + g * R)
_GATHER = tl.constexpr(len(SUMMARY))  # N >= R: group-ordered rows the row sources cover
_ENGINE_ROWS = tl.constexpr(_GATHER.value + 1)  # the engine's rows (the spec mask's length)
_REGISTERED = tl.constexpr(_GATHER.value + 2)  # block tables the engine registered (0: none)
_ACCEPTED_ROWS = tl.constexpr(_GATHER.value + 3)  # accepted counts given on the host (0: none)
# vLLM's decode rows of a step split by position (its first prefill row); -1: not split.
_SPLIT = tl.constexpr(_GATHER.value + 4)
_PLAN_AT = tl.constexpr(_GATHER.value + 5)  # where the plan lies (entry and buffer alike)
_ACCEPTED_HOST_AT = tl.constexpr(_GATHER.value + 6)  # where the host's accepted counts lie
# The row sources' capacity: words between two slot sources.
_STRIDE = tl.constexpr(_GATHER.value + 7)
# Group g's spec, plain, prefill, engine, engine-from-the-split slots: + (5 g + 0..4) stride.
_SLOTS_AT = tl.constexpr(_STRIDE.value + 1)
_SLOT_SOURCES = tl.constexpr(5)
_ACCEPTED_AT = tl.constexpr(_STRIDE.value + 2)
_HAS_PLAIN_AT = tl.constexpr(_STRIDE.value + 3)  # bytes
_HAS_PREFILL_AT = tl.constexpr(_STRIDE.value + 4)  # bytes
_COMPUTED_PREFILL_AT = tl.constexpr(_STRIDE.value + 5)
_SPEC_QSL_AT = tl.constexpr(_STRIDE.value + 6)
_NON_SPEC_QSL_AT = tl.constexpr(_STRIDE.value + 7)
_QSL_P_AT = tl.constexpr(_STRIDE.value + 8)
_MASKS_AT = tl.constexpr(_STRIDE.value + 9)  # bytes
_SPEC_TOKENS_AT = tl.constexpr(_STRIDE.value + 10)  # int64 elements
_PLAIN_TOKENS_AT = tl.constexpr(_STRIDE.value + 11)  # int64 elements
# int64 elements: the registered tables' addresses, then their row strides.
_TABLES = tl.constexpr(_STRIDE.value + 12)
_ENGINE_HAS_AT = tl.constexpr(_STRIDE.value + 13)  # bytes
_ENGINE_HAS_P_AT = tl.constexpr(_STRIDE.value + 14)  # bytes
_ENGINE_QLEN_AT = tl.constexpr(_STRIDE.value + 15)
_ENGINE_QSL_AT = tl.constexpr(_STRIDE.value + 16)
_ENGINE_QSL_P_AT = tl.constexpr(_STRIDE.value + 17)
_TICKET = tl.constexpr(48)  # the entry's ticket (StagingRing.stamp)

#: Header word positions by name, for the host (and the reference).
HEADER = {
    name.lower(): value.value
    for name, value in dict(
        SPEC_ROWS=_SPEC_ROWS, DECODE_ROWS=_DECODE_ROWS, PREFILL_ROWS=_PREFILL_ROWS,
        SPEC_TOKENS=_SPEC_TOKENS, TOKENS=_TOKENS, ROWS=_ROWS, SIZE=_SIZE,
        TOKEN_MAP=_TOKEN_MAP, QUERY_START=_QUERY_START, KIND=_KIND,
        STATE_OFFSET=_STATE_OFFSET, READS_STATE=_READS_STATE, ACCEPTED=_ACCEPTED,
        REQUEST=_REQUEST, SLOT=_SLOT, GATHER=_GATHER, ENGINE_ROWS=_ENGINE_ROWS,
        REGISTERED=_REGISTERED, ACCEPTED_ROWS=_ACCEPTED_ROWS, SPLIT=_SPLIT, PLAN_AT=_PLAN_AT,
        ACCEPTED_HOST_AT=_ACCEPTED_HOST_AT, STRIDE=_STRIDE, SLOTS_AT=_SLOTS_AT,
        ACCEPTED_AT=_ACCEPTED_AT, HAS_PLAIN_AT=_HAS_PLAIN_AT, HAS_PREFILL_AT=_HAS_PREFILL_AT,
        COMPUTED_PREFILL_AT=_COMPUTED_PREFILL_AT, SPEC_QSL_AT=_SPEC_QSL_AT,
        NON_SPEC_QSL_AT=_NON_SPEC_QSL_AT, QSL_P_AT=_QSL_P_AT, MASKS_AT=_MASKS_AT,
        SPEC_TOKENS_AT=_SPEC_TOKENS_AT, PLAIN_TOKENS_AT=_PLAIN_TOKENS_AT, TABLES=_TABLES,
        ENGINE_HAS_AT=_ENGINE_HAS_AT, ENGINE_HAS_P_AT=_ENGINE_HAS_P_AT,
        ENGINE_QLEN_AT=_ENGINE_QLEN_AT, ENGINE_QSL_AT=_ENGINE_QSL_AT,
        ENGINE_QSL_P_AT=_ENGINE_QSL_P_AT,
    ).items()
}  # fmt: skip
#: The summary's words (the packer writes them), then the builder's per step words.
SUMMARY_WORDS = len(SUMMARY)
STEP_WORDS = _PLAN_AT.value - _GATHER.value
TICKET_WORD = _TICKET.value
#: Slot sources per layer group (the spec, plain, prefill, engine and engine-from-the-split
#: slots of :data:`~.metadata_fields.SLOT_SOURCES`).
SLOT_SOURCES_PER_GROUP = _SLOT_SOURCES.value
#: Words before the first region: the header, the ticket, room to grow.
HEADER_WORDS = 64
#: Words (or rows) one pass of a kernel covers.
_BLOCK = 1024


#: The header words that hold a plan field's start (relative to the plan).
_PLAN_FIELDS = tuple(
    name
    for name, word in HEADER.items()
    if word < SUMMARY_WORDS and SUMMARY[word].startswith("start:")
)


def header_values(words: np.ndarray) -> dict[str, int]:
    """What the kernels read from a header (``words``, the buffer's first words), by
    name: the header's words, and what they derive (``first_prefill``, ``live_rows``, the
    plan fields as buffer offsets)."""
    at = {name: int(words[word]) for name, word in HEADER.items()}
    first_prefill = at["spec_rows"] + at["decode_rows"]
    at["first_prefill"], at["live_rows"] = first_prefill, first_prefill + at["prefill_rows"]
    for field in _PLAN_FIELDS:
        at[field] += at["plan_at"]
    return at


@triton.jit
def _load(words_ptr, word):
    return tl.load(words_ptr + word)


@triton.jit
def _field(words_ptr, start_word):
    """Where a plan field lies in the buffer: the plan's place plus the field's start."""
    return tl.load(words_ptr + _PLAN_AT) + tl.load(words_ptr + start_word)


@triton.jit
def _first_prefill(words_ptr):
    return tl.load(words_ptr + _SPEC_ROWS) + tl.load(words_ptr + _DECODE_ROWS)


@triton.jit
def _copy(entry_ptr, words_ptr, start, stop, BLOCK: tl.constexpr):
    """``words[start:stop] = entry[start:stop]``."""
    for first in range(start, stop, BLOCK):
        at = first + tl.arange(0, BLOCK)
        tl.store(words_ptr + at, tl.load(entry_ptr + at, mask=at < stop), mask=at < stop)


@triton.jit
def _gather_slots(words_ptr, table_ptr, table_stride, group, BLOCK: tl.constexpr):
    """Rows ``0 .. N`` in group order: slot = block table column 0 of the row's request
    (NULL on padding rows), into the plan's row_slot and group ``group``'s slot sources;
    in a step split by position also every engine row's, in engine order."""
    rows, gather = _load(words_ptr, _ROWS), _load(words_ptr, _GATHER)
    spec_rows, first_prefill = _load(words_ptr, _SPEC_ROWS), _first_prefill(words_ptr)
    stride = _load(words_ptr, _STRIDE)
    spec_at = _load(words_ptr, _SLOTS_AT) + _SLOT_SOURCES * group * stride
    plan_at = _field(words_ptr, _SLOT) + group * rows
    request_at = _field(words_ptr, _REQUEST)
    for first in range(0, gather, BLOCK):
        r = first + tl.arange(0, BLOCK)
        request = tl.load(words_ptr + request_at + r, mask=r < rows, other=-1)
        row = request.to(tl.int64)
        slot = tl.load(table_ptr + row * table_stride, mask=request >= 0, other=0).to(tl.int32)
        tl.store(words_ptr + plan_at + r, slot, mask=r < rows)
        inside = r < gather
        tl.store(words_ptr + spec_at + r, slot, mask=inside)
        tl.store(words_ptr + spec_at + stride + r - spec_rows, slot, mask=inside & (r >= spec_rows))
        prefill = inside & (r >= first_prefill)
        tl.store(words_ptr + spec_at + 2 * stride + r - first_prefill, slot, mask=prefill)
    split = _load(words_ptr, _SPLIT)
    engine_rows = tl.where(split >= 0, _load(words_ptr, _ENGINE_ROWS), 0)
    engine_at = spec_at + 3 * stride
    for first in range(0, engine_rows, BLOCK):
        e = first + tl.arange(0, BLOCK)
        inside = e < engine_rows
        slot = tl.load(table_ptr + e.to(tl.int64) * table_stride, mask=inside, other=0)
        tl.store(words_ptr + engine_at + e, slot.to(tl.int32), mask=inside)
        after = inside & (e >= split)
        tl.store(words_ptr + engine_at + stride + e - split, slot.to(tl.int32), mask=after)


@triton.jit
def _gather_rows(
    words_ptr,
    bytes_ptr,
    seq_lens_ptr,
    accepted_ptr,
    HAS_ACCEPTED: tl.constexpr,
    QUERY_LEN_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Rows ``0 .. N``: accepted counts of spec rows, computed tokens of the others, and the
    plan fields that follow (state offsets clamped to ``0 .. Q - 1``)."""
    rows, gather = _load(words_ptr, _ROWS), _load(words_ptr, _GATHER)
    spec_rows, first_prefill = _load(words_ptr, _SPEC_ROWS), _first_prefill(words_ptr)
    for first in range(0, gather, BLOCK):
        r = first + tl.arange(0, BLOCK)
        in_plan = r < rows
        request = tl.load(words_ptr + _field(words_ptr, _REQUEST) + r, mask=in_plan, other=-1)
        row = request.to(tl.int64)
        kind = tl.load(words_ptr + _field(words_ptr, _KIND) + r, mask=in_plan, other=3)
        starts = words_ptr + _field(words_ptr, _QUERY_START) + r
        query_len = tl.load(starts + 1, mask=in_plan, other=0) - tl.load(
            starts, mask=in_plan, other=0
        )
        spec = (request >= 0) & (kind == 0)
        plain = (request >= 0) & ((kind == 1) | (kind == 2))
        accepted = tl.full([BLOCK], 1, tl.int32)
        if HAS_ACCEPTED:
            accepted = tl.load(accepted_ptr + row, mask=spec, other=1).to(tl.int32)
        seq_len = tl.load(seq_lens_ptr + row, mask=plain, other=0).to(tl.int32)
        computed = tl.where(plain, seq_len - query_len, 0)
        has_initial = computed > 0
        offset = tl.where(spec, tl.minimum(tl.maximum(accepted - 1, 0), QUERY_LEN_MAX - 1), 0)
        reads = tl.where(spec, 1, has_initial.to(tl.int32))
        tl.store(words_ptr + _field(words_ptr, _STATE_OFFSET) + r, offset, mask=in_plan)
        tl.store(words_ptr + _field(words_ptr, _READS_STATE) + r, reads, mask=in_plan)
        tl.store(words_ptr + _field(words_ptr, _ACCEPTED) + r, accepted, mask=in_plan)
        inside = r < gather
        tl.store(words_ptr + _load(words_ptr, _ACCEPTED_AT) + r, accepted, mask=inside)
        flags = has_initial.to(tl.uint8)
        plain_at = _load(words_ptr, _HAS_PLAIN_AT) + r - spec_rows
        tl.store(bytes_ptr + plain_at, flags, mask=inside & (r >= spec_rows))
        prefill = inside & (r >= first_prefill)
        tl.store(
            bytes_ptr + _load(words_ptr, _HAS_PREFILL_AT) + r - first_prefill, flags, mask=prefill
        )
        computed_at = _load(words_ptr, _COMPUTED_PREFILL_AT) + r - first_prefill
        tl.store(words_ptr + computed_at, computed, mask=prefill)


@triton.jit
def _gather_engine_rows(words_ptr, bytes_ptr, query_start_ptr, seq_lens_ptr, BLOCK: tl.constexpr):
    """In a step split by position: per engine row its has-initial-state flag
    (``seq_lens - query_lens > 0``), query length and query start, and from the split on
    the flags and the starts shifted to begin at 0."""
    split = _load(words_ptr, _SPLIT)
    rows = tl.where(split >= 0, _load(words_ptr, _ENGINE_ROWS), -1)
    base = tl.load(query_start_ptr + tl.maximum(split, 0), mask=split >= 0, other=0).to(tl.int32)
    for first in range(0, rows + 1, BLOCK):
        e = first + tl.arange(0, BLOCK)
        row = e < rows
        start = tl.load(query_start_ptr + e, mask=e <= rows, other=0).to(tl.int32)
        stop = tl.load(query_start_ptr + e + 1, mask=row, other=0).to(tl.int32)
        length = stop - start
        seq_len = tl.load(seq_lens_ptr + e, mask=row, other=0).to(tl.int32)
        flags = (seq_len - length > 0).to(tl.uint8)
        after = e >= split
        tl.store(bytes_ptr + _load(words_ptr, _ENGINE_HAS_AT) + e, flags, mask=row)
        has_p = bytes_ptr + _load(words_ptr, _ENGINE_HAS_P_AT) + e - split
        tl.store(has_p, flags, mask=row & after)
        tl.store(words_ptr + _load(words_ptr, _ENGINE_QLEN_AT) + e, length, mask=row)
        tl.store(words_ptr + _load(words_ptr, _ENGINE_QSL_AT) + e, start, mask=e <= rows)
        qsl_p = words_ptr + _load(words_ptr, _ENGINE_QSL_P_AT) + e - split
        tl.store(qsl_p, start - base, mask=(e <= rows) & after)


@triton.jit
def _shifted_starts(words_ptr, starts_ptr, first, count, target_at, BLOCK: tl.constexpr):
    """``target[i] = starts[first + i] - starts[first]`` for ``i < count``."""
    base = tl.load(starts_ptr + first)
    for done in range(0, count, BLOCK):
        i = done + tl.arange(0, BLOCK)
        values = tl.load(starts_ptr + first + i, mask=i < count, other=0) - base
        tl.store(words_ptr + target_at + i, values, mask=i < count)


@triton.jit
def _copy_tokens(words_ptr, longs_ptr, first, count, target_at, BLOCK: tl.constexpr):
    """``target[i] = token_map[first + i]`` as int64, for ``i < count``."""
    token_map = words_ptr + _field(words_ptr, _TOKEN_MAP) + first
    for done in range(0, count, BLOCK):
        i = done + tl.arange(0, BLOCK)
        tokens = tl.load(token_map + i, mask=i < count, other=0).to(tl.int64)
        tl.store(longs_ptr + target_at + i, tokens, mask=i < count)


@triton.jit
def _derive_plan_sources(words_ptr, bytes_ptr, longs_ptr, BLOCK: tl.constexpr):
    """The plan sources from the plan in the buffer; the spec mask cleared (its spec rows
    are marked after the next barrier)."""
    starts_ptr = words_ptr + _field(words_ptr, _QUERY_START)
    spec_rows, first_prefill = _load(words_ptr, _SPEC_ROWS), _first_prefill(words_ptr)
    live = first_prefill + _load(words_ptr, _PREFILL_ROWS)
    count = _load(words_ptr, _GATHER) + 1
    spec_at = _load(words_ptr, _SPEC_QSL_AT)
    for done in range(0, count, BLOCK):  # padding rows repeat the spec tokens' total
        i = done + tl.arange(0, BLOCK)
        values = tl.load(starts_ptr + tl.minimum(i, spec_rows), mask=i < count, other=0)
        tl.store(words_ptr + spec_at + i, values, mask=i < count)
    at = _load(words_ptr, _NON_SPEC_QSL_AT)
    _shifted_starts(words_ptr, starts_ptr, spec_rows, live - spec_rows + 1, at, BLOCK)
    at = _load(words_ptr, _QSL_P_AT)
    _shifted_starts(words_ptr, starts_ptr, first_prefill, live - first_prefill + 1, at, BLOCK)
    spec_tokens = _load(words_ptr, _SPEC_TOKENS)
    at = _load(words_ptr, _SPEC_TOKENS_AT)
    _copy_tokens(words_ptr, longs_ptr, 0, spec_tokens, at, BLOCK)
    at = _load(words_ptr, _PLAIN_TOKENS_AT)
    _copy_tokens(
        words_ptr, longs_ptr, spec_tokens, _load(words_ptr, _TOKENS) - spec_tokens, at, BLOCK
    )
    count = _load(words_ptr, _ENGINE_ROWS)
    masks_at = _load(words_ptr, _MASKS_AT)
    for done in range(0, count, BLOCK):
        i = done + tl.arange(0, BLOCK)
        tl.store(bytes_ptr + masks_at + i, tl.zeros([BLOCK], tl.uint8), mask=i < count)


@triton.jit
def _mark_spec_rows(words_ptr, bytes_ptr, BLOCK: tl.constexpr):
    """``masks[request] = True`` for every spec row (the first ones in group order)."""
    count = _load(words_ptr, _SPEC_ROWS)
    masks_at = _load(words_ptr, _MASKS_AT)
    request_at = _field(words_ptr, _REQUEST)
    for done in range(0, count, BLOCK):
        i = done + tl.arange(0, BLOCK)
        request = tl.load(words_ptr + request_at + i, mask=i < count, other=0)
        tl.store(bytes_ptr + masks_at + request, tl.full([BLOCK], 1, tl.uint8), mask=i < count)


@triton.jit(do_not_specialize=["group"])
def _open_step(
    entry_ptr,
    done_ptr,
    words_ptr,
    bytes_ptr,
    longs_ptr,
    table_ptr,
    table_stride,
    query_start_ptr,
    seq_lens_ptr,
    accepted_ptr,
    group,
    HAS_ACCEPTED: tl.constexpr,
    QUERY_LEN_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Open a step (the module's five parts). One program: its barriers order the copies
    before every read of them, the mask's clearing before its marks, and every read of
    the entry before the ticket goes back (the host may then rewrite the entry)."""
    ticket = tl.load(entry_ptr + _TICKET)
    _copy(entry_ptr, words_ptr, 0, _TICKET + 1, BLOCK)  # the header, its ticket included
    plan_at = tl.load(entry_ptr + _PLAN_AT)
    _copy(entry_ptr, words_ptr, plan_at, plan_at + tl.load(entry_ptr + _SIZE), BLOCK)
    accepted_at = tl.load(entry_ptr + _ACCEPTED_HOST_AT)
    stop = accepted_at + tl.load(entry_ptr + _ACCEPTED_ROWS)
    _copy(entry_ptr, words_ptr, accepted_at, stop, BLOCK)
    tl.debug_barrier()
    registered = _load(words_ptr, _REGISTERED)
    tables = _load(words_ptr, _TABLES)
    for other in range(0, registered):  # the engine's registered tables, then this build's
        table = tl.load(longs_ptr + tables + other).to(tl.pointer_type(tl.int32))
        stride = tl.load(longs_ptr + tables + registered + other)
        _gather_slots(words_ptr, table, stride, other, BLOCK)
    _gather_slots(words_ptr, table_ptr, table_stride, group, BLOCK)
    _gather_rows(
        words_ptr, bytes_ptr, seq_lens_ptr, accepted_ptr, HAS_ACCEPTED, QUERY_LEN_MAX, BLOCK
    )
    _derive_plan_sources(words_ptr, bytes_ptr, longs_ptr, BLOCK)
    _gather_engine_rows(words_ptr, bytes_ptr, query_start_ptr, seq_lens_ptr, BLOCK)
    tl.debug_barrier()
    _mark_spec_rows(words_ptr, bytes_ptr, BLOCK)
    tl.store(done_ptr, ticket)


@triton.jit(do_not_specialize=["group"])
def _group_slots(words_ptr, table_ptr, table_stride, group, BLOCK: tl.constexpr):
    """A further layer group of the step :func:`_open_step` opened: its slots only."""
    _gather_slots(words_ptr, table_ptr, table_stride, group, BLOCK)


def open_step(
    entry: torch.Tensor,
    done: torch.Tensor,
    words: torch.Tensor,
    table: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    accepted: torch.Tensor | None,
    group: int,
    query_len_max: int,
) -> None:
    """:meth:`.kernel_launcher.Launcher.open_step` through Triton on buffer ``words`` (any device
    Triton runs on, its interpreter included)."""
    _open_step[(1,)](
        entry,
        done,
        words,
        words.view(torch.uint8),
        words.view(torch.int64),
        table,
        table.stride(0),
        query_start,
        seq_lens,
        words if accepted is None else accepted,
        group,
        HAS_ACCEPTED=accepted is not None,
        QUERY_LEN_MAX=query_len_max,
        BLOCK=_BLOCK,
        num_warps=4,
    )


def group_slots(words: torch.Tensor, table: torch.Tensor, group: int) -> None:
    """:meth:`.kernel_launcher.Launcher.group_slots` through Triton on buffer ``words``."""
    _group_slots[(1,)](words, table, table.stride(0), group, BLOCK=_BLOCK, num_warps=4)
