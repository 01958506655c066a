"""Tensor parallelism: which part of each weight, cache and state one rank holds, and the
sum that joins the ranks' partial outputs.

``N`` ranks split the model Megatron-style. Column-parallel projections (a conv block's
``in_proj`` and taps, attention's q, k, v heads, the MLP's gate and up) give each rank a
contiguous block of output features: channels, heads or inner width; the row-parallel
projection after each (``out_proj``, ``o_proj``, ``down``) reads only that block and
yields a partial ``[T, hidden]`` sum, which one all-reduce completes. Embedding, norms
and the LM head are whole on every rank, so after each all-reduce every rank holds the
same hidden state, and every rank computes the same greedy tokens.

Rank ``r`` holds block ``r`` of ``N`` equal blocks: channels ``r * C/N ..``, query heads
``r * H/N ..`` and the KV heads they read (``r * KV/N ..``: query head ``h`` reads KV
head ``h // (H/KV)``, so both blocks start at the same group), inner width
``r * m/N ..``. At ``N = 1`` nothing is cut and nothing is reduced.
"""

from __future__ import annotations

import attrs
import torch

from .shape import ModelShape

#: The dimensions that tensor parallelism splits, each over ``N`` equal blocks.
SPLIT_FIELDS = ("conv_channels", "num_heads", "num_kv_heads", "mlp_size")


@attrs.frozen
class TensorShard:
    """One rank's place among ``size`` tensor-parallel ranks.

    Attributes:
        rank: this rank, ``0 .. size - 1``.
        size: the tensor-parallel degree (``1``: the whole model, no process group).
    """

    rank: int = 0
    size: int = 1

    def __attrs_post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tensor_parallel: must be at least 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank: must be in 0..{self.size - 1}, got {self.rank}")

    def rank_shape(self, shape: ModelShape) -> ModelShape:
        """``shape`` with the split dimensions divided by ``size``: what one rank's weights,
        KV cache and conv state have (``ValueError`` naming a dimension ``size`` does not
        divide)."""
        for name in SPLIT_FIELDS:
            value = getattr(shape, name)
            if value % self.size:
                raise ValueError(f"tensor_parallel: {self.size} ranks must divide {name} = {value}")
        if self.size == 1:
            return shape
        return attrs.evolve(shape, **{f: getattr(shape, f) // self.size for f in SPLIT_FIELDS})

    def block(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's block of ``tensor`` along ``dim``, in storage of its own (a view
        would keep the whole tensor alive); ``tensor`` itself at ``size = 1``."""
        if self.size == 1:
            return tensor
        width = tensor.shape[dim] // self.size
        return tensor.narrow(dim, self.rank * width, width).clone()

    def blocks(self, tensor: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
        """Rows of ``tensor`` cut into parts of ``sizes`` (say gate | up), this rank's block
        of each part, joined again in order."""
        if self.size == 1:
            return tensor
        return torch.cat([self.block(part, 0) for part in tensor.split(list(sizes))])

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum ``partial`` over the ranks in place (the default process group); at
        ``size = 1`` it is already the sum and no process group is needed."""
        if self.size > 1:
            torch.distributed.all_reduce(partial)
        return partial


def process_group_shard(shape: ModelShape, size: int) -> TensorShard:
    """This process's :class:`TensorShard` of ``shape`` among ``size`` ranks: rank 0 of 1
    at ``size = 1``, else the rank of the initialised default process group, whose world
    size must be ``size``; ``ValueError`` otherwise or where ``size`` does not divide the
    model (checked first: no process group is needed to know that)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"tensor_parallel: must be a positive integer, got {size!r}")
    TensorShard(0, size).rank_shape(shape)
    if size == 1:
        return TensorShard()
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        raise ValueError(
            f"tensor_parallel: {size} ranks need an initialised torch.distributed process "
            "group (one process per rank; see stepplan.executor.engine.launch_ranks)"
        )
    world = distributed.get_world_size()
    if world != size:
        raise ValueError(f"tensor_parallel: {size} ranks, but the process group has {world}")
    return TensorShard(rank=distributed.get_rank(), size=size)
