"""Where each array lives inside the planner's int32 buffers: the plan's, uploaded per step,
and StepBatch's, which holds a validated batch's copies.

The one place their offsets are worked out: everything else reads them from here (the C
packer has its twin in ``csrc/layout.h``).
"""

from __future__ import annotations

from itertools import accumulate
from types import MappingProxyType

import attrs
import numpy as np

#: Field names in buffer order, with the padding value rows beyond the live ones
#: carry. Sizes: ``T`` tokens, ``R`` rows, ``G`` layer groups, ``P`` prefill tiles.
FIELDS: tuple[tuple[str, str, int], ...] = (
    ("token_map", "T", -1),  # logical (group-ordered) token -> engine token row
    ("row_query_start", "R+1", 0),  # cumulative logical token offsets; pads repeat the total
    ("row_token_start", "R", 0),  # engine token row of each row's first token
    ("row_kind", "R", 3),  # 0 spec, 1 decode, 2 prefill, 3 padding
    ("row_state_offset", "R", 0),  # o of SPEC §2: window entry where the history starts
    ("row_reads_state", "R", 0),  # 1 when the row reads its slot (spec, or has initial state)
    ("row_num_accepted", "R", 1),  # accepted tokens of a spec row's previous step
    ("row_request", "R", -1),  # engine row index of each group-ordered row
    ("row_slot", "G*R", 0),  # [G, R] conv-state slot per layer group
    ("tile_row", "P", -1),  # prefill work tile -> group-ordered row
    ("tile_start", "P", 0),  # first token of the tile within its request
)


#: Every field's padding value, in buffer order.
PAD_VALUES: tuple[int, ...] = tuple(pad for _, _, pad in FIELDS)
#: Every field's position in :data:`FIELDS` (and so in :meth:`PlanLayout.starts`).
FIELD_INDEX = MappingProxyType({name: index for index, (name, _, _) in enumerate(FIELDS)})
_INDEX = FIELD_INDEX


@attrs.frozen
class BufferField:
    """One named array inside the packed buffer: ``data[offset : offset + size]``."""

    name: str
    offset: int
    size: int
    pad_value: int


@attrs.frozen
class PlanLayout:
    """The packed buffer's shape: a pure function of four sizes.

    Two plans with the same layout can replay the same CUDA graph: every array
    sits at the same offset with the same length.

    Attributes:
        num_tokens: ``T``, token capacity (the graph's, or the live tokens).
        num_rows: ``R``, row capacity.
        num_tiles: ``P``, prefill tile capacity.
        num_groups: ``G``, layer groups.
    """

    num_tokens: int
    num_rows: int
    num_tiles: int
    num_groups: int

    def sizes(self) -> tuple[int, ...]:
        """Element count of every field, in :data:`FIELDS` order."""
        t, r, p, g = self.num_tokens, self.num_rows, self.num_tiles, self.num_groups
        return (t, r + 1, r, r, r, r, r, r, g * r, p, p)

    @property
    def size(self) -> int:
        """Total int32 elements of the packed buffer."""
        return sum(self.sizes())

    @property
    def fields(self) -> tuple[BufferField, ...]:
        """Every field with its offset, in buffer order."""
        fields, offset = [], 0
        for (name, _, pad), size in zip(FIELDS, self.sizes(), strict=True):
            fields.append(BufferField(name, offset, size, pad))
            offset += size
        return tuple(fields)

    def span(self, name: str) -> tuple[int, int]:
        """``(offset, size)`` of the field called ``name``; ``KeyError`` if there is none."""
        index, sizes = _INDEX[name], self.sizes()
        return sum(sizes[:index]), sizes[index]

    def field(self, name: str) -> BufferField:
        """The field called ``name``; ``KeyError`` if there is none."""
        offset, size = self.span(name)
        return BufferField(name, offset, size, PAD_VALUES[_INDEX[name]])

    def inert_buffer(self) -> np.ndarray:
        """``[size], int32``: every field at its padding value, a plan that touches nothing."""
        return np.repeat(np.array(PAD_VALUES, dtype=np.int32), self.sizes())

    def offsets(self) -> dict[str, tuple[int, int]]:
        """``{name: (offset, size)}`` for every field."""
        return {field.name: (field.offset, field.size) for field in self.fields}

    def starts(self) -> tuple[int, ...]:
        """Every field's offset in :data:`FIELDS` order, then :attr:`size`: field ``i``
        is ``packed[starts[i] : starts[i + 1]]`` (index by :data:`FIELD_INDEX`). One
        call for all offsets: what the packer reads per plan."""
        return tuple(accumulate(self.sizes(), initial=0))


#: StepBatch's own buffer (``StepBatch`` keeps its validated copies in one read-only
#: int32 buffer, filled by the compiled check): its arrays in order, with their sizes
#: (``R`` rows, ``G`` layer groups).
BATCH_FIELDS: tuple[tuple[str, str], ...] = (
    ("query_lens", "R"),
    ("num_computed_tokens", "R"),
    ("num_draft_tokens", "R"),
    ("num_accepted_tokens", "R"),
    ("slots", "G*R"),  # [G, R]
    ("query_start", "R+1"),
)


def batch_buffer_size(rows: int, groups: int) -> int:
    """int32 entries of StepBatch's buffer (:data:`BATCH_FIELDS`) for ``rows`` rows and
    ``groups`` layer groups."""
    return (5 + groups) * rows + 1


def batch_buffer_arrays(data: np.ndarray, rows: int, groups: int) -> tuple[np.ndarray, ...]:
    """The views of :data:`BATCH_FIELDS` into ``data`` (``[batch_buffer_size], int32``), in
    that order; ``slots`` as ``[G, R]``."""
    slots_end = (4 + groups) * rows
    return (
        data[:rows],
        data[rows : 2 * rows],
        data[2 * rows : 3 * rows],
        data[3 * rows : 4 * rows],
        data[4 * rows : slots_end].reshape(groups, rows),
        data[slots_end:],
    )
