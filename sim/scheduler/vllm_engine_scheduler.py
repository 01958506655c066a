"""Scheduling decisions from the installed vLLM's own scheduler (``--scheduler vllm``).

vLLM's ``Scheduler`` and KV-cache manager decide every step: who runs, how many tokens,
who is preempted, which prompt blocks hit the prefix cache. This module plays vLLM's
model runner around them, with no weights, tokenizer, GPU or network: the cost model
times the step (in ``run.py``, as for stepplan's scheduler), the acceptance model says
how many drafts each spec row accepted, and the memory model (``capacity.py``) gives the
KV block count. The step's rows are written into the same :class:`StepRows` that
stepplan's scheduler fills, so the planner, the stepper's finish and every result
column work unchanged (``docs/scheduler_vllm.md``).

vLLM is imported when this class is built, never at package import. Its configuration
is built from values (a ``DeviceConfig`` of ``cpu`` in place of ``VLLM_TARGET_DEVICE``,
a local model folder in place of the hub), so no environment variable is set.

Prompt tokens: a trace's prefix hash ``h`` (Mooncake's ``hash_ids``, one per
``memory.prefix_block_tokens`` tokens) becomes that many tokens of id ``HASHED_TOKEN + h
mod 2**30``, so equal hash blocks are equal tokens and vLLM's block hasher sees the
trace's sharing; the rest of a prompt, and every output token, is the request's own
id, shared with no other request.
"""

from __future__ import annotations

import tempfile
from importlib import metadata
from typing import Any

import attrs
import numpy as np

from ..capacity import MemoryLayout
from ..config import ConfigError, SchedulerConfig
from ..traces import RequestTable
from .core import Scheduler
from .state import DECODING, EMITS_FIRST, FINISHED, ROWS, SPEC, WAITING, Counters, StepRows

#: vLLM releases (``major.minor``) whose scheduler interface this module drives.
SUPPORTED_VLLM = ("0.33",)
INSTALL = "pip install 'vllm==0.33.*' einops"
#: Token ids of hashed prompt blocks start here; request ids (the other tokens) are below.
HASHED_TOKEN = 1 << 30


class VllmUnavailable(ConfigError):
    """vLLM is missing or of an unsupported release; the message says what to install."""


def vllm_version() -> str | None:
    """The installed vLLM's version, ``None`` when it is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def check_vllm() -> str:
    """The installed vLLM's version when this module can drive it, else
    :class:`VllmUnavailable` in one line."""
    version = vllm_version()
    if version is None:
        raise VllmUnavailable(f"--scheduler vllm needs vLLM, which is not installed: {INSTALL}")
    if ".".join(version.split(".")[:2]) not in SUPPORTED_VLLM:
        raise VllmUnavailable(
            f"--scheduler vllm drives vLLM {', '.join(SUPPORTED_VLLM)} only; vLLM {version} "
            f"is installed ({INSTALL})"
        )
    return version


@attrs.frozen(eq=False)
class VllmCache:
    """The KV cache of a vLLM-scheduled run: stepplan's layout (which set its block
    count) and vLLM's KV-cache manager, which holds the blocks."""

    layout: MemoryLayout
    manager: Any


def prompt_tokens(table: RequestTable, request: int, block_tokens: int) -> list[int]:
    """Request ``request``'s prompt as token ids (see the module docstring)."""
    length = int(table.prompt_tokens[request])
    tokens: list[int] = []
    if table.prefix_offsets is not None and table.prefix_blocks is not None:
        start, end = table.prefix_offsets[request], table.prefix_offsets[request + 1]
        for block in table.prefix_blocks[start:end].tolist():
            tokens += [HASHED_TOKEN + block % HASHED_TOKEN] * block_tokens
    del tokens[length:]
    tokens += [request] * (length - len(tokens))
    return tokens


