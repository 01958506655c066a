"""Attention over the slot-indexed KV cache: FlashAttention-2 through PyTorch's own op
(CUDA), or ``scaled_dot_product_attention`` one row at a time (any device, the reference).

Both compute, for row ``r`` with ``n`` query tokens and ``k = seqused_k[r]`` keys at flat
cache entries ``cum_seq_k[r] ..``, causal attention aligned bottom-right: query ``i``
sees keys ``0 .. k - n + i``. Rows with ``k = 0`` give zeros; tokens outside every row
(graph padding) are left unspecified, and nothing reads them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .metadata import StepHost, StepTensors

ATTENTION_BACKENDS = ("flash", "sdpa")


def flash_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta: StepTensors
) -> torch.Tensor:
    """``[T, H, Dh]`` output of ``q`` ``[T, H, Dh]`` (last dim contiguous) over the flat
    cache ``keys``, ``values`` ``[num_slots * max_len, KV, Dh]``.

    FlashAttention-2 varlen with ``seqused_k`` reads only ``cum_seq_k[r]`` of row ``r``,
    so rows' key starts (``slot * max_len``) need not be ordered. GQA is native (H a
    multiple of KV). Graph-safe: no host synchronization, bounds from ``meta.shape``.
    """
    shape = meta.shape
    out = torch.ops.aten._flash_attention_forward(
        q,
        keys,
        values,
        meta.cum_seq_q,
        meta.cum_seq_k,
        shape.max_query_len,
        shape.max_kv_len,
        0.0,  # dropout
        True,  # causal, bottom-right aligned when keys outnumber queries
        False,  # no debug mask
        scale=None,
        seqused_k=meta.seqused_k,
    )
    return out[0]


def sdpa_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, host: StepHost
) -> torch.Tensor:
    """:func:`flash_attention`'s function, row by row, over the cache as ``[num_slots,
    max_len, KV, Dh]``; rows and lengths come from the host's copy of the metadata."""
    out = torch.zeros_like(q)
    groups = q.shape[1] // keys.shape[2]
    cum_q, used = host.cum_seq_q.tolist(), host.seqused_k.tolist()
    for row, slot in enumerate(host.slots.tolist()):
        start, stop, length = cum_q[row], cum_q[row + 1], used[row]
        if length == 0 or stop == start:
            continue
        n = stop - start
        # [KV, k, Dh] -> [H, k, Dh]: query head h reads KV head h // groups.
        k = keys[slot, :length].transpose(0, 1).repeat_interleave(groups, dim=0)
        v = values[slot, :length].transpose(0, 1).repeat_interleave(groups, dim=0)
        query_pos = torch.arange(length - n, length, device=q.device)
        mask = torch.arange(length, device=q.device)[None, :] <= query_pos[:, None]
        rows = F.scaled_dot_product_attention(q[start:stop].transpose(0, 1), k, v, attn_mask=mask)
        out[start:stop] = rows.transpose(0, 1)
    return out
