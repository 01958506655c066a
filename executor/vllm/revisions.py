"""Revisions of vLLM's PLE metadata builder: which field holds what, per revision.

The same plan laid out under two revisions' rules (``docs/vllm.md`` tabulates how they
differ):

- ``seed``: the builder this project started from (``/work/shared/seed``, an older
  revision of vLLM's), as :mod:`.metadata_fields` reads it. Rows are classified by
  their own masks everywhere.
- ``vllm-0.33``: vLLM 0.33.0's ``PleShortConvAttentionMetadataBuilder``. A step with
  spec rows follows the seed's rules, but a pure spec step leaves its token lists
  unset, and there is no ``num_computed_tokens_p``. A step without spec rows follows
  vLLM's base mamba builder: the engine's rows split *by position* at the first row
  that is a prefill (:func:`vllm_split`: more than one token, or a prompt chunk of one
  token without state), so graph padding rows count as decodes or prefills and the
  fields are slices of the engine's own rows; ``state_indices_tensor_d`` is the block
  table's decode rows, ``1 + num_spec_tokens`` columns wide.

Which revision a builder follows is named (:func:`revision`), or taken from the
installed vLLM's version (:func:`revision_for_vllm`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import attrs
import numpy as np

from stepplan.planner import PlanShape

from .metadata_fields import (
    COUNT_FIELDS,
    PASS_THROUGH,
    PLAIN_FIELDS,
    SPEC_FIELDS,
    TABLE_COLUMNS,
    GraphLimits,
    PartKey,
    Prefix,
    ShapeKeys,
    plain_places,
    seed_counts_and_keys,
    spec_part,
    token_part,
)

#: The engine's own tensors a build hands on as they are, after the array fields.
ENGINE_FIELDS = ("query_start_loc", "seq_lens", "num_decode_draft_tokens_cpu")
#: A step's split by position (vLLM 0.33 without spec rows): ``(num_decodes,
#: num_decode_tokens, max_prefill_query_len)``.
Split = tuple[int, int, int]


@attrs.frozen(eq=False)  # compared and hashed by identity: shares key caches by it
class Revision:
    """One revision's metadata: its fields and the rules that place them.

    Attributes:
        name: what users call it (``seed``, ``vllm-0.33``).
        plain_fields: its array fields of decode and prefill rows (:data:`PLAIN_FIELDS`,
            less those it lacks).
        unset_fields: fields it has that a build never sets (``None``).
        splits_by_position: a step without spec rows is split by position
            (:func:`vllm_split`), not by each row's own mask.
        empty_pure_spec_tokens: a pure spec step leaves the token lists unset (else:
            the identity and an empty list).
    """

    name: str
    plain_fields: tuple[str, ...]
    unset_fields: tuple[str, ...]
    splits_by_position: bool
    empty_pure_spec_tokens: bool

    @property
    def array_fields(self) -> tuple[str, ...]:
        """Its array fields, in the order of :meth:`row_places` then the token lists."""
        return self.plain_fields + SPEC_FIELDS

    @property
    def field_names(self) -> tuple[str, ...]:
        """Every field a build sets or hands on, in a metadata tuple's order: counts,
        arrays, the engine's own tensors (the unset fields follow a build's own)."""
        return COUNT_FIELDS + self.array_fields + ENGINE_FIELDS

    def counts_and_keys(
        self, shape: PlanShape, limits: GraphLimits, split: Split | None = None
    ) -> tuple[tuple[int, ...], ShapeKeys]:
        """The counts (:data:`COUNT_FIELDS` order) and part keys of a plan of this shape;
        ``split`` (:func:`vllm_split`) where :meth:`needs_split` says so."""
        if split is not None:
            return _split_counts_and_keys(shape, split)
        counts, keys = seed_counts_and_keys(shape, limits)
        if self.empty_pure_spec_tokens and keys[2] is not None and keys[2][0]:
            keys = (keys[0], keys[1], None, keys[3])
        return counts, keys

    def needs_split(self, shape: PlanShape) -> bool:
        """Whether a step of this shape takes :func:`vllm_split`'s split."""
        return self.splits_by_position and not shape.num_spec_rows

    def row_places(
        self, plain_key: PartKey, spec_key: PartKey
    ) -> tuple[tuple[Prefix | None, ...], tuple[tuple[int, str], ...]]:
        """The places of :attr:`plain_fields` and the first four :data:`SPEC_FIELDS`, and
        the ``(index, marker)`` of each that is the engine's own tensor (a build fills
        those in; only steps without spec rows have any)."""
        if plain_key[0] == _BY_POSITION:
            found, accepted = _by_position_places(plain_key)
            places = (*map(found.get, self.plain_fields), None, None, None, accepted)
        else:
            places = (*map(plain_places(plain_key).get, self.plain_fields), *spec_part(spec_key))
            if spec_key is not None:
                return places, ()
        markers = tuple(
            (index, place[0])
            for index, place in enumerate(places)
            if place is not None and place[0] in (PASS_THROUGH, TABLE_COLUMNS)
        )
        return places, markers

    def token_places(self, token_key: PartKey) -> tuple[Prefix | None, ...]:
        """The places of the two token lists."""
        return token_part(token_key)


_BY_POSITION = "by position"


def _split_counts_and_keys(shape: PlanShape, split: Split) -> tuple[tuple[int, ...], ShapeKeys]:
    """vLLM 0.33's counts and keys of a step without spec rows, split by position."""
    decodes, decode_tokens, longest = split
    rows, tokens = shape.num_reqs, shape.num_padded_tokens or shape.num_tokens
    prefills = rows - decodes
    speculating = shape.config.num_spec_tokens > 0
    counts = (
        rows,
        tokens,
        0,
        0,
        decodes,
        decode_tokens,
        prefills,
        tokens - decode_tokens,
        shape.config.query_len_max,
        longest,
    )
    plain = (_BY_POSITION, decodes, prefills, rows, speculating)
    return counts, (plain, None, None, shape.layout.num_rows)


