"""One host→device copy per step into a persistent device buffer, through pinned host memory.

:class:`PinnedUpload` issues the copy itself (eager steps, the vLLM builder);
:class:`StagingRing` holds the host buffers a captured CUDA graph copies from
when it replays (graph steps), so the copy costs the host nothing but a write.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch


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
    """Pinned host buffers that captured CUDA graphs copy their plan from, used in turn.

    A graph captured over entry ``i`` reads entry ``i``'s host memory when it
    *replays*, which may be long after the host launched it. So before the host
    writes entry ``i`` again, :meth:`claim` waits for the event :meth:`release`
    recorded after that entry's last replay. Two entries let the host fill step
    ``n + 1`` while step ``n`` is still queued.

    The memory comes from ``pin_memory=True`` (torch's caching host allocator):
    torch refuses to capture a copy from host memory it did not pin itself
    (``cudaHostRegister`` pages included, torch 2.11). That allocator, at free,
    waits only for the streams it saw use a block, and a captured copy runs on
    whatever stream replays the graph; so the ring holds the block for its whole
    life and, when it goes, first waits for every replay it recorded: the block
    is handed back only once nothing reads it.
    On a CPU device nothing is pinned and there are no events.
    """

    def __init__(self, capacity_bytes: int, device: torch.device | str, ring_size: int = 2) -> None:
        for name, value in (("capacity_bytes", capacity_bytes), ("ring_size", ring_size)):
            if value < 1:
                raise ValueError(f"{name}: must be positive, got {value}")
        self.device = torch.device(device)
        self.capacity_bytes = capacity_bytes
        self.ring_size = ring_size
        on_cuda = self.device.type == "cuda"
        base = torch.zeros(capacity_bytes * ring_size, dtype=torch.uint8, pin_memory=on_cuda)
        self._hosts = tuple(
            base[i * capacity_bytes : (i + 1) * capacity_bytes] for i in range(ring_size)
        )
        self._events = tuple(torch.cuda.Event() if on_cuda else None for _ in range(ring_size))
        self._next = 0
        if on_cuda:
            # At interpreter exit the process takes the memory with it; CUDA may be gone.
            weakref.finalize(self, _release_after_replays, base, self._events).atexit = False

    def claim(self) -> int:
        """The next entry's index, once no queued replay reads it any more."""
        index = self._next
        self._next = (index + 1) % self.ring_size
        event = self._events[index]
        if event is not None:
            event.synchronize()  # returns at once when the GPU is past its last replay
        return index

    def release(self, index: int) -> None:
        """Mark entry ``index`` as read by the work queued so far on the current stream."""
        event = self._events[index]
        if event is not None:
            event.record()

    def wait_all(self) -> None:
        """Wait until no queued work reads any entry (before rewriting them all)."""
        for event in self._events:
            if event is not None:
                event.synchronize()

    def host_int32(self, index: int, size: int) -> tuple[torch.Tensor, np.ndarray]:
        """Entry ``index``'s first ``size`` int32 as a tensor and a numpy view of the same memory,
        ``[size], int32`` each."""
        if not 0 <= size * 4 <= self.capacity_bytes:
            raise ValueError(f"size: {size} int32 exceed the {self.capacity_bytes} bytes")
        tensor = self._hosts[index][: size * 4].view(torch.int32)
        return tensor, tensor.numpy()


def _release_after_replays(base: torch.Tensor, events: tuple) -> None:
    """Wait for every recorded replay; then ``base`` (an argument only so that it lives
    until now) may go back to the allocator."""
    for event in events:
        event.synchronize()
