"""Steps as vLLM 0.33's model runner hands them to a PLE builder, on vLLM's own classes.

Imported only where vLLM is installed. A batch follows the runner's conventions
(``vllm/v1/worker/gpu_model_runner.py``): a decode row drafts ``q - 1`` tokens, zero
drafts when it got none (it stays a spec row); a prompt chunk, one token long or more,
has ``-1``; ``is_prefilling`` is ``num_computed < num_prompt``; graph padding rows trail,
with no tokens, NULL block table rows, ``seq_lens`` 0 and ``-1`` drafts; the token count
may be padded. Rows come in the order of vLLM's reorder (decodes, short then long
extends, first chunks) with either threshold, or in any order ("spec rows anywhere").
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import numpy as np
import torch

if not torch.cuda.is_available():  # vLLM's config needs a platform; the CPU one here
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.config import CompilationConfig, CUDAGraphMode, SpeculativeConfig, VllmConfig
from vllm.config.scheduler import SchedulerConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import MambaSpec


@attrs.frozen
class EngineSetup:
    """The settings a test draws: speculative tokens, full CUDA graphs or none, the
    scheduler's ``max_num_seqs`` and the capture sizes."""

    spec_tokens: int
    full_graphs: bool
    max_num_seqs: int = 48
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_num_batched_tokens: int = 2048

    def vllm_config(self) -> VllmConfig:
        """A ``VllmConfig`` of these settings, its CUDA-graph settings as the CUDA platform
        leaves them (the CPU platform turns graphs off when it makes the config)."""
        speculative = None
        if self.spec_tokens:
            speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=self.spec_tokens)
        config = VllmConfig(
            speculative_config=speculative,
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=self.max_num_batched_tokens,
                is_encoder_decoder=False,
            ),
            compilation_config=CompilationConfig(),
        )
        compilation = config.compilation_config
        compilation.cudagraph_mode = (
            CUDAGraphMode.FULL_AND_PIECEWISE if self.full_graphs else CUDAGraphMode.NONE
        )
        compilation.cudagraph_capture_sizes = list(self.capture_sizes)
        compilation.max_cudagraph_capture_size = max(self.capture_sizes)
        return config

    def kv_cache_spec(self, mode: str = "none") -> MambaSpec:
        """A PLE layer's state spec: a block table of ``1 + spec_tokens`` columns."""
        return MambaSpec(
            block_size=16,
            shapes=((64, 12),),
            dtypes=(torch.bfloat16,),
            mamba_type=MambaAttentionBackendEnum.SHORT_CONV,
            mamba_cache_mode=mode,
            num_speculative_blocks=self.spec_tokens,
        )


SETUPS = (
    *(EngineSetup(spec, full) for spec in (3, 1, 0) for full in (True, False)),
    EngineSetup(2, True, max_num_seqs=20, capture_sizes=(1, 2, 4, 8, 24)),
)