def _by_position_places(key: tuple) -> tuple[dict[str, Prefix], Prefix | None]:
    """The fields of a step split by position: engine-ordered sources, the engine's own
    query starts and block table; and the accepted counts' place (speculating only)."""
    _, decodes, prefills, rows, speculating = key
    places: dict[str, Prefix] = {
        "state_indices_tensor": ("engine_slot", rows),
        "state_indices_tensor_d": (TABLE_COLUMNS, decodes),
        "state_indices_tensor_p": ("engine_slot_p", prefills),
        "non_spec_query_start_loc": (PASS_THROUGH, rows + 1),
    }
    accepted = None
    if decodes:
        places["has_initial_states_d"] = ("engine_has", decodes)
        if speculating:  # a decode row's accepted count is its query length
            places["query_start_loc_d"] = ("engine_qsl", decodes + 1)
            accepted = ("engine_qlen", decodes)
    if prefills:
        places["has_initial_states_p"] = ("engine_has_p", prefills)
        places["query_start_loc_p"] = ("engine_qsl_p", prefills + 1)
    return places, accepted


def vllm_split(
    query_start: np.ndarray, rows: int, tokens: int, is_prefilling: Any, seq_lens_upper: Any
) -> Split:
    """vLLM 0.33's split of a step without spec rows, from host data alone.

    The decodes are the rows before the first prefill: a row of more than one token, or
    one still prefilling (``is_prefilling``), unless it is a single token with state
    before it (``seq_lens_upper > 1``), which vLLM updates as a decode. Every row from
    there on counts as a prefill, zero-length padding rows included; without a prefill
    every row is a decode and the decode tokens are all ``tokens`` (padded).

    Args:
        query_start: ``[>= rows + 1]`` the engine's host query starts.
        rows: ``num_reqs``.
        tokens: ``num_actual_tokens``.
        is_prefilling: ``[>= rows]`` bool, host (``CommonAttentionMetadata``'s).
        seq_lens_upper: ``[>= rows]`` host (``seq_lens_cpu_upper_bound``).

    Returns:
        ``(num_decodes, num_decode_tokens, max_prefill_query_len)``.
    """
    # A handful of numpy calls whatever the rows: each costs about a microsecond here,
    # so the rule is applied to the few rows that can change the answer, not to all.
    starts = np.asarray(query_start)[: rows + 1]
    lengths = starts[1:] - starts[:-1]
    longer = lengths > 1
    first = int(longer.argmax())
    if not longer[first]:
        first = rows
    # Before the first longer row, only a row still prefilling (one token or none) can be
    # a prefill: unless vLLM updates it as a decode.
    waiting = np.asarray(is_prefilling)[:first].nonzero()[0]
    if waiting.size:
        upper = np.asarray(seq_lens_upper)[waiting]
        found = waiting[(lengths[waiting] != 1) | (upper <= 1)]
        if found.size:
            first = int(found[0])
    if first == rows:
        return rows, tokens, 0
    return first, int(starts[first]), int(lengths[first:].max())


SEED = Revision(
    name="seed",
    plain_fields=PLAIN_FIELDS,
    unset_fields=(
        "nums_dict",
        "batch_ptr",
        "token_chunk_offset_ptr",
        "block_idx_last_scheduled_token",
        "block_idx_first_scheduled_token_p",
        "block_idx_last_computed_token",
        "block_idx_last_scheduled_token_prev_step",
    ),
    splits_by_position=False,
    empty_pure_spec_tokens=False,
)
VLLM_0_33 = Revision(
    name="vllm-0.33",
    plain_fields=tuple(name for name in PLAIN_FIELDS if name != "num_computed_tokens_p"),
    # The causal_conv1d, chunked-scan and ReplaySSM fields of the base mamba metadata,
    # and the prefill checkpoints of mamba_cache_mode "align" (refused by the plugin).
    unset_fields=(
        "cu_chunk_seqlen_p",
        "last_chunk_indices_p",
        "nums_dict",
        "batch_ptr",
        "token_chunk_offset_ptr",
        "write_pos_d",
        "is_flush_d",
        "bc_pre_scratch",
        "replayssm_scratch",
        "replayssm_state_indices_d",
        "checkpoint",
    ),
    splits_by_position=True,
    empty_pure_spec_tokens=True,
)
#: Every revision by name.
REVISIONS = MappingProxyType({r.name: r for r in (SEED, VLLM_0_33)})
#: vLLM releases (``major.minor``) and the revision each follows.
VLLM_RELEASES = MappingProxyType({"0.33": VLLM_0_33})


def revision(name: str) -> Revision:
    """The revision called ``name`` (one of :data:`REVISIONS`); ``ValueError`` else."""
    found = REVISIONS.get(name)
    if found is None:
        raise ValueError(f"revision: must be one of {tuple(REVISIONS)}, got {name!r}")
    return found


def revision_for_vllm(version: str) -> Revision:
    """The revision of the vLLM release ``version`` (``0.33.0``, ``0.33.1.dev3``, ...);
    ``ValueError`` naming the supported releases for any other."""
    release = ".".join(version.split("+")[0].split(".")[:2])
    found = VLLM_RELEASES.get(release)
    if found is None:
        raise ValueError(
            f"vLLM {version}: stepplan's builder follows vLLM {', '.join(VLLM_RELEASES)}.x "
            "only (its metadata rules differ between releases)"
        )
    return found
