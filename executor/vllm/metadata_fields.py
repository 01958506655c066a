"""What a ``PleShortConvAttentionMetadata`` field holds: a prefix of one *source*.

A source is one array (the slots of the spec rows, the query starts of the prefill rows,
...), and every array field of the metadata is the first ``length`` entries of one, so a
builder keeps one view per source and length. A revision of vLLM's builder
(:mod:`.revisions`) says which source and length each field is, or that the field is
unset. The drop-in builder (:mod:`.builder`) has its kernel fill the sources on the
device (:mod:`.gather_kernels`), so every field is a view of its persistent device
buffer; :func:`seed_view` fills them from a complete host plan (numpy arrays).

The row sources follow the plan's group-ordered rows ``[spec | decode | prefill]`` and
then padding rows, as far as the longest field needs (uniform batches are padded for
CUDA graphs, SPEC §3.4): the ``spec`` ones from the first row, the ``plain`` ones from the
first decode row, the ``prefill`` ones from the first prefill row. The ``engine`` sources
follow the engine's own row order instead, for the fields vLLM 0.33 takes by position
(its steps without spec rows): from engine row 0, or (``_p``) from the first row vLLM
counts as a prefill. Where a rule indexes by position and the engine's order is not
grouped (a zero-length row between spec rows), the group-ordered sources give the
by-mask value of SPEC §3.1 instead of the positional one; vLLM pads at the end, where
the two agree.

This module holds the seed's rules (an older revision of vLLM's builder, the one this
project started from): :func:`seed_counts_and_keys` and the part functions.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from stepplan.planner import SPEC, ExecutionPlan, PlannerConfig, PlanShape

#: The seed's array fields of its decode and prefill rows (and ``state_indices_tensor``).
PLAIN_FIELDS = (
    "state_indices_tensor",
    "state_indices_tensor_d",
    "state_indices_tensor_p",
    "num_computed_tokens_p",
    "query_start_loc_d",
    "query_start_loc_p",
    "non_spec_query_start_loc",
    "has_initial_states_d",
    "has_initial_states_p",
)
#: Fields set only where a step has spec rows: per row, then the token lists.
SPEC_FIELDS = (
    "spec_sequence_masks",
    "spec_state_indices_tensor",
    "spec_query_start_loc",
    "num_accepted_tokens",
    "spec_token_indx",
    "non_spec_token_indx",
)
#: The seed's array fields, in :class:`SeedShape` order: three parts, each a function of
#: a few counts (:func:`shape_keys`), so a builder keeps each part's views by its key.
ARRAY_FIELDS = PLAIN_FIELDS + SPEC_FIELDS
#: The host int fields, in :func:`seed_counts` order (every revision's).
COUNT_FIELDS = (
    "num_reqs",
    "num_actual_tokens",
    "num_spec_decodes",
    "num_spec_decode_tokens",
    "num_decodes",
    "num_decode_tokens",
    "num_prefills",
    "num_prefill_tokens",
    "spec_query_len",
    "max_prefill_query_len",
)
#: Per-row values only the device knows in vLLM (slots from each group's block table,
#: accepted counts, computed tokens ``seq_lens - query_lens`` and so the has-initial-
#: state flags): the builder gathers them there. Slot sources are per layer group; the
#: ``engine`` ones run over the engine's rows (``_p``: from vLLM's first prefill row).
SLOT_SOURCES = ("spec_slot", "plain_slot", "prefill_slot", "engine_slot", "engine_slot_p")
ROW_SOURCES = (
    *SLOT_SOURCES[:3],
    "accepted",
    "has_plain",
    "has_prefill",
    "computed_prefill",
)
#: By engine row: has-initial-state flags (``_p``: from vLLM's first prefill row), query
#: lengths and query starts (``_p``: shifted to start at that row), what vLLM 0.33 gives
#: a step without spec rows by position.
ENGINE_SOURCES = ("engine_has", "engine_has_p", "engine_qlen", "engine_qsl", "engine_qsl_p")
#: Values that follow from the plan (query starts per group, the spec mask by engine
#: row, the token lists as int64): the builder's kernel derives them from the plan it
#: copied, which costs the host nothing.
PLAN_SOURCES = ("spec_qsl", "non_spec_qsl", "qsl_p", "masks", "spec_tokens", "plain_tokens")
#: Marks a field that is the engine's own ``query_start_loc`` (filled in per build).
PASS_THROUGH = "query_start_loc"
#: Marks a field that is the engine's block table, its decode rows and ``1 + Q - 1``
#: columns (vLLM 0.33's ``state_indices_tensor_d`` without spec rows; filled in per build).
TABLE_COLUMNS = "block_table"
#: Every source's dtype; ``ramp`` is ``0, 1, 2, ...``.
SOURCE_DTYPES = {
    "spec_slot": np.int32,
    "plain_slot": np.int32,
    "prefill_slot": np.int32,
    "engine_slot": np.int32,
    "engine_slot_p": np.int32,
    "accepted": np.int32,
    "has_plain": np.bool_,
    "has_prefill": np.bool_,
    "computed_prefill": np.int32,
    "engine_has": np.bool_,
    "engine_has_p": np.bool_,
    "engine_qlen": np.int32,
    "engine_qsl": np.int32,
    "engine_qsl_p": np.int32,
    "spec_qsl": np.int32,
    "non_spec_qsl": np.int32,
    "qsl_p": np.int32,
    "masks": np.bool_,
    "spec_tokens": np.int64,
    "plain_tokens": np.int64,
    "ramp": np.int32,
}

#: ``(source, length)``: a field's values are ``source[:length]`` (a plain tuple: a step
#: makes fifteen of them, and a tuple costs a tenth of a frozen class); the source may be
#: a marker (:data:`PASS_THROUGH`, :data:`TABLE_COLUMNS`) that a build fills in.
Prefix = tuple[str, int]
#: A part's key (see :func:`shape_keys`).
PartKey = tuple[Any, ...] | None
#: :func:`shape_keys`' answer: the three parts' keys and ``N``.
ShapeKeys = tuple[PartKey, PartKey, PartKey, int]


@attrs.frozen
class GraphLimits:
    """Where a builder pads uniform batches for full CUDA graphs.

    Attributes:
        full_graphs: whether full graphs are captured at all.
        max_rows: the most rows of a uniform batch with a full graph.
        max_tokens: the most tokens of a pure spec batch with a full graph.
    """

    full_graphs: bool
    max_rows: int
    max_tokens: int

    @classmethod
    def of(cls, config: PlannerConfig) -> GraphLimits:
        """The limits of ``config``: ``min(max_num_seqs, largest size)`` rows and
        ``min(max_num_seqs * Q, largest size)`` tokens, full graphs unless its graph mode
        is ``none``."""
        rows, tokens = seed_graph_limits(config)
        return cls(config.graph_mode != "none", rows, tokens)


@attrs.frozen(eq=False)  # compared and hashed by identity: builders key caches by it
class SeedShape:
    """Which seed array fields a step sets, and where each lies.

    Attributes:
        fields: per :data:`ARRAY_FIELDS` entry, a :data:`Prefix` or ``None`` (unset).
        gather_rows: ``N``, group-ordered rows the row sources cover (from their
            first row): the plan's row capacity, or what the longest padded field needs.
    """

    fields: tuple[Prefix | None, ...]
    gather_rows: int


def seed_graph_limits(config: PlannerConfig) -> tuple[int, int]:
    """``(rows, tokens)``: the largest uniform batch the seed captures a full graph for,
    ``min(max_num_seqs, largest size)`` rows and ``min(max_num_seqs * Q, largest size)``
    tokens."""
    largest = config.sizes[-1]
    return min(config.max_num_seqs, largest), min(
        config.max_num_seqs * config.query_len_max, largest
    )


def _pads(
    config: PlannerConfig,
    limits: GraphLimits,
    engine_rows: int,
    spec: int,
    decode: int,
    prefill: int,
    tokens: int,
) -> tuple[int | None, int | None]:
    """Rows the seed pads a pure-spec and a pure-decode batch to (``None``: no padding),
    for a plan of these engine rows, rows per kind and spec ``tokens``.

    The seed pads only where it replays full graphs, uniform batches within ``limits``:
    spec rows to the engine's row count (its padding rows have no tokens), decode rows
    to the smallest graph size that holds them.
    """
    if prefill or (spec and decode) or not limits.full_graphs:  # not uniform: no pads
        return None, None
    if spec:
        fits = spec <= limits.max_rows and tokens <= limits.max_tokens
        return (engine_rows if fits else None), None
    if decode and decode <= limits.max_rows:
        return None, config.smallest_size(decode)
    return None, None


def shape_keys(plan: PlanShape) -> ShapeKeys:
    """The keys of the three parts of the seed fields of a plan of this shape, and ``N``
    (the rows the row sources cover): the decode and prefill fields' ``(has spec rows,
    decode rows, prefill rows, decode rows padded, engine rows)``, the spec rows' ``(spec
    rows, padded, engine rows)`` and the token lists' ``(pure spec, spec tokens,
    tokens)``; ``None`` for the last two without spec rows."""
    return seed_counts_and_keys(plan)[1]


def seed_counts(plan: PlanShape) -> tuple[int, ...]:
    """The seed's host counts of a plan of this shape, in :data:`COUNT_FIELDS` order."""
    return seed_counts_and_keys(plan)[0]