@attrs.frozen
class RunnerBatch:
    """One step, per engine row (padding rows included), as the runner hands it over."""

    query_lens: np.ndarray
    computed: np.ndarray
    prompt_lens: np.ndarray
    drafts: np.ndarray | None  # None: no speculative config
    accepted: np.ndarray
    table: np.ndarray  # [R, 1 + spec_tokens]
    seq_upper: np.ndarray
    num_actual_tokens: int

    def common_metadata(self, device: str = "cpu") -> CommonAttentionMetadata:
        """vLLM's own ``CommonAttentionMetadata`` of the step."""
        starts = np.concatenate([[0], np.cumsum(self.query_lens)]).astype(np.int32)
        seq_lens = (self.computed + self.query_lens).astype(np.int32)
        padding = self.query_lens == 0
        return CommonAttentionMetadata(
            query_start_loc=torch.from_numpy(starts).to(device),
            query_start_loc_cpu=torch.from_numpy(starts.copy()),
            seq_lens=torch.from_numpy(seq_lens).to(device),
            num_reqs=len(self.query_lens),
            num_actual_tokens=self.num_actual_tokens,
            max_query_len=int(self.query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_table_tensor=torch.from_numpy(self.table).to(device),
            slot_mapping=torch.zeros(self.num_actual_tokens, dtype=torch.int64, device=device),
            is_prefilling=torch.from_numpy((self.computed < self.prompt_lens) & ~padding),
            seq_lens_cpu_upper_bound=torch.from_numpy(self.seq_upper.astype(np.int32)),
        )

    def build_kwargs(self, device: str = "cpu") -> dict[str, Any]:
        """The runner's extra build arguments (none without a speculative config)."""
        if self.drafts is None:
            return {}
        return dict(
            num_accepted_tokens=torch.from_numpy(self.accepted).to(device),
            num_decode_draft_tokens_cpu=torch.from_numpy(self.drafts.copy()),
        )


def _request(rng: np.random.Generator, kind: int, spec_tokens: int) -> tuple[int, int, int, int]:
    """``(q, computed, prompt, drafts)`` of a decode (0), a prompt chunk with context
    (1) or a first chunk (2); drafts as the runner sets them with speculation on."""
    if kind == 0:
        prompt = int(rng.integers(1, 40))
        computed = prompt + int(rng.integers(0, 30))
        drafts = int(rng.integers(0, spec_tokens + 1))  # 0: a decode that got no drafts
        return drafts + 1, computed, prompt, drafts
    prompt = int(rng.integers(2 if kind == 1 else 1, 60))
    computed = int(rng.integers(1, prompt)) if kind == 1 else 0
    left = prompt - computed
    one = rng.random() < 0.35  # one-token prompt chunks, often
    q = 1 if one else int(rng.integers(1, min(left, 40) + 1))
    return q, computed, prompt, -1


def _order(rng: np.random.Generator, q, computed, prompt, threshold: int | None) -> np.ndarray:
    """vLLM's reorder regions (decode, short extend, long extend, first chunk), stable,
    with ``threshold``; ``None``: any order."""
    if threshold is None:
        return rng.permutation(len(q))
    context = computed > 0
    short = q <= threshold
    region = np.where(~context, 3, np.where(~short, 2, np.where(computed < prompt, 1, 0)))
    return np.argsort(region, kind="stable")


def runner_batch(
    rng: np.random.Generator, setup: EngineSetup, rows: int, weights: tuple[int, ...]
) -> RunnerBatch:
    """``rows`` requests of the kinds drawn with ``weights`` (decode, chunk with context,
    first chunk), in one of the runner's orders, then 0-3 padding rows and 0-4 padded
    tokens."""
    spec = setup.spec_tokens
    rows = min(rows, setup.max_num_seqs)  # the scheduler's limit on live rows
    kinds = rng.choice(3, size=rows, p=np.array(weights) / sum(weights))
    drawn = np.array([_request(rng, int(kind), spec) for kind in kinds]).reshape(rows, 4)
    q, computed, prompt, drafts = drawn.T
    threshold = [1, 1 + spec, None][int(rng.integers(0, 3))]
    order = _order(rng, q, computed, prompt, threshold)
    q, computed, prompt, drafts = q[order], computed[order], prompt[order], drafts[order]
    pad = min(int(rng.integers(0, 4)), max(setup.max_num_seqs, *setup.capture_sizes) - rows)
    zeros = np.zeros(pad, np.int64)
    q, computed, prompt = (np.concatenate([a, zeros]) for a in (q, computed, prompt))
    drafts = np.concatenate([drafts, zeros - 1]).astype(np.int32)
    total = rows + pad
    table = rng.integers(1, 10_000, (total, 1 + spec)).astype(np.int32)
    table[:, 0] = rng.permutation(np.arange(1, total + 1))
    table[rows:] = 0  # the runner's NULL block rows
    seq_upper = computed + q
    seq_upper[drafts > 0] += rng.integers(0, spec + 1, int((drafts > 0).sum()))
    return RunnerBatch(
        query_lens=q.astype(np.int32),
        computed=computed.astype(np.int32),
        prompt_lens=prompt.astype(np.int32),
        drafts=drafts if spec else None,
        accepted=rng.integers(1, spec + 2, total).astype(np.int32),
        table=table,
        seq_upper=seq_upper.astype(np.int32),
        num_actual_tokens=int(q.sum()) + int(rng.integers(0, 5)),
    )


def capture_batch(rng: np.random.Generator, setup: EngineSetup, rows: int) -> RunnerBatch:
    """A uniform batch as the runner captures a full graph over: every row ``1 + Q - 1``
    tokens (the last may have fewer), then 0-2 padding rows."""
    q_max = setup.spec_tokens + 1
    q = np.full(rows, q_max)
    q[-1] = int(rng.integers(1, q_max + 1))
    pad = int(rng.integers(0, 3))
    q = np.concatenate([q, np.zeros(pad, np.int64)]).astype(np.int32)
    total = rows + pad
    table = rng.integers(1, 10_000, (total, q_max)).astype(np.int32)
    table[:, 0] = rng.permutation(np.arange(1, total + 1))
    table[rows:] = 0
    computed = np.where(q > 0, rng.integers(1, 50, total), 0).astype(np.int32)
    return RunnerBatch(
        query_lens=q,
        computed=computed,
        prompt_lens=np.minimum(computed, 1).astype(np.int32),
        drafts=(q - 1).astype(np.int32) if setup.spec_tokens else None,
        accepted=q.copy(),
        table=table,
        seq_upper=(computed + q).astype(np.int32),
        num_actual_tokens=int(q.sum()),
    )


def padded_to(batch: RunnerBatch, rows: int, tokens: int) -> RunnerBatch:
    """``batch``'s live rows, then padding rows up to ``rows``, ``tokens`` tokens in all
    (as the runner pads a batch to a captured graph's size)."""
    live = int((batch.query_lens > 0).sum())  # padding rows trail
    pad = rows - live

    def cut(values: np.ndarray, fill: int) -> np.ndarray:
        return np.concatenate([values[:live], np.full(pad, fill, values.dtype)])

    table = np.concatenate([batch.table[:live], np.zeros((pad, batch.table.shape[1]), np.int32)])
    return RunnerBatch(
        query_lens=cut(batch.query_lens, 0),
        computed=cut(batch.computed, 0),
        prompt_lens=cut(batch.prompt_lens, 0),
        drafts=None if batch.drafts is None else cut(batch.drafts, -1),
        accepted=cut(batch.accepted, 1),
        table=table,
        seq_upper=cut(batch.seq_upper, 0),
        num_actual_tokens=tokens,
    )
