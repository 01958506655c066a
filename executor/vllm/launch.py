"""Launches of :mod:`.door`'s kernels past Triton's per-launch dispatch.

Triton's ``kernel[grid](...)`` binds the arguments, computes the variant's key and looks
it up on every launch; its compiled kernel's launcher then asks for every tensor
argument's ``data_ptr`` and has the driver check (and translate) each address. The door's
launches repeat one variant with the same buffer, so :class:`Launcher` calls that
launcher straight, with the addresses as ints.
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import torch
import triton

from .door import _BLOCK, _group_slots, _open_step

#: Triton from 3.3 on hands a compiled kernel's launcher every argument, constexprs too.
_DIRECT_LAUNCHES = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 3)
_CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 2  # the CUDA driver API's enum value


def mapped_device_pointer(tensor: torch.Tensor) -> int | None:
    """The device address of pinned host memory ``tensor`` (what Triton's launcher asks
    the driver for on every launch of a tensor argument), or ``None`` where the driver
    cannot say (then the tensor itself is passed and Triton asks)."""
    try:
        import ctypes

        driver = ctypes.CDLL("libcuda.so.1")
        address = ctypes.c_uint64(0)
        status = driver.cuPointerGetAttribute(
            ctypes.byref(address),
            ctypes.c_int(_CU_POINTER_ATTRIBUTE_DEVICE_POINTER),
            ctypes.c_uint64(tensor.data_ptr()),
        )
    except (OSError, AttributeError):
        return None
    return int(address.value) if status == 0 and address.value else None


class Launcher:
    """The door's two kernels on one buffer, launched past Triton's per-launch dispatch.

    A variant's first launch (:func:`_specialization`) goes through Triton, which
    compiles it; later ones call the compiled kernel's launcher on the current stream
    (Triton >= 3.3; before, every launch goes through Triton), which skips Triton's
    argument binding, cache lookup and global checks: microseconds per launch. Pointers
    go to that launcher as ints (the buffer's once; the engine's tensors' per launch,
    after checking they are on a CUDA device; a pinned entry's device address asked of
    the driver once per entry), which spares it a ``data_ptr`` call and a driver query
    per pointer. Launch hooks that Triton's profilers install are not called on that path.

    Args:
        words: the buffer, ``[W], int32`` on a CUDA device (``W`` even).
        query_len_max: ``Q``.
        direct: launch past Triton's dispatch where Triton allows it.
    """

    def __init__(self, words: torch.Tensor, query_len_max: int, *, direct: bool = True) -> None:
        self.words, self.query_len_max = words, query_len_max
        self._views = (words, words.view(torch.uint8), words.view(torch.int64))
        self._pointers = tuple(view.data_ptr() for view in self._views)
        index = words.device.index
        self._device = torch.cuda.current_device() if index is None else index
        self.direct = direct and _DIRECT_LAUNCHES
        # Per variant: the compiled kernel's launcher, function handle and metadata.
        self._compiled: dict[tuple, tuple] = {}
        # Per pinned tensor (by identity, the tensor held): (tensor, what to pass, aligned).
        self._pinned: dict[int, tuple[torch.Tensor, object, bool]] = {}

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
        constants = (has_accepted, self.query_len_max, _BLOCK)
        if self.direct and table.is_cuda and seq_lens.is_cuda and counts.is_cuda:
            entry_arg, entry_aligned = self._pinned_arg(entry)
            done_arg, done_aligned = self._pinned_arg(done)
            table_at, seq_at, counts_at = table.data_ptr(), seq_lens.data_ptr(), counts.data_ptr()
            key = (
                "open", has_accepted, entry_aligned, done_aligned,
                table.dtype, table_at % 16 == 0, seq_lens.dtype, seq_at % 16 == 0,
                counts.dtype, counts_at % 16 == 0, stride == 1, stride % 16 == 0,
            )  # fmt: skip
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._run(
                    compiled,
                    (entry_arg, done_arg, *self._pointers, table_at, stride, seq_at, counts_at),
                    group,
                    constants,
                )
                return
        else:
            key = None
        args = (entry, done, *self._views, table, stride, seq_lens, counts, group)
        names = ("HAS_ACCEPTED", "QUERY_LEN_MAX", "BLOCK")
        self._through_triton(_open_step, key, args, dict(zip(names, constants, strict=True)))

    def group_slots(self, table: torch.Tensor, group: int) -> None:
        """Launch :func:`_group_slots`: group ``group``'s slots from ``table``."""
        stride = table.stride(0)
        key = None
        if self.direct and table.is_cuda:
            table_at = table.data_ptr()
            key = ("slots", table.dtype, table_at % 16 == 0, stride == 1, stride % 16 == 0)
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._run(compiled, (self._pointers[0], table_at, stride), group, (_BLOCK,))
                return
        args = (self.words, table, stride, group)
        self._through_triton(_group_slots, key, args, {"BLOCK": _BLOCK})

    def _pinned_arg(self, tensor: torch.Tensor) -> tuple[object, bool]:
        """What the launcher takes for pinned ``tensor`` (its device address, or the tensor
        where the driver would not say), and whether it is 16-byte aligned."""
        found = self._pinned.get(id(tensor))
        if found is None or found[0] is not tensor:
            address = mapped_device_pointer(tensor)
            found = (tensor, tensor if address is None else address, tensor.data_ptr() % 16 == 0)
            self._pinned[id(tensor)] = found
        return found[1], found[2]

    def _through_triton(self, kernel, key: tuple | None, args: tuple, constants: dict) -> None:
        """A launch through Triton (which compiles a new variant); its compiled kernel kept
        under ``key`` for direct launches."""
        launched = kernel[(1,)](*args, **constants, num_warps=4)
        if key is not None:
            self._compiled[key] = (launched.run, launched.function, launched.packed_metadata)

    def _run(self, compiled: tuple, pointers: tuple, group: int, constants: tuple) -> None:
        run, function, metadata = compiled
        stream = torch._C._cuda_getCurrentRawStream(self._device)
        run(1, 1, 1, stream, function, metadata, None, None, None, *pointers, group, *constants)
