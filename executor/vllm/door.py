"""The device half of the drop-in builder: one launch per step, no host read-back.

The host writes a step into a staging entry (pinned memory on a CUDA device): a header
that says where everything lies, and the plan. :func:`_open_step` is one kernel, one
program, that

1. copies the entry's ranges into the builder's persistent device buffer;
2. gathers, through the plan's index maps, what only the device knows: every row's slot
   from the block table (the building group's, and those of the groups the engine
   registered, :class:`~.share.StepShare`), a spec row's accepted count, a decode or
   prefill row's computed tokens ``seq_lens - query_lens`` and so its has-initial-state
   flag; it writes them into the plan (``row_slot``, ``row_num_accepted``,
   ``row_state_offset``, ``row_reads_state``) and into the seed's row sources
   (:data:`~.seed.ROW_SOURCES`);
3. derives the seed's plan sources (:data:`~.seed.PLAN_SOURCES`: query starts per group,
   the spec mask by engine row, the token lists as int64) from the plan it copied;
4. hands the entry's ticket back (:class:`~stepplan.executor.upload.StagingRing`).

A further layer group whose slots were not gathered so runs :func:`_group_slots`. The
kernels take no per-step integers (the header has them), so each compiles once.
:func:`gather_reference` does the same in torch operations: the CPU builder's device
half, and the specification the kernels are tested against.
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Header words (int32). Per step: counts, the copy's ranges, the plan's fields (int32 word
# offsets of the buffer; the entry has the same layout). Fixed for the buffer's life:
# where the sources lie (int32 words, except where a comment says bytes or int64).
_ROWS = tl.constexpr(0)  # R: the plan's row capacity
_GATHER = tl.constexpr(1)  # N >= R: group-ordered rows the row sources cover
_SPEC_ROWS = tl.constexpr(2)  # spec rows (group order: the first ones)
_FIRST_PREFILL = tl.constexpr(3)  # the first prefill row
_LIVE_ROWS = tl.constexpr(4)  # rows before the padding rows
_ENGINE_ROWS = tl.constexpr(5)  # the engine's rows (the spec mask's length)
_SPEC_TOKENS = tl.constexpr(6)  # tokens of the spec rows
_TOKENS = tl.constexpr(7)  # live tokens
_REGISTERED = tl.constexpr(8)  # block tables the engine registered (0: none)
_CHUNKS = tl.constexpr(9)  # (start, length) word ranges the entry copies
_CHUNK_TABLE = tl.constexpr(10)  # the ranges: MAX_CHUNKS pairs
_TOKEN_MAP = tl.constexpr(16)  # the plan's token_map
_QUERY_START = tl.constexpr(17)  # row_query_start
_KIND = tl.constexpr(18)  # row_kind
_STATE_OFFSET = tl.constexpr(19)  # row_state_offset
_READS_STATE = tl.constexpr(20)  # row_reads_state
_ACCEPTED = tl.constexpr(21)  # row_num_accepted
_REQUEST = tl.constexpr(22)  # row_request
_SLOT = tl.constexpr(23)  # row_slot of group 0 (group g: + g * R)
_STRIDE = tl.constexpr(24)  # the row sources' capacity: words between two slot sources
_SLOTS_AT = tl.constexpr(25)  # group g's spec, plain, prefill slots: + (3 g + 0, 1, 2) stride
_ACCEPTED_AT = tl.constexpr(26)
_HAS_PLAIN_AT = tl.constexpr(27)  # bytes
_HAS_PREFILL_AT = tl.constexpr(28)  # bytes
_COMPUTED_PREFILL_AT = tl.constexpr(29)
_SPEC_QSL_AT = tl.constexpr(30)
_NON_SPEC_QSL_AT = tl.constexpr(31)
_QSL_P_AT = tl.constexpr(32)
_MASKS_AT = tl.constexpr(33)  # bytes
_SPEC_TOKENS_AT = tl.constexpr(34)  # int64 elements
_PLAIN_TOKENS_AT = tl.constexpr(35)  # int64 elements
_TABLES = tl.constexpr(36)  # int64 elements: registered tables' addresses, then row strides
_TICKET = tl.constexpr(48)  # the entry's ticket (StagingRing.stamp)

#: Header word positions by name, for the host (and the reference).
HEADER = {
    name.lower(): value.value
    for name, value in dict(
        ROWS=_ROWS, GATHER=_GATHER, SPEC_ROWS=_SPEC_ROWS, FIRST_PREFILL=_FIRST_PREFILL,
        LIVE_ROWS=_LIVE_ROWS, ENGINE_ROWS=_ENGINE_ROWS, SPEC_TOKENS=_SPEC_TOKENS,
        TOKENS=_TOKENS, REGISTERED=_REGISTERED, CHUNKS=_CHUNKS, CHUNK_TABLE=_CHUNK_TABLE,
        TOKEN_MAP=_TOKEN_MAP, QUERY_START=_QUERY_START, KIND=_KIND,
        STATE_OFFSET=_STATE_OFFSET, READS_STATE=_READS_STATE, ACCEPTED=_ACCEPTED,
        REQUEST=_REQUEST, SLOT=_SLOT, STRIDE=_STRIDE, SLOTS_AT=_SLOTS_AT,
        ACCEPTED_AT=_ACCEPTED_AT, HAS_PLAIN_AT=_HAS_PLAIN_AT, HAS_PREFILL_AT=_HAS_PREFILL_AT,
        COMPUTED_PREFILL_AT=_COMPUTED_PREFILL_AT, SPEC_QSL_AT=_SPEC_QSL_AT,
        NON_SPEC_QSL_AT=_NON_SPEC_QSL_AT, QSL_P_AT=_QSL_P_AT, MASKS_AT=_MASKS_AT,
        SPEC_TOKENS_AT=_SPEC_TOKENS_AT, PLAIN_TOKENS_AT=_PLAIN_TOKENS_AT, TABLES=_TABLES,
    ).items()
}  # fmt: skip
#: Header words written every step (the rest stay as the buffer was set up).
STEP_WORDS = _STRIDE.value
MAX_CHUNKS = 3  # the header with its ticket, the plan, accepted counts given on the host
TICKET_WORD = _TICKET.value
#: Words before the first region: the header, the ticket, room to grow.
HEADER_WORDS = 64
#: Words (or rows) one pass of a kernel covers.
_BLOCK = 1024


@triton.jit
def _load(words_ptr, word):
    return tl.load(words_ptr + word)


@triton.jit
def _gather_slots(words_ptr, table_ptr, table_stride, group, BLOCK: tl.constexpr):
    """Rows ``0 .. N`` in group order: slot = block table column 0 of the row's request
    (NULL on padding rows), into the plan's row_slot and group ``group``'s slot sources."""
    rows, gather = _load(words_ptr, _ROWS), _load(words_ptr, _GATHER)
    spec_rows, first_prefill = _load(words_ptr, _SPEC_ROWS), _load(words_ptr, _FIRST_PREFILL)
    stride = _load(words_ptr, _STRIDE)
    spec_at = _load(words_ptr, _SLOTS_AT) + 3 * group * stride
    plan_at = _load(words_ptr, _SLOT) + group * rows
    request_at = _load(words_ptr, _REQUEST)
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
    spec_rows, first_prefill = _load(words_ptr, _SPEC_ROWS), _load(words_ptr, _FIRST_PREFILL)
    for first in range(0, gather, BLOCK):
        r = first + tl.arange(0, BLOCK)
        in_plan = r < rows
        request = tl.load(words_ptr + _load(words_ptr, _REQUEST) + r, mask=in_plan, other=-1)
        row = request.to(tl.int64)
        kind = tl.load(words_ptr + _load(words_ptr, _KIND) + r, mask=in_plan, other=3)
        starts = words_ptr + _load(words_ptr, _QUERY_START) + r
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
        tl.store(words_ptr + _load(words_ptr, _STATE_OFFSET) + r, offset, mask=in_plan)
        tl.store(words_ptr + _load(words_ptr, _READS_STATE) + r, reads, mask=in_plan)
        tl.store(words_ptr + _load(words_ptr, _ACCEPTED) + r, accepted, mask=in_plan)
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
    token_map = words_ptr + _load(words_ptr, _TOKEN_MAP) + first
    for done in range(0, count, BLOCK):
        i = done + tl.arange(0, BLOCK)
        tokens = tl.load(token_map + i, mask=i < count, other=0).to(tl.int64)
        tl.store(longs_ptr + target_at + i, tokens, mask=i < count)


@triton.jit
def _derive_plan_sources(words_ptr, bytes_ptr, longs_ptr, BLOCK: tl.constexpr):
    """The plan sources from the plan in the buffer; the spec mask cleared (its spec rows
    are marked after the next barrier)."""
    starts_ptr = words_ptr + _load(words_ptr, _QUERY_START)
    spec_rows, first_prefill = _load(words_ptr, _SPEC_ROWS), _load(words_ptr, _FIRST_PREFILL)
    live = _load(words_ptr, _LIVE_ROWS)
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
    request_at = _load(words_ptr, _REQUEST)
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
    seq_lens_ptr,
    accepted_ptr,
    group,
    HAS_ACCEPTED: tl.constexpr,
    QUERY_LEN_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Open a step (the module's four parts). One program: its barriers order the copies
    before every read of them, the mask's clearing before its marks, and every read of
    the entry before the ticket goes back (the host may then rewrite the entry)."""
    ticket = tl.load(entry_ptr + _TICKET)
    for chunk in range(0, tl.load(entry_ptr + _CHUNKS)):
        start = tl.load(entry_ptr + _CHUNK_TABLE + 2 * chunk)
        stop = start + tl.load(entry_ptr + _CHUNK_TABLE + 2 * chunk + 1)
        for first in range(start, stop, BLOCK):
            at = first + tl.arange(0, BLOCK)
            tl.store(words_ptr + at, tl.load(entry_ptr + at, mask=at < stop), mask=at < stop)
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
    tl.debug_barrier()
    _mark_spec_rows(words_ptr, bytes_ptr, BLOCK)
    tl.store(done_ptr, ticket)