def seed_counts_and_keys(
    plan: PlanShape, limits: GraphLimits | None = None
) -> tuple[tuple[int, ...], ShapeKeys]:
    """:func:`seed_counts` and :func:`shape_keys` of a plan of this shape, in one pass
    over its fields (a builder's new step needs both); ``limits``: the config's."""
    config, engine_rows = plan.config, plan.num_reqs
    ns, nd, npf = plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows
    spec_tokens, decode_tokens = plan.num_spec_decode_tokens, plan.num_decode_tokens
    prefill_tokens = plan.num_prefill_tokens
    tokens = spec_tokens + decode_tokens + prefill_tokens
    counts = (
        engine_rows,
        plan.num_padded_tokens or tokens,
        ns,
        spec_tokens,
        nd,
        decode_tokens,
        npf,
        prefill_tokens,
        config.query_len_max,
        plan.max_prefill_query_len,
    )
    limits = limits or GraphLimits.of(config)
    spec_pad, decode_pad = _pads(config, limits, engine_rows, ns, nd, npf, spec_tokens)
    if not ns:
        decode_rows = decode_pad or nd
        rows = decode_rows if not npf else nd + npf
        plain = (0, nd, npf, decode_rows, engine_rows)
        return counts, (plain, None, None, max(plan.layout.num_rows, rows))
    spec_rows = spec_pad or ns
    spec = (ns, spec_rows, engine_rows)
    token_key = (int(not nd and not npf), spec_tokens, tokens)
    rows = max(plan.layout.num_rows, spec_rows)
    return counts, ((1, nd, npf, nd, engine_rows), spec, token_key, rows)


