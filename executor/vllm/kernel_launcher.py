"""Launching :mod:`.gather_kernels`'s kernels for a builder: past Triton's per-launch dispatch, and
replayed as CUDA graphs where their arguments recur (:class:`Launcher`)."""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import torch
import triton

from .gather_kernels import _BLOCK, _group_slots, _open_step

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
    """The gather kernels (:mod:`.gather_kernels`) on one buffer, launched past Triton's
    per-launch dispatch, and replayed as CUDA graphs where their arguments recur.

    A variant's first launch (:func:`_specialization`) goes through Triton, which
    compiles it; later ones call the compiled kernel's launcher on the current stream
    (Triton >= 3.3; before, every launch goes through Triton), which skips Triton's
    argument binding, cache lookup and global checks: microseconds per launch. Launch
    hooks that Triton's profilers install are not called on that path.

    With ``graphs``, the second launch of one exact argument set (every address, stride,
    dtype and group, the staging entry and its done word by identity: an engine's
    persistent buffers and the staging ring's entries make them recur) captures that
    launch into a CUDA graph on a side stream, which records and runs nothing and waits
    for nothing, and every later launch of that set replays the graph on the current
    stream: a graph launch costs the host about half a kernel launch with its arguments,
    and a capture 0.05-0.7 ms once per argument set. While the current stream is being
    captured (an engine capturing its own graph), launches go directly, into that capture.

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
        # Per exact argument set: its graph, or 1 once launched directly; and the tensors
        # its key holds by id, kept alive so that no other tensor takes their ids.
        self._graphs: dict[tuple, torch.cuda.CUDAGraph | int] = {}
        self._kept: dict[int, torch.Tensor] = {}
        self._side = torch.cuda.Stream(self._device) if self.graphs else None
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        #: Launches replayed as graphs, and graphs captured, so far.
        self.num_replays = self.num_captures = 0

    def open_step(
        self,
        entry: torch.Tensor,
        done: torch.Tensor,
        table: torch.Tensor,
        query_start: torch.Tensor,
        seq_lens: torch.Tensor,
        accepted: torch.Tensor | None,
        group: int,
    ) -> None:
        """Launch :func:`_open_step`: ``entry`` (``[E], int32`` pinned) and its ``done``
        word (``[1], int32`` pinned); ``table`` ``[>= num_reqs, B]`` the building group's
        block table (slot: column 0), ``query_start`` ``[>= num_reqs + 1]`` the engine's
        query starts, ``seq_lens`` and ``accepted`` ``[>= num_reqs]`` (``None``: every
        count 1), int32 or int64."""
        stride = table.stride()[0]
        has_accepted = accepted is not None
        counts = accepted if has_accepted else self.words
        # The staging entry and its done word by identity: the ring's tensors, made once
        # (and kept here from their first sighting on, so an id is never another's).
        exact = (
            id(entry),
            id(done),
            table.data_ptr(),
            table.dtype,
            stride,
            query_start.data_ptr(),
            query_start.dtype,
            seq_lens.data_ptr(),
            seq_lens.dtype,
            counts.data_ptr(),
            counts.dtype,
            has_accepted,
            group,
        )
        if self._replayed(exact):
            return
        args = (entry, done, *self._views, table, stride, query_start, seq_lens, counts, group)
        constants = (has_accepted, self.query_len_max, _BLOCK)
        key = (
            "open",
            has_accepted,
            *_specialization((entry, done, table, query_start, seq_lens, counts), stride),
        )
        names = ("HAS_ACCEPTED", "QUERY_LEN_MAX", "BLOCK")
        self._launch(_open_step, key, exact, args, constants, names, (entry, done))

    def group_slots(self, table: torch.Tensor, group: int) -> None:
        """Launch :func:`_group_slots`: group ``group``'s slots from ``table``."""
        stride = table.stride()[0]
        exact = (table.data_ptr(), table.dtype, stride, group)
        if self._replayed(exact):
            return
        args = (self.words, table, stride, group)
        key = ("slots", *_specialization((table,), stride))
        self._launch(_group_slots, key, exact, args, (_BLOCK,), ("BLOCK",), ())

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
        self,
        kernel,
        key: tuple,
        exact: tuple,
        args: tuple,
        constants: tuple,
        names: tuple,
        keep: tuple[torch.Tensor, ...],
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
                self._kept.update((id(tensor), tensor) for tensor in keep)
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
