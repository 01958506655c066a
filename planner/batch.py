"""One step's request set, as the engine hands it over."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from .errors import PlanError
from .layout import batch_buffer_arrays, batch_buffer_size
from .native import installed_packer

#: Row kinds, in group order. Padding rows (not spec, ``q == 0``) join no group.
SPEC, DECODE, PREFILL, PADDING = 0, 1, 2, 3
KIND_NAMES = ("spec", "decode", "prefill", "padding")
_BAD_SPEC = 4  # a spec row whose query length is not num_draft_tokens + 1


def _constant(value: int, dtype: type = np.int32) -> np.ndarray:
    """A read-only 0-d array: numpy's cheapest operand (a Python int costs a conversion)."""
    array = np.array(value, dtype=dtype)
    array.flags.writeable = False
    return array


_THREE = _constant(3, np.uint32)
_SIGN_SHIFT = _constant(31)
# Row kind by key ``min(q - drafts, 3) ^ (drafts >> 31)`` (the min taken unsigned, so a
# negative difference counts as 3): a spec row (drafts >= 0) keys ``q - drafts`` itself,
# 1 when valid; a non-spec row keys ``~min(q + 1, 3)``, -2, -3, -4 for q = 0, 1, >= 2.
_KIND_OF_KEY = np.array(  # int8: the lookup hands back the kinds array as stored
    [_BAD_SPEC, SPEC, _BAD_SPEC, _BAD_SPEC, PREFILL, DECODE, PADDING, _BAD_SPEC],
    dtype=np.int8,
)
_KIND_OF_KEY.flags.writeable = False
_INT32 = np.dtype(np.int32)
_INT8 = np.dtype(np.int8)
_INPUTS = (
    "query_lens",
    "num_computed_tokens",
    "slots",
    "num_draft_tokens",
    "num_accepted_tokens",
)
_INT32_MAX = 2**31 - 1
_COUNT_TYPES = (int, type(None))


def _int32_array(field: str, value: object, ndim: int) -> np.ndarray:
    """``value`` as an int32 array of ``ndim`` dimensions: ``value`` itself when it is one
    (StepBatch copies every field after its converters, all at once), else converted."""
    if type(value) is np.ndarray and value.dtype == _INT32 and value.ndim == ndim:
        return value  # fast path: what engines pass every step
    return _checked_int_array(field, value, ndim)


def _int32_field(field: str) -> Callable[[object], np.ndarray]:
    """The converter of 1-D field ``field``: one call per field (attrs calls it per step).
    An int32 array passes as it is: StepBatch copies every field after its converters."""

    def convert(value: object) -> np.ndarray:
        if type(value) is np.ndarray and value.dtype is _INT32 and value.ndim == 1:
            return value
        return _int32_array(field, value, 1)

    return convert


#: What an array of each numpy kind holds, for the error that refuses it.
_KIND_WORDS = {
    "b": "booleans",
    "U": "strings",
    "S": "bytes",
    "c": "complex numbers",
    "M": "datetimes",
    "m": "time spans",
    "V": "raw records",
}