def plain_places(key: PartKey) -> dict[str, Prefix]:
    """The set decode and prefill fields of a part key (:data:`PLAIN_FIELDS` names): with
    spec rows the seed's own path (its decode and prefill fields where it has such rows;
    slot lists always, empty where the group is; nothing in a pure spec step), without
    the base builder's fields (decode slots and flags padded for a graph;
    ``non_spec_query_start_loc`` the engine's ``query_start_loc``)."""
    speculating, nd, npf, decode_rows, engine_rows = key
    fields: dict[str, Prefix] = {}
    if speculating:
        fields["state_indices_tensor"] = ("plain_slot", nd + npf)
        if nd or npf:
            fields["state_indices_tensor_d"] = ("plain_slot", nd)
            fields["state_indices_tensor_p"] = ("prefill_slot", npf)
            fields["non_spec_query_start_loc"] = ("non_spec_qsl", nd + npf + 1)
        if nd:
            fields["query_start_loc_d"] = ("non_spec_qsl", nd + 1)
    else:
        fields["non_spec_query_start_loc"] = (PASS_THROUGH, engine_rows + 1)
        # Decode slots only (padded for a graph), or every slot: decodes, then prefills.
        fields["state_indices_tensor"] = ("plain_slot", nd + npf if npf else decode_rows)
        if nd:
            fields["state_indices_tensor_d"] = ("plain_slot", decode_rows)
            fields["query_start_loc_d"] = ("ramp", nd + 1)  # one token per decode row
        if npf:
            fields["state_indices_tensor_p"] = ("prefill_slot", npf)
    if nd:
        fields["has_initial_states_d"] = ("has_plain", decode_rows)
    if npf:
        fields["has_initial_states_p"] = ("has_prefill", npf)
        fields["num_computed_tokens_p"] = ("computed_prefill", npf)
        fields["query_start_loc_p"] = ("qsl_p", npf + 1)
    return fields


def plain_part(key: PartKey) -> tuple[Prefix | None, ...]:
    """The :data:`PLAIN_FIELDS` of a part key, in order (:func:`plain_places`)."""
    return tuple(map(plain_places(key).get, PLAIN_FIELDS))