def _engine(config: SchedulerConfig, layout: MemoryLayout, max_model_len: int, folder: str) -> Any:
    """vLLM's scheduler for ``config`` over ``layout``'s blocks."""
    import torch
    from transformers import LlamaConfig
    from vllm import config as vllm_config
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    # the smallest Llama: vLLM reads a model folder's config, never its weights
    LlamaConfig(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        vocab_size=HASHED_TOKEN * 2,
        max_position_embeddings=max_model_len,
    ).save_pretrained(folder)
    model = vllm_config.ModelConfig(
        model=folder, skip_tokenizer_init=True, max_model_len=max_model_len
    )
    scheduler = vllm_config.SchedulerConfig(
        max_num_seqs=min(config.max_num_seqs, layout.slots),
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=False,
        is_encoder_decoder=False,
    )
    cache = vllm_config.CacheConfig(
        block_size=layout.block_size, enable_prefix_caching=layout.prefix_caching
    )
    spec = None
    if config.num_spec_tokens:  # n-gram drafting: no draft model, no lookahead slots
        spec = vllm_config.SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=config.num_spec_tokens,
            prompt_lookup_max=1,
            prompt_lookup_min=1,
        )
    whole = vllm_config.VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        speculative_config=spec,
        device_config=vllm_config.DeviceConfig(device="cpu"),
    )
    blocks = layout.num_blocks + 1  # vLLM keeps block 0 as its null block
    cache.num_gpu_blocks = blocks
    attention = FullAttentionSpec(
        block_size=layout.block_size, num_kv_heads=1, head_size=64, dtype=torch.float16
    )
    groups = [KVCacheGroupSpec(["model.layers.0.self_attn.attn"], attention)]
    kv_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    outputs = StructuredOutputManager(whole)
    return VllmScheduler(whole, kv_config, outputs, block_size=layout.block_size, log_stats=True)