def _checked_int_array(field: str, value: object, ndim: int | None) -> np.ndarray:
    """``value`` as a fresh int32 array of ``ndim`` dimensions (``None``: 1 or 2), or a
    :class:`PlanError` naming ``field`` that says in words what is wrong with it."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().to("cpu").numpy()  # type: ignore[attr-defined]
    try:
        array = np.asarray(value)
    except ValueError:  # numpy's word for lists of unequal lengths
        raise PlanError(
            field, None, "must be a rectangular array of integers, got rows of unequal lengths"
        ) from None
    except TypeError:
        raise PlanError(field, None, f"must be integers, got {_type_of(value)}") from None
    if array.size and array.dtype.kind not in "iu":
        array = _integers_of(field, array)
    if ndim is None:
        ndim = 1 if array.ndim == 1 else 2
    if array.ndim != ndim:
        raise PlanError(field, None, f"must be {ndim}-D, got shape {list(array.shape)}")
    if array.size and (array.max() > _INT32_MAX or array.min() < -_INT32_MAX):
        raise PlanError(field, None, "values do not fit int32")
    return np.array(array, dtype=np.int32)


def _integers_of(field: str, array: np.ndarray) -> np.ndarray:
    """A non-empty array that is not of an integer dtype: its whole floats (exactly), or
    the error naming what it holds instead."""
    kind = array.dtype.kind
    if kind == "f":
        whole = np.isfinite(array) & (array == np.round(array))
        if not whole.all():
            bad = array.flat[int(np.argmin(whole.ravel()))]
            raise PlanError(field, None, f"must be integers, got {bad} (not a whole number)")
        if array.max() > _INT32_MAX or array.min() < -_INT32_MAX:  # before the cast wraps
            raise PlanError(field, None, "values do not fit int32")
        return array.astype(np.int64)
    if kind != "O":
        raise PlanError(field, None, f"must be integers, got {_KIND_WORDS.get(kind, kind)}")
    for item in array.flat:  # objects: name the first that is not an integer
        if isinstance(item, (bool, np.bool_)):
            raise PlanError(field, None, "must be integers, got booleans")
        if not isinstance(item, (int, np.integer)):
            what = "None" if item is None else _KIND_WORDS.get(np.asarray(item).dtype.kind)
            raise PlanError(field, None, f"must be integers, got {what or _type_of(item)}")
    raise PlanError(field, None, "values do not fit int32")  # Python ints past int64


def _type_of(value: object) -> str:
    return f"values of type {type(value).__name__}"


def _slots_array(value: object) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value[None]
    elif not isinstance(value, np.ndarray):
        array = _checked_int_array("slots", value, None)
        value = array[None] if array.ndim == 1 else array
    return _int32_array("slots", value, 2)


def _check_scalars(batch: StepBatch) -> None:
    """The fields that are not arrays: counts are integers or ``None``, the flag a bool."""
    for name in ("num_padded_rows", "num_padded_tokens"):
        value = getattr(batch, name)
        if value is not None and (
            not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_))
        ):
            raise PlanError(name, None, f"must be an integer or None, got {value!r}")
    flag = batch.allow_null_slots
    if not isinstance(flag, (bool, np.bool_)):
        raise PlanError("allow_null_slots", None, f"must be True or False, got {flag!r}")


#: The installed extension, for StepBatch's compiled check: a batch has no Planner to
#: take a packer from, so it uses what the install built (or numpy, where nothing).
_INSTALLED = installed_packer()


def native_check() -> Callable[..., tuple[int, int, int, int] | None] | None:
    """The compiled check (``check_batch`` of the packer extension, ``csrc/check.c``):
    StepBatch's copies, checks and derived fields in one pass, or ``None`` where the
    extension is not installed (then numpy checks, quietly: a Planner already warns).
    Tests replace this function to compare the two paths."""
    return None if _INSTALLED is None else _INSTALLED.check_batch


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


@attrs.frozen(eq=False)
class StepBatch:
    """One step's request set, validated on construction (SPEC §3.6).

    Rows are the engine's requests in the engine's order; padding rows are
    allowed (not spec, query length 0). Array fields take integer arrays, torch
    tensors or lists (whole floats pass; booleans, strings, None and ragged lists
    are refused with a :class:`PlanError` naming the field).

    Attributes:
        query_lens: ``[R], int32`` tokens scheduled this step per row.
        num_computed_tokens: ``[R], int32`` tokens already folded into state.
        slots: ``[G, R], int32`` one conv-state slot per row per layer group
            (a 1-D input means one group). Slot 0 is NULL. Padding rows' slots
            are ignored (vLLM marks them ``-1``).
        num_draft_tokens: ``[R], int32`` drafts of a spec row, ``-1`` otherwise.
        num_accepted_tokens: ``[R], int32`` tokens accepted of a spec row's
            previous step (1..Q); ignored on other rows.
        num_padded_rows: rows the engine padded its request arrays to
            (``>= R``), or ``None``.
        num_padded_tokens: tokens the engine padded its inputs to
            (``>= sum(query_lens)``), or ``None``.
        allow_null_slots: let live rows sit on slot 0, as engines that pad
            decode graphs with one-token NULL rows do; such rows write no state.
        kinds: ``[R], int8`` derived row kind (:data:`SPEC`, :data:`DECODE`,
            :data:`PREFILL`, :data:`PADDING`).
        kind_counts: rows of each kind, in that order.
        query_start: ``[R + 1], int32`` derived engine token offsets: row ``r``'s
            tokens are the engine's token rows ``query_start[r] : query_start[r + 1]``.
    """

    query_lens: np.ndarray = attrs.field(converter=_int32_field("query_lens"))
    num_computed_tokens: np.ndarray = attrs.field(converter=_int32_field("num_computed_tokens"))
    slots: np.ndarray = attrs.field(converter=_slots_array)
    num_draft_tokens: np.ndarray = attrs.field(converter=_int32_field("num_draft_tokens"))
    num_accepted_tokens: np.ndarray = attrs.field(converter=_int32_field("num_accepted_tokens"))
    num_padded_rows: int | None = None
    num_padded_tokens: int | None = None
    allow_null_slots: bool = False
    kinds: np.ndarray = attrs.field(init=False)
    kind_counts: tuple[int, int, int, int] = attrs.field(init=False)
    query_start: np.ndarray = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # The converters left the caller's int32 arrays as they are: both paths copy them.
        if not (
            type(self.num_padded_rows) in _COUNT_TYPES
            and type(self.num_padded_tokens) in _COUNT_TYPES
            and type(self.allow_null_slots) is bool
        ):  # one cheap test for what engines pass; the rest is looked at closely
            _check_scalars(self)
        check = native_check()
        if check is None or not self._adopt_checked(check):  # numpy checks, names errors
            self._freeze_inputs()
            self._check_shapes()
            self._derive_with_numpy()
        self._check_padding()

    def _adopt_checked(self, check: Callable[..., tuple[int, int, int, int] | None]) -> bool:
        """Copies, checks and derived fields by one call of ``check`` (:func:`native_check`);
        whether the batch passed (if not, nothing is set). The copies share one read-only
        buffer laid out as :data:`~.layout.BATCH_FIELDS` says."""
        rows, groups = self.query_lens.shape[0], self.slots.shape[0]
        data, kinds = np.empty(batch_buffer_size(rows, groups), _INT32), np.empty(rows, _INT8)
        counts = check(
            self.query_lens,
            self.num_computed_tokens,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            self.slots,
            self.allow_null_slots,
            data,
            kinds,
        )
        if counts is None:
            return False
        data.setflags(write=False)  # and so its slices
        kinds.setflags(write=False)
        setattr_ = object.__setattr__
        lens, computed, drafts, accepted, slots, starts = batch_buffer_arrays(data, rows, groups)
        setattr_(self, "query_lens", lens)
        setattr_(self, "num_computed_tokens", computed)
        setattr_(self, "num_draft_tokens", drafts)
        setattr_(self, "num_accepted_tokens", accepted)
        setattr_(self, "slots", slots)
        setattr_(self, "query_start", starts)
        setattr_(self, "kinds", kinds)
        setattr_(self, "kind_counts", counts)
        return True

    def _freeze_inputs(self) -> None:
        """Read-only copies of the input arrays (the copies keep later edits by the caller
        out)."""
        for name in _INPUTS:
            array = getattr(self, name).copy()
            array.setflags(write=False)
            object.__setattr__(self, name, array)

    def _derive_with_numpy(self) -> None:
        """The checks (after the shapes') and derived fields that ``native_check`` computes:
        its specification, and the author of every error it finds."""
        # Each check is one cheap vectorized pass; only a failing one looks for the row.
        q, drafts = self.query_lens, self.num_draft_tokens
        if q.shape[0]:
            computed = self.num_computed_tokens
            if (
                q.item(q.argmin()) < 0
                or computed.item(computed.argmin()) < 0
                or drafts.item(drafts.argmin()) < -1
            ):
                self._raise_negative()
        object.__setattr__(self, "query_start", self._token_offsets())
        key = np.minimum((q - drafts).view(np.uint32), _THREE).view(np.int32)
        kinds = _KIND_OF_KEY.take(key ^ (drafts >> _SIGN_SHIFT))
        counts = np.bincount(kinds, minlength=5).tolist()
        if counts[_BAD_SPEC]:
            self._raise_spec_length(drafts >= 0)
        kinds.setflags(write=False)
        object.__setattr__(self, "kinds", kinds)
        object.__setattr__(self, "kind_counts", tuple(counts[:4]))
        self._check_slots(None if counts[PADDING] == 0 else kinds != PADDING)

    @property
    def num_rows(self) -> int:
        """``R``: rows the engine passed, padding rows included."""
        return int(self.query_lens.shape[0])

    @property
    def num_groups(self) -> int:
        """``G``: layer groups (rows of :attr:`slots`)."""
        return int(self.slots.shape[0])

    @property
    def num_tokens(self) -> int:
        """Live tokens: ``sum(query_lens)``."""
        return int(self.query_start[-1])

    def _check_shapes(self) -> None:
        rows = self.query_lens.shape[0]
        for name in ("num_computed_tokens", "num_draft_tokens", "num_accepted_tokens"):
            got = getattr(self, name).shape[0]
            if got != rows:
                raise PlanError(name, None, f"has {got} rows, query_lens has {rows}")
        if self.slots.shape[1] != rows:
            raise PlanError("slots", None, f"must be [G, {rows}], got {list(self.slots.shape)}")
        if self.slots.shape[0] < 1:
            raise PlanError("slots", None, "needs at least one layer group")

    def _token_offsets(self) -> np.ndarray:
        """``[R + 1], int32`` running total of the (non-negative) query lengths."""
        q = self.query_lens
        offsets = np.empty(q.shape[0] + 1, dtype=np.int32)
        offsets[0] = 0
        if q.shape[0]:
            np.add.accumulate(q, 0, None, offsets[1:])
            # A total past int32 wraps, and its first wrapped partial sum is negative.
            if offsets.item(offsets.argmin()) < 0:
                raise PlanError("query_lens", None, f"total {q.sum()} tokens do not fit int32")
        offsets.setflags(write=False)
        return offsets

    def _raise_negative(self) -> None:
        for name, array, low in (
            ("query_lens", self.query_lens, 0),
            ("num_computed_tokens", self.num_computed_tokens, 0),
            ("num_draft_tokens", self.num_draft_tokens, -1),
        ):
            if (array < low).any():
                row = _first(array < low)
                raise PlanError(name, row, f"must be >= {low}, got {array[row]}")

    def _raise_spec_length(self, spec: np.ndarray) -> None:
        q, drafts = self.query_lens, self.num_draft_tokens
        row = _first(spec & (q != drafts + 1))
        raise PlanError(
            "query_lens",
            row,
            f"spec row must schedule num_draft_tokens + 1 = {drafts[row] + 1} tokens, got {q[row]}",
        )

    def _check_slots(self, live: np.ndarray | None) -> None:
        """No negative slot; no live row on slot 0; no slot on two live rows of a group.

        ``live`` is ``None`` when every row is live (no copy needed then).
        """
        slots = self.slots if live is None else self.slots[:, live]
        rows = slots.shape[1]
        if rows == 0:
            return
        ordered = np.sort(slots, axis=1)
        first = ordered[:, 0]
        lowest = first.item(first.argmin())
        if lowest < 0:
            self._raise_negative_slot(slots, live)
        if lowest == 0 and not self.allow_null_slots:
            self._raise_null_slot(live)
        if rows == 1:
            return
        # Neighbours in one flat pass; the pairs that straddle two groups don't count.
        flat = ordered.ravel()
        same = flat[1:] == flat[:-1]
        same[rows - 1 :: rows] = False
        if same.item(same.argmax()):
            repeated = ordered[:, 1:] == ordered[:, :-1]
            if np.count_nonzero(repeated & (ordered[:, 1:] != 0)):  # NULL may repeat
                self._raise_repeated_slot(ordered, repeated, live)

    def _raise_negative_slot(self, slots: np.ndarray, live: np.ndarray | None) -> None:
        """``slots`` are the live columns; padding rows (vLLM's -1) are never searched."""
        column, group = np.argwhere(slots.T < 0)[0]
        row = int(column if live is None else np.flatnonzero(live)[column])
        raise PlanError("slots", row, f"negative slot {slots[group, column]} in group {group}")

    def _raise_null_slot(self, live: np.ndarray | None) -> None:
        live = np.ones(self.num_rows, dtype=bool) if live is None else live
        row = _first(live & (self.slots == 0).any(axis=0))
        group = _first(self.slots[:, row] == 0)
        raise PlanError("slots", row, f"live row sits on the NULL slot 0 in group {group}")

    def _raise_repeated_slot(
        self, ordered: np.ndarray, repeated: np.ndarray, live: np.ndarray | None
    ) -> None:
        live = np.ones(self.num_rows, dtype=bool) if live is None else live
        group, pos = np.argwhere(repeated & (ordered[:, 1:] != 0))[0]
        slot = ordered[group, pos]
        rows = np.flatnonzero(live & (self.slots[group] == slot))
        raise PlanError(
            "slots",
            int(rows[1]),
            f"slot {slot} of group {group} is already used by live row {rows[0]}",
        )

    def _check_padding(self) -> None:
        rows, tokens = self.num_padded_rows, self.num_padded_tokens
        if rows is not None and rows < self.num_rows:
            raise PlanError(
                "num_padded_rows",
                None,
                f"{rows} is fewer than the {self.num_rows} rows",
            )
        if tokens is not None and tokens < self.num_tokens:
            raise PlanError(
                "num_padded_tokens",
                None,
                f"{tokens} is fewer than the {self.num_tokens} tokens",
            )


def host_ints(values: Any) -> Any:
    """``values`` itself, or for an ``(address, items)`` tuple a read-only ``[items],
    int32`` array over that host memory, which the caller vouches for (keeps alive and
    sized). The compiled packer takes such tuples straight (a CPU tensor's ``data_ptr()``
    and ``numel()``: no ``numpy()`` view made); the Python paths read them through this."""
    if type(values) is not tuple:
        return values
    if len(values) != 2 or not all(type(value) is int for value in values):
        raise ValueError(f"host ints: must be an (address, items) tuple of ints, got {values!r}")
    address, items = values
    if items < 0 or (address == 0 and items > 0):  # the compiled packer refuses these too
        raise ValueError(f"host ints: no {items} items at address {address}")
    if items == 0:
        return np.zeros(0, np.int32)
    array = np.frombuffer((ctypes.c_int32 * items).from_address(address), np.int32)
    array.flags.writeable = False
    return array


def host_step_batch(
    query_start: np.ndarray,
    num_draft_tokens: np.ndarray | None,
    num_reqs: int,
    *,
    num_padded_tokens: int | None = None,
    num_groups: int = 1,
) -> StepBatch:
    """The batch of a step known on the host by its query starts and drafts alone, as an
    engine that keeps the rest on the device hands it over (vLLM): row ``r`` has
    ``query_start[r + 1] - query_start[r]`` tokens and ``num_draft_tokens[r]`` drafts
    (``None``: no spec row), and placeholders where the host does not know: no computed
    tokens, one accepted token, NULL slots (``allow_null_slots``).

    Args:
        query_start: ``[>= num_reqs + 1]`` integers (the first ``num_reqs + 1`` are read),
            or a :func:`host_ints` tuple.
        num_draft_tokens: ``[>= num_reqs]`` integers, ``>= 0`` on spec rows, or ``None``
            (or a :func:`host_ints` tuple).
        num_reqs: ``R``, rows (padding rows included).
        num_padded_tokens: as :class:`StepBatch`'s.
        num_groups: ``G``, layer groups.
    """
    starts = np.asarray(host_ints(query_start))
    if starts.ndim != 1 or starts.shape[0] < num_reqs + 1:
        raise PlanError("query_start", None, f"needs num_reqs + 1 = {num_reqs + 1} entries")
    starts = starts[: num_reqs + 1].astype(np.int64)
    drafts = np.full(num_reqs, -1, np.int64)
    if num_draft_tokens is not None:
        drafts = np.asarray(host_ints(num_draft_tokens))
        if drafts.ndim != 1 or drafts.shape[0] < num_reqs:
            raise PlanError("num_draft_tokens", None, f"needs num_reqs = {num_reqs} entries")
        drafts = drafts[:num_reqs]
    return StepBatch(
        np.diff(starts),
        np.zeros(num_reqs, np.int32),
        np.zeros((num_groups, num_reqs), np.int32),
        drafts,
        np.ones(num_reqs, np.int32),
        num_padded_tokens=num_padded_tokens,
        allow_null_slots=True,
    )