def spec_part(key: PartKey) -> tuple[Prefix | None, ...]:
    """The spec rows' fields (the first four :data:`SPEC_FIELDS`), padded for a graph."""
    if key is None:
        return (None,) * 4
    _, spec_rows, engine_rows = key
    return (
        ("masks", engine_rows),
        ("spec_slot", spec_rows),
        ("spec_qsl", spec_rows + 1),
        ("accepted", spec_rows),
    )


def token_part(key: PartKey) -> tuple[Prefix | None, ...]:
    """The token lists (the last two :data:`SPEC_FIELDS`): the identity and nothing in a
    pure spec step, else the token map split at the spec tokens, as int64."""
    if key is None:
        return (None, None)
    pure, spec_tokens, tokens = key
    if pure:
        return ("ramp", spec_tokens), ("ramp", 0)
    return ("spec_tokens", spec_tokens), ("plain_tokens", tokens - spec_tokens)


def seed_shape(plan: ExecutionPlan) -> SeedShape:
    """The seed's array fields of ``plan``, as prefixes of its sources (the rules)."""
    plain, spec, tokens, rows = shape_keys(plan.shape)
    return SeedShape(plain_part(plain) + spec_part(spec) + token_part(tokens), rows)


def plan_sources(plan: ExecutionPlan, rows: int) -> dict[str, np.ndarray]:
    """The plan sources (:data:`PLAN_SOURCES`), for ``rows`` gathered rows: what the
    builder's kernel derives from the plan it copies."""
    ns, live = plan.num_spec_rows, plan.num_rows
    first_prefill, spec_tokens = ns + plan.num_decode_rows, plan.num_spec_decode_tokens
    starts = plan.row_query_start[: live + 1]
    tokens = plan.token_map[: plan.num_tokens].astype(np.int64)
    return {
        "spec_qsl": starts[np.minimum(np.arange(rows + 1), ns)],  # padding rows: no tokens
        "non_spec_qsl": starts[ns:] - starts[ns],
        "qsl_p": starts[first_prefill:] - starts[first_prefill],
        "masks": plan.batch.kinds == SPEC,
        "spec_tokens": tokens[:spec_tokens],
        "plain_tokens": tokens[spec_tokens:],
    }


def row_sources(plan: ExecutionPlan, rows: int, group: int = 0) -> dict[str, np.ndarray]:
    """The row sources of a complete host plan over ``rows`` group-ordered rows (what the
    builder gathers on the device from the engine's tensors)."""
    live, ns = plan.num_rows, plan.num_spec_rows
    first_prefill = ns + plan.num_decode_rows
    slot = np.zeros(rows, np.int32)
    slot[:live] = plan.row_slot[group, :live]
    accepted = np.ones(rows, np.int32)
    accepted[:ns] = plan.row_num_accepted[:ns]
    computed = np.zeros(rows, np.int32)
    computed[ns:live] = plan.batch.num_computed_tokens[plan.row_request[ns:live]]
    return {
        "spec_slot": slot,
        "plain_slot": slot[ns:],
        "prefill_slot": slot[first_prefill:],
        "accepted": accepted,
        "has_plain": computed[ns:] > 0,
        "has_prefill": computed[first_prefill:] > 0,
        "computed_prefill": computed[first_prefill:],
    }


def seed_view(plan: ExecutionPlan, group: int = 0) -> dict[str, Any]:
    """The plan as the seed's ``PleShortConvAttentionMetadata`` fields, for layer group ``group``.

    Values are numpy arrays of the seed's dtypes (``int32``; masks ``bool``; the token
    lists of a mixed step ``int64``), ints, or ``None`` where the seed leaves a field
    unset; empty arrays where the seed gives empty tensors; graph padding included.
    ``plan`` must be complete (its slots, accepted counts and computed tokens real).
    """
    shape = seed_shape(plan)
    sources = row_sources(plan, shape.gather_rows, group) | plan_sources(plan, shape.gather_rows)
    longest = max(plan.num_tokens, shape.gather_rows) + 1
    sources["ramp"] = np.arange(longest, dtype=np.int32)
    sources[PASS_THROUGH] = np.asarray(plan.batch.query_start)
    view: dict[str, Any] = dict(zip(COUNT_FIELDS, seed_counts(plan.shape), strict=True))
    for name, place in zip(ARRAY_FIELDS, shape.fields, strict=True):
        view[name] = None if place is None else sources[place[0]][: place[1]]
    return view