class VllmEngineScheduler:
    """:class:`~stepplan.sim.scheduler.Scheduler`'s interface over vLLM's scheduler:
    :meth:`schedule_rows` fills :attr:`rows`, :meth:`commit_rows` hands vLLM the
    step's outcome. Per-request arrays are ``[N]`` by the table's row, as there."""

    def __init__(
        self,
        requests: RequestTable,
        config: SchedulerConfig,
        layout: MemoryLayout,
        max_model_len: int,
    ) -> None:
        check_vllm()
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
        from vllm.v1.request import Request

        n = requests.num_requests
        self.config, self.table = config, requests
        self._folder = tempfile.TemporaryDirectory(prefix="stepplan-vllm-")
        self.engine = _engine(config, layout, max_model_len, self._folder.name)
        self.pool = VllmCache(layout, self.engine.kv_cache_manager)
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)  # as vLLM's engine core does before its first request
        self._hasher = get_request_block_hasher(layout.block_size, hash_fn)
        self._request, self._sampling = Request, SamplingParams
        self._output, self._drafts = ModelRunnerOutput, DraftTokenIds
        self.arrival, self.prompt = requests.arrival_s, requests.prompt_tokens
        self.output = requests.output_tokens
        self.target = np.array(requests.prompt_tokens, np.int64)
        self.computed = np.zeros(n, np.int64)
        self.emitted = np.zeros(n, np.int64)
        self.slot = np.zeros(n, np.int32)
        self.last_accepted = np.ones(n, np.int32)
        self.spec_steps = np.zeros(n, np.int64)
        self.preemptions = np.zeros(n, np.int64)
        self.recomputed = np.zeros(n, np.int64)
        self.cached = np.zeros(n, np.int64)
        self.lost = np.zeros(n, np.int64)
        self.counters = Counters()
        self.slot_capacity = self.engine.max_num_running_reqs
        self._free_slots = list(range(self.slot_capacity, 0, -1))  # a stack, top at end
        self.rows = StepRows(self.slot_capacity)
        self.native = None  # the compiled stepper binds to stepplan's scheduler only
        self._added = 0  # requests handed to vLLM (those arrived)
        self._live: dict[int, Any] = {}  # vLLM's Request of every unfinished request added
        self._scheduled: Any = None  # the step's SchedulerOutput
        self._block_tokens = layout.prefix_block_tokens
        self.prefix_hits = 0  # prompt tokens vLLM's prefix cache gave at admissions

    scheduled_step = Scheduler.scheduled_step

    @property
    def num_finished(self) -> int:
        """Requests finished."""
        return int(self.counters.values[FINISHED])

    @property
    def done(self) -> bool:
        """Every request has finished."""
        return self.num_finished == self.prompt.shape[0]

    def next_arrival_s(self) -> float:
        """Arrival of the first request not yet handed to vLLM (``inf``: none left)."""
        return float(self.arrival[self._added]) if self._added < self.arrival.size else np.inf

    def _add_arrived(self, now_s: float) -> None:
        arrived = int(np.searchsorted(self.arrival, now_s, side="right"))
        for request in range(self._added, arrived):
            tokens = prompt_tokens(self.table, request, self._block_tokens)
            params = self._sampling(max_tokens=int(self.output[request]), ignore_eos=True)
            vllm_request = self._request(
                str(request),
                tokens,
                params,
                pooling_params=None,
                arrival_time=float(self.arrival[request]),
                block_hasher=self._hasher,
            )
            self.engine.add_request(vllm_request)
            self._live[request] = vllm_request
        self._added = max(self._added, arrived)

    def schedule_rows(self, now_s: float) -> tuple[int, int, float] | None:
        """vLLM's next step at ``now_s`` in :attr:`rows`: ``(rows, kv_tokens,
        attention_pairs)``, or ``None`` when it schedules nothing."""
        self._add_arrived(now_s)
        out = self.engine.schedule()
        self._scheduled = out
        for name in out.preempted_req_ids or ():
            self._preempted(int(name))
        count = len(out.num_scheduled_tokens)
        self.counters.values[ROWS] = count
        if count == 0:
            self.engine.update_from_output(out, self._runner_output([], []))
            return None
        ids = np.fromiter(map(int, out.num_scheduled_tokens), np.int64, count)
        q = np.fromiter(out.num_scheduled_tokens.values(), np.int64, count)
        for request in ids[self.slot[ids] == 0].tolist():
            self._admitted(request, self._live[request].num_computed_tokens)
        computed = self.computed[ids]
        decoding = computed >= self.target[ids]
        is_spec = decoding if self.config.num_spec_tokens else np.zeros(count, bool)
        prompt_q = q - self._placeholders(out, ids, decoding)
        emits_first = ~decoding & (computed + prompt_q == self.target[ids])
        flags = (is_spec * SPEC + decoding * DECODING + emits_first * EMITS_FIRST).astype(np.uint8)
        rows = self.rows
        rows.fill(ids, q, computed, flags, self.slot[ids], self.last_accepted[ids])
        rows.info[WAITING:] = self._memory_row(len(out.preempted_req_ids or ()))
        return count, int(rows.info[0]), float(rows.info[1])

    @staticmethod
    def _placeholders(out: Any, ids: np.ndarray, decoding: np.ndarray) -> np.ndarray:
        """``[R], int64`` placeholder drafts of prefill rows: vLLM pads an admitted
        request with one token left to ``1 + num_spec_tokens`` rows when others run
        (its full-graph padding); they are rejected, the row samples one token."""
        padded = np.zeros(ids.size, np.int64)
        drafts = out.scheduled_spec_decode_tokens
        if drafts:
            for row in np.flatnonzero(~decoding).tolist():
                padded[row] = len(drafts.get(str(ids[row]), ()))
        return padded

    def _admitted(self, request: int, computed_after: int) -> None:
        """``request`` was admitted (new or resumed) this step: a slot, and the tokens
        its prefix-cache hit saved or its preemption lost."""
        start = computed_after - self._scheduled.num_scheduled_tokens[str(request)]
        self.slot[request] = self._free_slots.pop()
        lost = int(self.lost[request])
        self.recomputed[request] += max(0, lost - start)
        self.cached[request] += max(0, start - lost)
        self.prefix_hits += start
        self.computed[request] = start

    def _preempted(self, request: int) -> None:
        """vLLM preempted ``request`` (by recompute) while scheduling this step."""
        self._free_slots.append(int(self.slot[request]))
        self.slot[request] = 0
        self.lost[request] = self.computed[request]
        self.computed[request] = 0
        self.target[request] = self.prompt[request] + self.emitted[request]
        self.last_accepted[request] = 1
        self.preemptions[request] += 1

    def _memory_row(self, preempted: int) -> tuple[int, int, int, int, float]:
        """The step's ``StepMemory`` fields: vLLM's queue and its block pool."""
        _, waiting = self.engine.get_request_counts()
        blocks = self.pool.layout.num_blocks
        used = blocks - self.engine.kv_cache_manager.block_pool.get_num_free_blocks() + 1
        return (waiting, preempted, used, 0, used / blocks)

    def commit_rows(self, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hand vLLM the step in :attr:`rows` as its model runner would: the sampled
        tokens (``accepted`` drafts per row, ``[R], int64``, plus one), then the next
        drafts. Returns ``(emitted [R] int64, finished [R] bool)``."""
        rows, count = self.rows, int(self.counters.values[ROWS])
        ids = rows.ids[:count].copy()
        flags = rows.flags[:count]
        spec, decoding = (flags & SPEC) != 0, (flags & DECODING) != 0
        emitted = np.where(decoding, 1 + accepted, (flags & EMITS_FIRST) != 0).astype(np.int64)
        names = [str(request) for request in ids.tolist()]
        tokens = [
            [request] * int(k) for request, k in zip(ids.tolist(), emitted.tolist(), strict=True)
        ]
        self.engine.update_from_output(self._scheduled, self._runner_output(names, tokens))
        self.emitted[ids] += emitted
        for request in ids.tolist():
            self.computed[request] = self._live[request].num_computed_tokens
        if spec.any():
            self.last_accepted[ids[spec]] = 1 + accepted[spec]
            self.spec_steps[ids[spec]] += 1
        finished = self.emitted[ids] >= self.output[ids]
        for request in ids[finished].tolist():
            self._free_slots.append(int(self.slot[request]))
            self.slot[request] = 0
            del self._live[request]
        self.counters.values[FINISHED] += int(finished.sum())
        if self.config.num_spec_tokens:
            self._propose(ids[~finished])
        return emitted, finished

    def _propose(self, ids: np.ndarray) -> None:
        """Drafts for the rows still running: ``num_spec_tokens``, fewer near the end of
        the output so no step overshoots it (stepplan's rule, ``scheduler/__init__``)."""
        left = self.output[ids] - self.emitted[ids] - 1
        k = np.minimum(self.config.num_spec_tokens, left).tolist()
        names = [str(request) for request in ids.tolist()]
        drafts = [[request] * size for request, size in zip(ids.tolist(), k, strict=True)]
        self.engine.update_draft_token_ids(self._drafts(names, drafts))

    def _runner_output(self, names: list[str], tokens: list[list[int]]) -> Any:
        index = {name: row for row, name in enumerate(names)}
        return self._output(req_ids=names, req_id_to_index=index, sampled_token_ids=tokens)

    def memory_columns(self) -> dict[str, np.ndarray]:
        """``requests.csv``'s memory columns, ``[N], int64`` each."""
        return {
            "num_preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed,
            "cached_tokens": self.cached,
        }


__all__ = ["VllmEngineScheduler", "VllmUnavailable", "check_vllm", "vllm_version"]