@triton.jit(do_not_specialize=["group"])
def _group_slots(words_ptr, table_ptr, table_stride, group, BLOCK: tl.constexpr):
    """A further layer group of the step :func:`_open_step` opened: its slots only."""
    _gather_slots(words_ptr, table_ptr, table_stride, group, BLOCK)


#: Triton from 3.3 on hands a compiled kernel's launcher every argument, constexprs too.
_DIRECT_LAUNCHES = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 3)


def _specialization(tensors: tuple[torch.Tensor, ...], stride: int) -> tuple:
    """What Triton compiles a variant per: each pointer's dtype and 16-byte alignment, and
    whether the stride is 1 or a multiple of 16."""
    return (
        *[(t.dtype, t.data_ptr() % 16 == 0) for t in tensors],
        stride == 1,
        stride % 16 == 0,
    )


#: Argument sets a launcher keeps (graphs and first sightings); past it, new argument
#: sets launch directly.
_MAX_ARGUMENT_SETS = 512


class Launcher:
    """The door's two kernels on one buffer, launched past Triton's per-launch dispatch,
    and replayed as CUDA graphs where their arguments recur.

    A variant's first launch (:func:`_specialization`) goes through Triton, which
    compiles it; later ones call the compiled kernel's launcher on the current stream
    (Triton >= 3.3; before, every launch goes through Triton), which skips Triton's
    argument binding, cache lookup and global checks: microseconds per launch. Launch
    hooks that Triton's profilers install are not called on that path.

    With ``graphs``, the second launch of one exact argument set (every address, stride,
    dtype and group: an engine's persistent buffers and the staging ring's entries make
    them recur) captures that launch into a CUDA graph on a side stream, which records
    and runs nothing and waits for nothing, and every later launch of that set replays
    the graph on the current stream: a graph launch costs the host about half a kernel
    launch with its arguments, and a capture 0.05-0.7 ms once per argument set. While
    the current stream is being captured (an engine capturing its own graph), launches
    go directly, into that capture.

    Args:
        words: the buffer, ``[W], int32`` on a CUDA device (``W`` even).
        query_len_max: ``Q``.
        direct: launch past Triton's dispatch where Triton allows it.
        graphs: replay recurring argument sets as CUDA graphs (only with ``direct``).
    """

    def __init__(
        self, words: torch.Tensor, query_len_max: int, *, direct: bool = True, graphs: bool = True
    ) -> None:
        self.words, self.query_len_max = words, query_len_max
        self._views = (words, words.view(torch.uint8), words.view(torch.int64))
        index = words.device.index
        self._device = torch.cuda.current_device() if index is None else index
        self.direct = direct and _DIRECT_LAUNCHES
        self.graphs = graphs and self.direct
        self._compiled: dict[tuple, object] = {}
        # Per exact argument set: its graph, or 1 once launched directly.
        self._graphs: dict[tuple, torch.cuda.CUDAGraph | int] = {}
        self._side = torch.cuda.Stream(self._device) if self.graphs else None
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        #: Launches replayed as graphs, and graphs captured, so far.
        self.num_replays = self.num_captures = 0

    def open_step(
        self,
        entry: torch.Tensor,
        done: torch.Tensor,
        table: torch.Tensor,
        seq_lens: torch.Tensor,
        accepted: torch.Tensor | None,
        group: int,
    ) -> None:
        """Launch :func:`_open_step`: ``entry`` (``[E], int32`` pinned) and its ``done``
        word (``[1], int32`` pinned); ``table`` ``[>= num_reqs, B]`` the building group's
        block table (slot: column 0), ``seq_lens`` and ``accepted`` ``[>= num_reqs]``
        (``None``: every count 1), int32 or int64."""
        stride = table.stride(0)
        has_accepted = accepted is not None
        counts = accepted if has_accepted else self.words
        exact = (
            entry.data_ptr(),
            done.data_ptr(),
            table.data_ptr(),
            table.dtype,
            stride,
            seq_lens.data_ptr(),
            seq_lens.dtype,
            counts.data_ptr(),
            counts.dtype,
            has_accepted,
            group,
        )
        if self._replayed(exact):
            return
        args = (entry, done, *self._views, table, stride, seq_lens, counts, group)
        constants = (has_accepted, self.query_len_max, _BLOCK)
        key = (
            "open",
            has_accepted,
            *_specialization((entry, done, table, seq_lens, counts), stride),
        )
        self._launch(
            _open_step, key, exact, args, constants, ("HAS_ACCEPTED", "QUERY_LEN_MAX", "BLOCK")
        )

    def group_slots(self, table: torch.Tensor, group: int) -> None:
        """Launch :func:`_group_slots`: group ``group``'s slots from ``table``."""
        stride = table.stride(0)
        exact = (table.data_ptr(), table.dtype, stride, group)
        if self._replayed(exact):
            return
        args = (self.words, table, stride, group)
        key = ("slots", *_specialization((table,), stride))
        self._launch(_group_slots, key, exact, args, (_BLOCK,), ("BLOCK",))

    def _replayed(self, exact: tuple) -> bool:
        """Replay the graph of argument set ``exact`` if there is one; whether it did (not
        while the current stream is being captured: torch refuses a replay there, before
        it launches anything)."""
        graph = self._graphs.get(exact)
        if graph is None or graph.__class__ is int:
            return False
        try:
            graph.replay()
        except RuntimeError:
            if torch.cuda.is_current_stream_capturing():
                return False
            raise
        self.num_replays += 1
        return True

    def _launch(
        self, kernel, key: tuple, exact: tuple, args: tuple, constants: tuple, names: tuple
    ) -> None:
        compiled = self._compiled.get(key) if self.direct else None
        if compiled is None:
            launched = kernel[(1,)](*args, **dict(zip(names, constants, strict=True)), num_warps=4)
            if self.direct:
                self._compiled[key] = launched
            return
        if not self.graphs or torch.cuda.is_current_stream_capturing():
            self._run(compiled, args, constants)
            return
        if exact not in self._graphs:  # a first sighting launches directly
            if len(self._graphs) < _MAX_ARGUMENT_SETS:
                self._graphs[exact] = 1
            self._run(compiled, args, constants)
            return
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self._side):
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                self._run(compiled, args, constants)
            finally:
                graph.capture_end()
        self._graphs[exact] = graph
        self.num_captures += 1
        graph.replay()
        self.num_replays += 1

    def _run(self, compiled, args: tuple, constants: tuple) -> None:
        """The compiled kernel's launcher, straight, on the current stream."""
        stream = torch._C._cuda_getCurrentRawStream(self._device)
        compiled.run(
            1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *args, *constants,
        )  # fmt: skip


def open_step(
    entry: torch.Tensor,
    done: torch.Tensor,
    words: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    accepted: torch.Tensor | None,
    group: int,
    query_len_max: int,
) -> None:
    """:meth:`Launcher.open_step` through Triton on buffer ``words`` (any device Triton
    runs on, its interpreter included)."""
    _open_step[(1,)](
        entry,
        done,
        words,
        words.view(torch.uint8),
        words.view(torch.int64),
        table,
        table.stride(0),
        seq_lens,
        words if accepted is None else accepted,
        group,
        HAS_ACCEPTED=accepted is not None,
        QUERY_LEN_MAX=query_len_max,
        BLOCK=_BLOCK,
        num_warps=4,
    )


def group_slots(words: torch.Tensor, table: torch.Tensor, group: int) -> None:
    """:meth:`Launcher.group_slots` through Triton on buffer ``words``."""
    _group_slots[(1,)](words, table, table.stride(0), group, BLOCK=_BLOCK, num_warps=4)
