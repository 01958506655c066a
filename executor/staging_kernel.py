"""A graph step's plan upload as one Triton kernel that reads the pinned staging entry.

The staging entry and its ``done`` word (:class:`~stepplan.executor.upload.StagingRing`)
are pinned with ``cudaHostAlloc``, which on a unified-address system maps them into
the device's address space: a kernel may load and store them directly. One kernel
node does what two copy nodes did (the plan and ticket host→device, then the ticket
back): copy nodes made a graph's launch cost the host more, the kernel node nothing
measurable (``bench/graph_launch_bench.py``; figures in ``bench/results/history/``, Runtime).
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Words one pass moves: plans of up to 16383 words (a 64 KB entry) take one pass.
_PASS_WORDS = 16384


@triton.jit
def _pull_plan(entry_ptr, plan_ptr, done_ptr, size, PASS: tl.constexpr):
    """``plan[:size + 1] = entry[:size + 1]`` (the plan and its ticket), then
    ``done[0] = entry[size]``.

    One program, so that one barrier orders every thread's read of the entry before
    the ticket goes back: the host may rewrite the entry once it sees the ticket.
    """
    for start in range(0, size + 1, PASS):
        words = start + tl.arange(0, PASS)
        inside = words < size + 1
        tl.store(plan_ptr + words, tl.load(entry_ptr + words, mask=inside), mask=inside)
    tl.debug_barrier()  # every read of the entry is over
    # From the device copy, written before the barrier: no second trip to host memory.
    tl.store(done_ptr, tl.load(plan_ptr + size))


def pull_plan(entry: torch.Tensor, plan: torch.Tensor, done: torch.Tensor) -> None:
    """Launch the upload on the current stream (graph-capturable).

    Args:
        entry: ``[size + 1], int32`` pinned host memory: the plan, then its ticket.
        plan: ``[size + 1], int32`` on the device: receives plan and ticket.
        done: ``[1], int32`` pinned host memory: receives the ticket last.
    """
    size = entry.numel() - 1
    if plan.numel() != size + 1 or done.numel() != 1:
        raise ValueError(
            f"plan, done: must hold {size + 1} and 1 int32, got {plan.numel()} and {done.numel()}"
        )
    for name, tensor in (("entry", entry), ("done", done)):
        if plan.is_cuda and not tensor.is_pinned():  # the interpreter reads any CPU tensor
            raise ValueError(f"{name}: must be pinned host memory (the kernel reads it directly)")
    words = min(_PASS_WORDS, 1 << size.bit_length())  # a power of two above size
    _pull_plan[(1,)](entry, plan, done, size, PASS=words, num_warps=max(1, min(32, words // 256)))
