"""One host→device copy per step into a persistent device buffer, through pinned host memory.

:class:`PinnedUpload` issues the copy itself (eager steps, the vLLM builder);
:class:`StagingRing` holds the host buffers a captured CUDA graph pulls its plan from
when it replays (graph steps), so the copy costs the host nothing but a write:
the graph itself hands back a ticket that says when an entry may be written again.
"""

from __future__ import annotations

import time
import weakref

import numpy as np
import torch

# Tickets run 1..2**31 - 1: they fit the int32 words, and 0 stays "never written".
_TICKET_LIMIT = 2**31 - 1


class PinnedUpload:
    """A persistent device byte buffer filled by one asynchronous copy per call.

    The host side is a ring of pinned buffers: the copy of step ``n`` may still
    be queued behind earlier GPU work when the host prepares step ``n + 1``, so
    each ring entry waits for its own previous copy (an event) before it is
    written again. On a CPU device there is nothing to pin and the copy is
    synchronous.

    Attributes:
        device_buffer: ``[capacity_bytes], uint8`` on ``device``; its address
            never changes, so CUDA graphs may read it.
    """

    def __init__(self, capacity_bytes: int, device: torch.device, ring_size: int = 16) -> None:
        for name, value in (("capacity_bytes", capacity_bytes), ("ring_size", ring_size)):
            if value < 1:
                raise ValueError(f"{name}: must be positive, got {value}")
        self.device = torch.device(device)
        self.capacity_bytes = capacity_bytes
        self.device_buffer = torch.zeros(capacity_bytes, dtype=torch.uint8, device=self.device)
        pinned = self.device.type == "cuda"
        self._host = [
            torch.zeros(capacity_bytes, dtype=torch.uint8, pin_memory=pinned)
            for _ in range(ring_size)
        ]
        self._host_numpy = [host.numpy() for host in self._host]
        self._events = [torch.cuda.Event() if pinned else None for _ in range(ring_size)]
        self._next = 0
        self._open: int | None = None
        # Slices by length, made once: slicing a tensor costs a microsecond per step.
        self._slices: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}
        self._int32_views: dict[int, torch.Tensor] = {}

    def host_bytes(self) -> np.ndarray:
        """The next host staging buffer, ``[capacity_bytes], uint8``, safe to write now.

        Fill it, then call :meth:`commit` once.
        """
        if self._open is not None:
            raise RuntimeError("host_bytes() called twice without commit()")
        index = self._next
        event = self._events[index]
        if event is not None:
            event.synchronize()  # its previous copy has left the buffer
        self._open = index
        return self._host_numpy[index]

    def commit(self, num_bytes: int) -> torch.Tensor:
        """Copy the open host buffer's first ``num_bytes`` to the device, on the current stream.

        Returns ``device_buffer[:num_bytes]``.
        """
        if self._open is None:
            raise RuntimeError("commit() without host_bytes()")
        if not 0 <= num_bytes <= self.capacity_bytes:
            raise ValueError(f"num_bytes: {num_bytes} is outside 0..{self.capacity_bytes}")
        index, self._open = self._open, None
        self._next = (index + 1) % len(self._host)
        target, sources = self._sliced(num_bytes)
        target.copy_(sources[index], non_blocking=self.device.type == "cuda")
        event = self._events[index]
        if event is not None:
            event.record()
        return target

    def _sliced(self, num_bytes: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``device_buffer[:num_bytes]`` and every host buffer's ``[:num_bytes]``, cached."""
        sliced = self._slices.get(num_bytes)
        if sliced is None:
            if len(self._slices) >= 256:  # eager steps bring ever new lengths
                self._slices.clear()
            sources = tuple(host[:num_bytes] for host in self._host)
            sliced = self._slices[num_bytes] = (self.device_buffer[:num_bytes], sources)
        return sliced

    def upload_int32(self, values: np.ndarray) -> torch.Tensor:
        """Upload one int32 array; returns its device view, ``[len(values)], int32``."""
        num_bytes = values.size * 4
        if num_bytes > self.capacity_bytes:
            raise ValueError(f"values: {values.size} int32 exceed the {self.capacity_bytes} bytes")
        self.host_bytes()[:num_bytes].view(np.int32)[:] = values
        target = self.commit(num_bytes)
        view = self._int32_views.get(num_bytes)
        if view is None:
            if len(self._int32_views) >= 256:
                self._int32_views.clear()
            view = self._int32_views[num_bytes] = target.view(torch.int32)
        return view


class StagingRing:
    """Pinned host buffers that captured CUDA graphs copy their plan from, each freed by a
    ticket the graph writes back (:meth:`claim` says which one is handed out next).

    A graph captured over entry ``i`` reads entry ``i``'s host memory when it
    *replays*, which may be long after the host launched it, so the host must
    not write entry ``i`` again before that read is done. Each entry holds the
    plan, ``[size], int32``, and right after it one int32 *ticket*
    (:meth:`write` stamps a fresh one). The graph's first node, a kernel
    (:func:`~stepplan.executor.staging_kernel.pull_plan`), loads plan and ticket
    together (:meth:`graph_source`) into the device and then, once all its loads
    are over, stores the ticket into the entry's pinned ``done`` word
    (:meth:`done_word`). :meth:`claim` hands entry ``i`` out again once
    ``done[i]`` equals the last ticket written into it. That is safe because that
    kernel is the entry's only reader: seeing the ticket proves the read is over. A graph step thus
    waits on nothing but a load from pinned memory and makes no CUDA call of its
    own; two entries let the host fill step ``n + 1`` while step ``n`` is queued.

    Tickets count from 1 per ring and wrap below ``2**31`` (never 0, the value a
    never-used entry's ``done`` and ``issued`` words share, so such an entry is
    free). Consecutive tickets of one entry differ, so an old ticket never
    frees an entry early.

    The memory comes from ``pin_memory=True`` (torch's caching host allocator,
    ``cudaHostAlloc``), which maps it into the device's address space, so a
    kernel may read and write it. That allocator, at free, waits only for the
    streams it saw use a block, and a captured kernel runs on whatever stream
    replays the graph; so the ring holds its blocks for its whole life and, when
    it goes, first waits for every ticket it issued to come back: the blocks are
    handed back only once nothing reads or writes them.
    On a CPU device nothing is pinned and nothing copies tickets back, so by
    default nothing waits; ``wait_for_tickets=True`` makes a CPU ring wait as a
    CUDA one does, for tests that play the GPU by setting ``done`` words.

    Args:
        capacity_bytes: plan bytes per entry, a multiple of 4 (the ticket word
            comes on top).
        device: where the graphs run.
        ring_size: entries.
        timeout_s: how long :meth:`claim` polls for a ticket before it
            synchronizes the current stream and looks once more.
        wait_for_tickets: whether :meth:`claim` waits for tickets; default (and
            required) on a CUDA device, off on the CPU.
    """

    def __init__(
        self,
        capacity_bytes: int,
        device: torch.device | str,
        ring_size: int = 2,
        *,
        timeout_s: float = 0.05,
        wait_for_tickets: bool | None = None,
    ) -> None:
        for name, value in (("capacity_bytes", capacity_bytes), ("ring_size", ring_size)):
            if value < 1:
                raise ValueError(f"{name}: must be positive, got {value}")
        if capacity_bytes % 4:
            raise ValueError(f"capacity_bytes: must be a multiple of 4, got {capacity_bytes}")
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s: must be at least 0, got {timeout_s}")
        self.device = torch.device(device)
        self.capacity_bytes = capacity_bytes
        self.ring_size = ring_size
        self.timeout_s = timeout_s
        on_cuda = self.device.type == "cuda"
        if wait_for_tickets is None:
            wait_for_tickets = on_cuda
        if on_cuda and not wait_for_tickets:
            raise ValueError("wait_for_tickets: a CUDA ring must wait for its tickets")
        self._wait = wait_for_tickets
        stride = capacity_bytes // 4 + 1  # the plan's words, then the ticket word
        block = torch.zeros(stride * ring_size, dtype=torch.int32, pin_memory=on_cuda)
        done_block = torch.zeros(ring_size, dtype=torch.int32, pin_memory=on_cuda)
        self._entries = tuple(block[i * stride : (i + 1) * stride] for i in range(ring_size))
        self._entry_arrays = tuple(entry.numpy() for entry in self._entries)
        self._done_words = tuple(done_block[i : i + 1] for i in range(ring_size))
        # [ring_size] int32, written by the graphs. A memoryview and lists, not numpy: a
        # claim reads two words, and numpy's scalar path costs a cold build's host more.
        self._done = memoryview(done_block.numpy())
        self._issued = [0] * ring_size  # last ticket written per entry
        self._written = [0] * ring_size  # per entry, when: a write count
        self._ticket = self._writes = self._last = 0
        # Plan views by size, made once: slicing costs more than the write itself.
        self._plan_arrays: dict[int, tuple[np.ndarray, ...]] = {}
        if on_cuda:
            # At interpreter exit the process takes the memory with it; CUDA may be gone.
            weakref.finalize(
                self,
                _release_after_replays,
                (block, done_block),
                self._done,
                self._issued,
                self.device,
                timeout_s,
            ).atexit = False

    def claim(self) -> int:
        """A free entry's index: one no queued replay reads any more. Entry 0 if free,
        else 1, else the entry after the last one handed out, else the lowest free one;
        where every entry is in use, the one written longest ago, once its ticket is back.

        Low entries first rather than turns: a host one or two steps ahead of the device
        then rewrites the same few entries, whose memory its caches still hold, where
        turns would cycle through every entry's memory; a host further ahead finds the
        next entry free at one look. An entry is in use from :meth:`write` or
        :meth:`stamp` until its ticket is back (a claim reserves nothing); on a ring
        that does not wait, every entry is free.

        Raises RuntimeError when the ticket waited for has not come back ``timeout_s``
        after the call, even after synchronizing the current stream (a CUDA error there
        raises that error instead).
        """
        if not self._wait:
            return 0
        done, issued = self._done, self._issued
        if done[0] == issued[0]:
            index = 0
        elif self.ring_size > 1 and done[1] == issued[1]:
            index = 1
        elif done[index := (self._last + 1) % self.ring_size] != issued[index]:
            index = next((i for i in range(self.ring_size) if done[i] == issued[i]), None)
            if index is None:  # stream order: the oldest comes back first
                written = self._written
                index = written.index(min(written))
                self._wait_for_ticket(index)
        self._last = index
        return index

    def write(self, index: int, packed: np.ndarray) -> int:
        """Write ``packed``, ``[size], int32``, into entry ``index`` (claimed) and a fresh
        ticket into its word ``size``; returns the ticket.

        Launch the graph of this entry and size next: until it has copied the
        ticket back, :meth:`claim` does not hand the entry out again.
        """
        arrays = self._plan_arrays.get(packed.size)
        if arrays is None:
            arrays = self._plan_views(packed.size)
        np.copyto(arrays[index], packed)
        return self.stamp(index, packed.size)

    def stamp(self, index: int, word: int) -> int:
        """Write a fresh ticket into word ``word`` of entry ``index`` (claimed, its data
        written in place through :meth:`host_int32`); returns the ticket.

        Whatever reads the entry next must copy that word back into :meth:`done_word`
        once its reads are over: until then :meth:`claim` does not hand the entry out.
        """
        ticket = self._ticket % _TICKET_LIMIT + 1
        self._ticket = ticket
        self._entry_arrays[index][word] = ticket
        self._issued[index] = ticket
        self._writes += 1
        self._written[index] = self._writes
        return ticket

    def wait_all(self) -> None:
        """Wait until no queued work reads any entry (before rewriting them all)."""
        if self._wait:
            for index in range(self.ring_size):
                if self._done[index] != self._issued[index]:
                    self._wait_for_ticket(index)

    def host_int32(self, index: int, size: int) -> tuple[torch.Tensor, np.ndarray]:
        """Entry ``index``'s first ``size`` int32 (the plan) as a tensor and a numpy view of
        the same memory, ``[size], int32`` each."""
        self._check_size(size)
        tensor = self._entries[index][:size]
        return tensor, tensor.numpy()

    def graph_source(self, index: int, size: int) -> torch.Tensor:
        """``[size + 1], int32``: entry ``index``'s plan and the ticket after it, what the
        graph's first node loads into the device."""
        self._check_size(size)
        return self._entries[index][: size + 1]

    def done_word(self, index: int) -> torch.Tensor:
        """``[1], int32``: entry ``index``'s pinned ``done`` word, where the graph's upload
        kernel stores the ticket back."""
        return self._done_words[index]

    def tickets(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the last ticket written into each entry and of each ``done`` word,
        ``[ring_size], int32`` each."""
        return np.array(self._issued, dtype=np.int32), np.array(self._done, dtype=np.int32)

    def _check_size(self, size: int) -> None:
        if not 0 <= size * 4 <= self.capacity_bytes:
            raise ValueError(f"size: {size} int32 exceed the {self.capacity_bytes} bytes")

    def _plan_views(self, size: int) -> tuple[np.ndarray, ...]:
        if len(self._plan_arrays) >= 256:  # one size per layout: this is a guard only
            self._plan_arrays.clear()
        arrays = tuple(self.host_int32(index, size)[1] for index in range(self.ring_size))
        self._plan_arrays[size] = arrays
        return arrays

    def _wait_for_ticket(self, index: int) -> None:
        done, issued = self._done[index : index + 1], self._issued[index : index + 1]
        if _poll_tickets(done, issued, self.timeout_s):
            return
        if self.device.type == "cuda":
            # Also raises any CUDA error that kept the ticket from coming back.
            torch.cuda.current_stream(self.device).synchronize()
        if done[0] != issued[0]:
            raise RuntimeError(
                f"staging entry {index}: ticket {issued[0]} did not come back (done word "
                f"holds {done[0]}) within {self.timeout_s} s and a synchronize of the current "
                "stream; was its graph launched on another stream, or not launched after write()?"
            )


def _poll_tickets(done: memoryview, issued: list[int], timeout_s: float) -> bool:
    """Whether ``done`` came to equal ``issued`` within ``timeout_s`` seconds of polling."""
    deadline = time.perf_counter() + timeout_s
    while done.tolist() != issued:
        if time.perf_counter() >= deadline:
            return False
        time.sleep(0)  # yields the core to other threads while the GPU catches up
    return True


def _release_after_replays(
    blocks: tuple[torch.Tensor, ...],
    done: memoryview,
    issued: list[int],
    device: torch.device,
    timeout_s: float,
) -> None:
    """Wait until every issued ticket came back; then ``blocks`` (an argument only so that
    they live until now) may go back to the allocator.

    A ticket written but never launched never comes back: after a device-wide
    synchronize no queued work touches the blocks either way.
    """
    if not _poll_tickets(done, issued, timeout_s):
        torch.cuda.synchronize(device)
