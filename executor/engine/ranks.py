"""Tensor-parallel ranks on one host: one process per rank in a ``torch.distributed``
process group, each running the same function, their results gathered by the caller.

Every rank serves the same requests with its own :class:`~.engine.Engine` on a runner
built with ``tensor_parallel = world_size``. The planner runs on every rank rather than
on rank 0 with a broadcast: a plan is a pure function of the step's batch, and the batch
is a function of the requests and the greedy tokens so far, which every rank computes
identically (the all-reduce leaves the same sums on every rank and the LM head is
whole), so every rank compiles the same plan with no message on the step's path and
knows its CUDA-graph bucket locally.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

#: Process-group backends by device type: NCCL between GPUs, gloo between CPU processes.
BACKENDS: Mapping[str, str] = MappingProxyType({"cuda": "nccl", "cpu": "gloo"})


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_ranks(
    world_size: int,
    worker: Callable[..., Any],
    args: tuple[Any, ...],
    device_type: str,
    threads_per_rank: int | None = None,
) -> list[Any]:
    """Run ``worker(rank, *args)`` in ``world_size`` spawned processes joined by a process
    group (NCCL for ``device_type = "cuda"``, rank ``r`` on GPU ``r``; gloo for ``"cpu"``)
    on a free localhost port; returns each rank's result, by rank.

    ``threads_per_rank``: each rank's torch intra-op threads; default the host's cores
    split evenly between the ranks (the ranks must not starve each other).

    ``worker``, ``args`` and the results must pickle (``worker`` a module-level function).
    A rank that raises makes this raise (``torch.multiprocessing.ProcessRaisedException``
    with the rank's traceback).
    """
    if device_type not in BACKENDS:
        raise ValueError(f"device_type: must be one of {tuple(BACKENDS)}, got {device_type!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a positive integer, got {world_size!r}")
    if threads_per_rank is not None and threads_per_rank < 1:
        raise ValueError(f"threads_per_rank: must be at least 1, got {threads_per_rank}")
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    with tempfile.TemporaryDirectory(prefix="stepplan-ranks-") as folder:
        torch.multiprocessing.spawn(
            _rank_main,
            args=(world_size, free_port(), device_type, threads, folder, worker, args),
            nprocs=world_size,
            join=True,
        )
        return [
            pickle.loads((Path(folder) / f"rank{r}.pkl").read_bytes()) for r in range(world_size)
        ]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    device_type: str,
    threads: int,
    folder: str,
    worker: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """One rank's process: join the group, run ``worker``, leave its result in ``folder``."""
    distributed = torch.distributed
    torch.set_num_threads(threads)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    distributed.init_process_group(
        BACKENDS[device_type],
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )
    try:
        result = worker(rank, *args)
        distributed.barrier()
    finally:
        distributed.destroy_process_group()
    (Path(folder) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
