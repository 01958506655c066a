"""The builder's persistent device buffer: what lies where, how a step gets there, its views.

One int32 buffer holds, at fixed offsets (:class:`Regions`), the header the kernels of
:mod:`.gather_kernels` read, the plan, and every source of the seed's fields
(:data:`~.metadata_fields.SOURCE_DTYPES`). Fixed offsets make every field a view at a fixed
address, so a CUDA graph captured over one step's metadata reads the next step's
values there, as the seed's persistent buffers do. The host writes only the header and
the plan (and accepted counts given on the host): on a CUDA device into a staging entry
of pinned memory that the opening kernel copies; elsewhere into a host entry that torch
operations (:mod:`.gather_reference`) copy, as the kernel does, before they do the kernels' work.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs
import numpy as np
import torch

from ..upload import StagingRing
from . import gather_kernels, gather_reference, kernel_launcher
from .metadata_fields import (
    PASS_THROUGH,
    SLOT_SOURCES,
    SOURCE_DTYPES,
    TABLE_COLUMNS,
    ShapeKeys,
)
from .revisions import Revision

_CACHE_LIMIT = 4096  # entries of a shape-keyed cache; all are let go past it
#: Where a row-part views dict keeps its fields' places, and where the fields a build
#: fills in from the engine's tensors (every other key is a group).
_PLACES, MARKERS = -1, -2
#: The builder's header words of a step, packed straight into the entry after the plan's
#: summary (which the packer writes).
_STEP_WORDS = struct.Struct(f"<{gather_kernels.STEP_WORDS}i")
#: Where the kernels find the plan and each source (header word, region, unit: 4 bytes per
#: word, 1 int32 per word, 1/2 int64 per word).
_SOURCE_WORDS = (
    ("plan_at", "plan", 1),
    ("accepted_host_at", "accepted_host", 1),
    ("slots_at", "slots", 1),
    ("accepted_at", "accepted", 1),
    ("has_plain_at", "has_plain", 4),
    ("has_prefill_at", "has_prefill", 4),
    ("computed_prefill_at", "computed_prefill", 1),
    ("spec_qsl_at", "spec_qsl", 1),
    ("non_spec_qsl_at", "non_spec_qsl", 1),
    ("qsl_p_at", "qsl_p", 1),
    ("masks_at", "masks", 4),
    ("spec_tokens_at", "spec_tokens", 0.5),
    ("plain_tokens_at", "plain_tokens", 0.5),
    ("tables", "tables", 0.5),
    ("engine_has_at", "engine_has", 4),
    ("engine_has_p_at", "engine_has_p", 4),
    ("engine_qlen_at", "engine_qlen", 1),
    ("engine_qsl_at", "engine_qsl", 1),
    ("engine_qsl_p_at", "engine_qsl_p", 1),
)
#: Slot sources per layer group (each ``rows`` words), as the kernels lay them out.
_SLOTS_PER_GROUP = gather_kernels.SLOT_SOURCES_PER_GROUP
#: The sources of query starts, one entry longer than the rows.
_QUERY_STARTS = ("spec_qsl", "non_spec_qsl", "qsl_p", "engine_qsl", "engine_qsl_p")


@attrs.frozen
class Regions:
    """Where each part lies in the buffer (and in a staging entry), in int32 words.

    The host writes ``[0, staged)``: the header, the plan and accepted counts that come
    from the host; the kernels write the plan sources, the row sources (``slots``: per
    layer group its :data:`~.metadata_fields.SLOT_SOURCES`, ``rows`` words each) and the
    engine-ordered ones (:data:`~.metadata_fields.ENGINE_SOURCES`); ``tables``
    holds the registered block tables' addresses and row strides (int64), ``ramp``
    ``0, 1, 2, ...`` for good. ``rows`` is the row sources' capacity (the query-start
    sources hold ``rows + 1``), ``num_tokens`` the token lists'.
    """

    plan: int
    accepted_host: int
    staged: int
    spec_qsl: int
    non_spec_qsl: int
    qsl_p: int
    masks: int
    spec_tokens: int
    plain_tokens: int
    accepted: int
    computed_prefill: int
    has_plain: int
    has_prefill: int
    engine_has: int
    engine_has_p: int
    engine_qlen: int
    engine_qsl: int
    engine_qsl_p: int
    slots: int
    tables: int
    ramp: int
    total: int
    rows: int
    num_tokens: int


def plan_regions(plan_words: int, rows: int, tokens: int, groups: int) -> Regions:
    """The regions for plans of up to ``plan_words`` words, ``rows`` gathered rows,
    ``tokens`` tokens and ``groups`` layer groups; every region 8-byte aligned."""
    at, offsets = gather_kernels.HEADER_WORDS, {}
    flags = -(-rows // 4)
    for name, size in (
        ("plan", plan_words),
        ("accepted_host", rows),
        ("staged", 0),
        ("spec_qsl", rows + 1),
        ("non_spec_qsl", rows + 1),
        ("qsl_p", rows + 1),
        ("masks", flags),
        ("spec_tokens", 2 * tokens),
        ("plain_tokens", 2 * tokens),
        ("accepted", rows),
        ("computed_prefill", rows),
        ("has_plain", flags),
        ("has_prefill", flags),
        ("engine_has", flags),
        ("engine_has_p", flags),
        ("engine_qlen", rows),
        ("engine_qsl", rows + 1),
        ("engine_qsl_p", rows + 1),
        ("slots", _SLOTS_PER_GROUP * groups * rows),
        ("tables", 4 * groups),
        ("ramp", max(tokens, rows) + 1),
        ("total", 0),
    ):
        at += at % 2
        if name == "staged":  # entries of staged + 1 words (the ring's) stay 16-byte aligned
            at += (3 - at) % 4
        offsets[name] = at
        at += size
    return Regions(**offsets, rows=rows, num_tokens=tokens)


class _Marker:
    """A marker at every length (a source whose views are the engine's, per build)."""

    __slots__ = ("marker",)

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __getitem__(self, length: int) -> str:
        return self.marker


class _SourceLists(dict):
    """A layer group's every-prefix lists by source, each made at its first use (the slot
    sources are the group's, the others shared by every group)."""

    def __init__(self, buffer: DeviceBuffer, group: int) -> None:
        super().__init__({marker: _Marker(marker) for marker in (PASS_THROUGH, TABLE_COLUMNS)})
        self.buffer, self.group = buffer, group

    def __missing__(self, source: str) -> list[torch.Tensor]:
        if self.group and source not in SLOT_SOURCES:  # group 0's lists serve every group
            prefixes = self.buffer._source_lists(0)[source]
        else:
            prefixes = self.buffer._every_prefix(source, self.group)
        self[source] = prefixes
        return prefixes


class _Entry(NamedTuple):
    """A staging entry and the views of it that a step writes."""

    tensor: torch.Tensor  # [staged], int32: pinned on a CUDA device, else a host tensor
    words: np.ndarray  # the same memory
    plan: np.ndarray  # the plan's region
    summary: np.ndarray  # the header's first words: the plan's summary
    done: torch.Tensor | None  # the ring's done word (None on the CPU: no ring)


class DeviceBuffer:
    """The persistent buffer of one :class:`~.step_share.StepShare`, with its staging ring.

    Args:
        regions: its layout.
        device: where it lives.
        revision: the rules of the fields its views are (:mod:`.revisions`).
        ring_size: staging entries (CUDA only).
        query_len_max: ``Q`` (the spec rows' state offsets are clamped to ``0..Q-1``).
        direct_launches: launch the kernels past Triton's dispatch
            (:class:`~.kernel_launcher.Launcher`).
        graph_launches: replay recurring launches as CUDA graphs
            (:class:`~.kernel_launcher.Launcher`).
    """

    def __init__(
        self,
        regions: Regions,
        device: torch.device,
        revision: Revision,
        ring_size: int,
        query_len_max: int,
        *,
        direct_launches: bool = True,
        graph_launches: bool = True,
    ) -> None:
        self.regions, self.device, self.query_len_max = regions, device, query_len_max
        self.revision = revision
        self.words = torch.zeros(regions.total, dtype=torch.int32, device=device)
        self.words[regions.ramp :] = torch.arange(regions.total - regions.ramp, device=device)
        self._bytes = self.words.view(torch.uint8)
        self._longs = self.words.view(torch.int64)
        self._ring = self._launcher = None
        if device.type == "cuda":
            self._ring = StagingRing(4 * regions.staged, device, ring_size)
            self._launcher = kernel_launcher.Launcher(
                self.words, query_len_max, direct=direct_launches, graphs=graph_launches
            )
        # Every staging entry, its fixed header words written: one per ring entry on a
        # CUDA device, else one host entry (index None).
        indices = [None] if self._ring is None else range(ring_size)
        self._entries: dict[int | None, _Entry] = {i: self._new_entry(i) for i in indices}
        # The row parts' views per part keys and group.
        self._row_views: dict[tuple, dict[int, tuple[Any, ...]]] = {}
        # Per group, every prefix view of each source: bounded by the regions' sizes.
        self._lists: dict[int, _SourceLists] = {}
        self._plan_views: dict[int, torch.Tensor] = {}
        self._open_entry: int | None = None
        # Per entry what it holds (plan record, gather rows, registered tables, host
        # accepted rows): a repeated step rewrites neither header nor plan.
        self._held: dict[int | None, tuple] = {}
        self.registered: tuple[torch.Tensor, ...] = ()

    def register(self, tables: Sequence[torch.Tensor]) -> None:
        """Gather every step's slots of groups ``0 .. len(tables) - 1`` from ``tables``
        (int32 ``[rows, B]`` on the device) in the opening launch."""
        values = [t.data_ptr() for t in tables] + [t.stride(0) for t in tables]
        at = self.regions.tables // 2
        self._longs[at : at + len(values)] = torch.tensor(values, dtype=torch.int64)
        self.registered = tuple(tables)

    # --- a step ----------------------------------------------------------------------

    def claim(self) -> int | None:
        """The next staging entry's index (``None`` on the CPU: the one host entry)."""
        return None if self._ring is None else self._ring.claim()

    def spaces(self, index: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Where entry ``index`` (claimed) holds a step's plan, ``[>= plan capacity],
        int32``, and where its header holds the plan's summary (:data:`~stepplan.planner.SUMMARY`),
        ``[len(SUMMARY)], int32``: for a new plan to be packed into (from its start) and its
        summary with it, by the packer. The entry no longer counts as holding its old plan."""
        self._held.pop(index, None)
        entry = self._entries[index]
        return entry.plan, entry.summary

    def stage(
        self,
        index: int | None,
        record: Any,
        gather_rows: int,
        accepted_host: np.ndarray | None,
        *,
        packed: bool,
    ) -> None:
        """Write a step into entry ``index`` (claimed): its header words, the plan, and
        accepted counts given on the host (``[num_reqs]``; their device view is
        :meth:`accepted_view`). ``record`` is the step's plan record (its ``shape``, its
        ``split`` word: vLLM's decode rows of a step split by position, else -1; and
        ``pack(out, summary)`` writing its bytes and summary); ``packed``: its plan and
        summary were just packed into :meth:`spaces`. An entry that already holds this plan
        with these header words (only this buffer writes an entry, and plans are immutable)
        keeps them: a repeated step writes no plan."""
        entry = self._entries[index].words
        rows = 0 if accepted_host is None else record.shape.num_reqs
        held = (record, gather_rows, len(self.registered), rows)
        found = self._held.get(index)
        # The plan by identity: an equal plan packed anew is rewritten.
        if found is None or found[0] is not record or found[1:] != held[1:]:
            if not packed:
                record.pack(*self.spaces(index))
            _STEP_WORDS.pack_into(
                entry,
                4 * gather_kernels.SUMMARY_WORDS,
                gather_rows,
                record.shape.num_reqs,
                *held[2:],
                record.split,
            )
            self._held[index] = held
        if rows:
            entry[self.regions.accepted_host : self.regions.accepted_host + rows] = accepted_host[
                :rows
            ]
        if self._ring is not None:
            self._ring.stamp(index, gather_kernels.TICKET_WORD)
        self._open_entry = index

    def open(self, table: Any, query_start: Any, seq_lens: Any, accepted: Any, group: int) -> None:
        """Launch the staged step's opening kernel (``group``'s slots from ``table``; the
        engine's ``query_start_loc``, read for a step split by position)."""
        entry = self._entries[self._open_entry]
        if entry.done is None:
            gather_reference.open_step_reference(
                entry.tensor, self.words, table, query_start, seq_lens, accepted, group,
                self.query_len_max, self.registered,
            )  # fmt: skip
            return
        self._launcher.open_step(
            entry.tensor, entry.done, table, query_start, seq_lens, accepted, group
        )

    def slots(self, table: Any, group: int) -> None:
        """Gather a further group's slots into the open step."""
        if self._ring is None:
            gather_reference.group_slots_reference(self.words, table, group)
        else:
            self._launcher.group_slots(table, group)

    def accepted_view(self, rows: int) -> torch.Tensor:
        """``[rows], int32``: where :meth:`stage` put accepted counts given on the host."""
        return self.words[self.regions.accepted_host : self.regions.accepted_host + rows]

    def _new_entry(self, index: int | None) -> _Entry:
        """Staging entry ``index`` (on the CPU: one host entry, copied into the buffer by
        the reference as the kernel copies it), its fixed header words written."""
        done = None
        if self._ring is None:  # a host entry as on CUDA: the reference copies it
            tensor = torch.zeros(self.regions.staged, dtype=torch.int32)
            words = tensor.numpy()
        else:
            tensor, words = self._ring.host_int32(index, self.regions.staged)
            done = self._ring.done_word(index)
        words[gather_kernels.HEADER["stride"]] = self.regions.rows
        for word, region, unit in _SOURCE_WORDS:
            words[gather_kernels.HEADER[word]] = int(getattr(self.regions, region) * unit)
        regions = self.regions
        plan = words[regions.plan : regions.accepted_host]
        return _Entry(tensor, words, plan, words[: gather_kernels.SUMMARY_WORDS], done)

    # --- views -----------------------------------------------------------------------

    def part_views(self, keys: ShapeKeys) -> tuple[dict, tuple]:
        """For a step of these part keys (:func:`~.metadata_fields.shape_keys`): the row
        parts' views per layer group, a dict shared by every step of these row-part keys and
        filled by :meth:`row_views`, and the token lists' views (every group shares them). Per
        array field a view is a device view, ``None``, or a marker
        (:data:`~.metadata_fields.PASS_THROUGH`, :data:`~.metadata_fields.TABLE_COLUMNS`)."""
        rows_key = (keys[0], keys[1])
        rows = self._row_views.get(rows_key)
        if rows is None:
            rows = _remember(self._row_views, rows_key, {})
        if keys[2] is None:
            return rows, (None, None)
        # Looked up, not kept: a step drawn afresh has new token counts, and two lookups
        # cost less than a cache's miss.
        (spec_source, spec_length), (plain_source, plain_length) = self.revision.token_places(
            keys[2]
        )
        lists = self._source_lists(0)
        return rows, (lists[spec_source][spec_length], lists[plain_source][plain_length])

    def row_views(self, keys: ShapeKeys, group: int, into: dict) -> tuple:
        """The row parts' views of ``group`` (the revision's plain fields and the first four
        :data:`~.metadata_fields.SPEC_FIELDS`), made and kept in ``into``:
        :meth:`part_views`'s dict of ``keys``, which also keeps their places (under ``-1``,
        no group's) and where markers are (under :data:`MARKERS`: ``(index, marker)``
        pairs, for the build to fill in)."""
        places = into.get(_PLACES)
        if places is None:  # the same for every group: made by the first group's build
            places, into[MARKERS] = self.revision.row_places(keys[0], keys[1])
            into[_PLACES] = places
        into[group] = views = self._prefixes(places, group)
        return views

    def _prefixes(self, places: tuple[Any, ...], group: int) -> tuple[Any, ...]:
        """The view of each place (:data:`~.metadata_fields.Prefix`, or ``None``) for ``group``."""
        lists = self._source_lists(group)
        return tuple([None if place is None else lists[place[0]][place[1]] for place in places])

    def _source_lists(self, group: int) -> dict[str, Any]:
        """Per source, every prefix view of it (``group``'s slots for a slot source; for
        :data:`PASS_THROUGH`, the marker at every length), filled in at a source's first use."""
        lists = self._lists.get(group)
        if lists is None:
            lists = self._lists[group] = _SourceLists(self, group)
        return lists

    def _every_prefix(self, source: str, group: int) -> list[torch.Tensor]:
        """Every prefix of a source, made at its first use (a few milliseconds, once):
        slicing a tensor costs about a microsecond and a step may need fifteen new ones,
        while a source has at most a few thousand lengths."""
        regions = self.regions
        if source in SLOT_SOURCES:
            slots = _SLOTS_PER_GROUP * group + SLOT_SOURCES.index(source)
            at = regions.slots + slots * regions.rows
        else:
            at = getattr(regions, source)
        capacity = regions.rows + (source in _QUERY_STARTS)
        if source in ("spec_tokens", "plain_tokens", "ramp"):
            capacity = regions.num_tokens if source != "ramp" else regions.total - regions.ramp - 1
        dtype = SOURCE_DTYPES[source]
        if dtype is np.int64:
            whole = self._longs[at // 2 : at // 2 + capacity]
        elif dtype is np.bool_:
            whole = self._bytes[4 * at : 4 * at + capacity].view(torch.bool)
        else:
            whole = self.words[at : at + capacity]
        return [whole[:length] for length in range(capacity + 1)]

    def plan_buffer(self, size: int) -> torch.Tensor:
        """``[size], int32``: the plan in the buffer, at its fixed address (a view per size,
        kept: graph layouts recur)."""
        view = self._plan_views.get(size)
        if view is None:
            if len(self._plan_views) >= _CACHE_LIMIT:
                self._plan_views.clear()
            at = self.regions.plan
            view = self._plan_views[size] = self.words[at : at + size]
        return view


def _remember(cache: dict, key: Any, value: Any) -> Any:
    """``cache[key] = value``, the cache emptied first when it is full."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value
