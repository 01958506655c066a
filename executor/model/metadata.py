"""The model's per-step metadata: built on the host with vectorized numpy, laid out in one
byte buffer that one copy uploads.

Tokens are in the engine's order (the order of ``StepBatch``'s rows, each row's tokens
contiguous). The attention rows are the batch's live rows (its padding rows, ``q == 0``,
are dropped: they hold no token). Per token: its input id, its position
``num_computed + offset in the row``, and the flat KV-cache entry it writes
(``slot * max_len + position``); per row: ``cum_seq_q`` (token offsets), ``cum_seq_k``
(the row's first flat KV entry, ``slot * max_len``) and ``seqused_k`` (keys it attends
over, ``num_computed + q``); and the tokens whose logits are wanted.

A graph plan's metadata has its bucket's sizes (:func:`graph_shape`) whether it replays
or runs eagerly, so both run the very same shapes. Its padding is inert: padding tokens
have id 0 and position 0 and write entry 0 (slot 0's first), padding rows hold no token
and attend over nothing (``seqused_k = 0``), padding samples read token 0 and are never
returned. Live rows on the NULL slot (``allow_null_slots``) attend over nothing too.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from stepplan.planner import DECODE, PADDING, PREFILL, SPEC, GraphKey, StepBatch

_INT64, _INT32 = np.dtype(np.int64), np.dtype(np.int32)
# (name, element type, size) in buffer order; int64 fields first, so every field is aligned.
_FIELDS = (
    ("token_ids", _INT64, "T"),
    ("positions", _INT64, "T"),  # positions then write_index: one [2, T] block, filled at once
    ("write_index", _INT64, "T"),
    ("sample_index", _INT64, "S"),
    ("cum_seq_q", _INT32, "R+1"),
    ("cum_seq_k", _INT32, "R+1"),
    ("seqused_k", _INT32, "R"),
)


@attrs.frozen
class StepShape:
    """Sizes of one step's metadata; equal shapes lay out equal buffers.

    Attributes:
        num_tokens: ``T``, tokens the forward computes (a graph's bucket, or the live ones).
        num_rows: ``R``, attention rows.
        num_samples: ``S``, tokens whose logits are computed.
        max_query_len, max_kv_len: bounds on any row's ``q`` and ``seqused_k`` that
            attention is launched with.
    """

    num_tokens: int
    num_rows: int
    num_samples: int
    max_query_len: int
    max_kv_len: int

    #: ``(name, dtype, byte offset, elements)`` of every field in buffer order; derived.
    spans: tuple[tuple[str, np.dtype, int, int], ...] = attrs.field(
        init=False, eq=False, repr=False
    )
    #: Bytes of the whole buffer; derived.
    nbytes: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # Made once per shape: a step reads them several times, and graph shapes repeat.
        sizes = {"T": self.num_tokens, "S": self.num_samples, "R": self.num_rows}
        spans, offset = [], 0
        for name, dtype, size in _FIELDS:
            count = sizes[size[0]] + (1 if size.endswith("+1") else 0)
            spans.append((name, dtype, offset, count))
            offset += count * dtype.itemsize
        object.__setattr__(self, "spans", tuple(spans))
        object.__setattr__(self, "nbytes", offset)


def graph_shape(key: GraphKey, query_len_max: int, max_len: int) -> StepShape:
    """The metadata sizes of graph ``key``: its tokens and rows, ``min(tokens, rows * Q)``
    samples, queries bounded by ``Q`` (spec), 1 (decode) or its tokens (mixed), keys by
    ``max_len``."""
    tokens, rows = key.num_tokens, key.num_rows
    longest = {"spec": query_len_max, "decode": 1}.get(key.kind, tokens)
    samples = min(tokens, rows * query_len_max)
    return StepShape(tokens, rows, samples, min(longest, tokens), max_len)


@attrs.frozen(eq=False)
class LiveRows:
    """The batch's live rows in engine order, ``[R], int64`` each: query lengths, computed
    tokens and attention slot (the slot of layer group 0)."""

    query_lens: np.ndarray
    num_computed: np.ndarray
    slots: np.ndarray

    @classmethod
    def of(cls, batch: StepBatch) -> LiveRows:
        q, computed, slots = batch.query_lens, batch.num_computed_tokens, batch.slots[0]
        if batch.kind_counts[PADDING]:
            live = batch.kinds != PADDING
            q, computed, slots = q[live], computed[live], slots[live]
        return cls(q.astype(np.int64), computed.astype(np.int64), slots.astype(np.int64))

    @property
    def num_rows(self) -> int:
        return int(self.query_lens.shape[0])


def eager_shape(rows: LiveRows, num_tokens: int, num_samples: int) -> StepShape:
    """The metadata sizes of an eager plan: exactly its live tokens, rows and samples."""
    if rows.num_rows == 0:
        return StepShape(num_tokens, 0, num_samples, 0, 0)
    longest_q = int(rows.query_lens.max())
    longest_k = int((rows.num_computed + rows.query_lens).max())
    return StepShape(num_tokens, rows.num_rows, num_samples, longest_q, longest_k)


@attrs.frozen(eq=False)
class StepHost:
    """What the host wrote, for the per-row reference attention.

    Attributes:
        shape: the buffer's sizes.
        num_tokens, num_rows, num_samples: the live counts.
        cum_seq_q: ``[shape.num_rows + 1], int32``.
        slots: ``[num_rows], int64`` live rows' slots.
        seqused_k: ``[shape.num_rows], int32``.
    """

    shape: StepShape
    num_tokens: int
    num_rows: int
    num_samples: int
    cum_seq_q: np.ndarray
    slots: np.ndarray
    seqused_k: np.ndarray


def host_views(buffer: np.ndarray, shape: StepShape) -> dict[str, np.ndarray]:
    """Numpy views of every field inside ``buffer`` (``[>= shape.nbytes], uint8``)."""
    views = {}
    for name, dtype, offset, count in shape.spans:
        views[name] = buffer[offset : offset + count * dtype.itemsize].view(dtype)
    return views


def fill(
    buffer: np.ndarray,
    shape: StepShape,
    rows: LiveRows,
    token_ids: np.ndarray,
    sample_index: np.ndarray,
    max_len: int,
) -> StepHost:
    """Write one step's metadata into ``buffer`` (``[>= shape.nbytes], uint8``), padding
    included; the inputs are checked already (:func:`check_inputs`).

    Args:
        token_ids: ``[live tokens], int64`` in engine order.
        sample_index: ``[live samples], int64`` token indices whose logits are wanted.
    """
    views = host_views(buffer, shape)
    tokens, samples, count = token_ids.shape[0], sample_index.shape[0], rows.num_rows
    q, computed, slots = rows.query_lens, rows.num_computed, rows.slots
    cum_q, cum_k, used = views["cum_seq_q"], views["cum_seq_k"], views["seqused_k"]
    cum_q[0] = 0
    np.cumsum(q, out=cum_q[1 : count + 1])
    cum_q[count + 1 :] = tokens  # padding rows hold no token
    # Row r's tokens start at cum_q[r]: position = computed + (token index - cum_q[r]).
    first_key = slots * max_len
    bases = np.empty((2, count), np.int64)
    np.subtract(computed, cum_q[:count], out=bases[0])
    np.add(bases[0], first_key, out=bases[1])
    start = 8 * shape.num_tokens  # positions follow token_ids, write_index follows positions
    pos_write = buffer[start : start + 16 * shape.num_tokens].view(np.int64).reshape(2, -1)
    np.add(
        np.repeat(bases, q, axis=1), np.arange(tokens, dtype=np.int64), out=pos_write[:, :tokens]
    )
    pos_write[:, tokens:] = 0
    views["token_ids"][:tokens] = token_ids
    views["token_ids"][tokens:] = 0
    views["sample_index"][:samples] = sample_index
    views["sample_index"][samples:] = 0
    cum_k[:count] = first_key
    cum_k[count:] = 0
    np.multiply(computed + q, slots > 0, out=used[:count], casting="unsafe")
    used[count:] = 0
    return StepHost(shape, tokens, count, samples, cum_q, slots, used)


def check_inputs(
    rows: LiveRows,
    batch: StepBatch,
    token_ids: np.ndarray,
    sample_index: np.ndarray,
    *,
    vocab_size: int,
    num_slots: int,
    max_len: int,
    max_samples: int | None,
) -> None:
    """Raise ``ValueError`` naming the argument, row or index that the model cannot run:
    ids outside the vocabulary, samples outside the step's tokens or beyond a graph's
    capacity, slots beyond the pools, positions beyond ``max_len``."""
    tokens = batch.num_tokens
    if token_ids.shape != (tokens,):
        raise ValueError(f"token_ids: must be [{tokens}], got {list(token_ids.shape)}")
    if tokens and not 0 <= token_ids.min() <= token_ids.max() < vocab_size:
        bad = int(np.flatnonzero((token_ids < 0) | (token_ids >= vocab_size))[0])
        raise ValueError(
            f"token_ids[{bad}]: {token_ids[bad]} is outside the vocabulary 0..{vocab_size - 1}"
        )
    if sample_index.ndim != 1:
        raise ValueError(f"sample_index: must be 1-D, got {list(sample_index.shape)}")
    if sample_index.size and not 0 <= sample_index.min() <= sample_index.max() < tokens:
        bad = int(np.flatnonzero((sample_index < 0) | (sample_index >= tokens))[0])
        raise ValueError(
            f"sample_index[{bad}]: {sample_index[bad]} is outside the step's tokens 0..{tokens - 1}"
        )
    if max_samples is not None and sample_index.size > max_samples:
        raise ValueError(
            f"sample_index: {sample_index.size} samples exceed the {max_samples} this graph "
            "bucket computes (min(tokens, rows * Q)); sample a spec row's tokens, a decode's "
            "token and a prefill chunk's last token"
        )
    _check_rows(rows, batch, num_slots, max_len)


def _check_rows(rows: LiveRows, batch: StepBatch, num_slots: int, max_len: int) -> None:
    if rows.num_rows == 0:
        return
    padded = batch.kind_counts[PADDING] > 0
    live = batch.kinds != PADDING if padded else slice(None)
    if batch.slots[:, live].max() >= num_slots:
        group, row = np.argwhere((batch.slots >= num_slots) & (batch.kinds != PADDING))[0]
        raise ValueError(
            f"slots: row {row} of group {group} uses slot {batch.slots[group, row]}, "
            f"the runner has slots 0..{num_slots - 1}"
        )
    ends = rows.num_computed + rows.query_lens
    if ends.max() > max_len:
        bad = int(np.flatnonzero(ends > max_len)[0])
        row = int(np.flatnonzero(batch.kinds != PADDING)[bad])
        raise ValueError(
            f"num_computed_tokens: row {row} reaches {ends[bad]} positions, beyond the KV "
            f"cache's max_len = {max_len}"
        )


@attrs.frozen(eq=False)
class StepTensors:
    """Device views of one step's metadata (see :class:`StepShape` for the sizes).

    Attributes:
        token_ids, positions, write_index: ``[T], int64``.
        sample_index: ``[S], int64``.
        cum_seq_q, cum_seq_k: ``[R + 1], int32``.
        seqused_k: ``[R], int32``.
        shape: the sizes, and the bounds attention is launched with.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    write_index: torch.Tensor
    sample_index: torch.Tensor
    cum_seq_q: torch.Tensor
    cum_seq_k: torch.Tensor
    seqused_k: torch.Tensor
    shape: StepShape


_TORCH = {_INT64: torch.int64, _INT32: torch.int32}


def device_views(buffer: torch.Tensor, shape: StepShape) -> StepTensors:
    """:class:`StepTensors` over ``buffer`` (``[>= shape.nbytes], uint8``, any device)."""
    views = {
        name: buffer[offset : offset + count * dtype.itemsize].view(_TORCH[dtype])
        for name, dtype, offset, count in shape.spans
    }
    return StepTensors(shape=shape, **views)


def sample_positions(batch: StepBatch, completes_prompt: np.ndarray | None = None) -> np.ndarray:
    """``[S], int64``: the tokens an engine samples, as vLLM does: every token of a spec
    row, a decode row's token, and a prefill chunk's last token where it completes its
    prompt (``completes_prompt`` ``[R], bool``; default: every prefill chunk does).
    Engine order, row by row."""
    kinds, q = batch.kinds, batch.query_lens.astype(np.int64)
    counts = np.where(kinds == SPEC, q, (kinds == DECODE) | (kinds == PREFILL)).astype(np.int64)
    if completes_prompt is not None:
        counts[(kinds == PREFILL) & ~np.asarray(completes_prompt, bool)] = 0
    ends = batch.query_start[1:].astype(np.int64)
    total = int(counts.sum())
    # Each row's samples are its last ``counts[r]`` tokens.
    firsts = np.repeat(ends - counts, counts)
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return firsts + offsets
