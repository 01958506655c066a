"""Scheduling decisions from the installed vLLM's own scheduler (``--scheduler vllm``).

vLLM's ``Scheduler`` and KV-cache manager decide every step: who runs, how many tokens,
who is preempted, which prompt blocks hit the prefix cache. This module plays vLLM's
model runner around them, with no weights, tokenizer, GPU or network: the cost model
times the step (in ``run.py``, as for stepplan's scheduler), the acceptance model says
how many drafts each spec row accepted, and the memory model (``capacity.py``) gives the
KV block count. The step's rows are written into the same :class:`StepRows` that
stepplan's scheduler fills, so the planner, the stepper's finish and every result
column work unchanged (``docs/scheduler_vllm.md``).

A hybrid model's cache is the one vLLM would build for it: attention groups and the
short-conv state group (``MambaSpec``) in one pool, a request's state block its slot.

vLLM is imported when this class is built, never at package import. Its configuration
is built from values (a ``DeviceConfig`` of ``cpu`` in place of ``VLLM_TARGET_DEVICE``,
a local model folder in place of the hub), so no environment variable is set.

The requests as vLLM sees them (their prompt tokens) and as the step path follows them:
``vllm_requests.py``.
"""

from __future__ import annotations

import tempfile
from importlib import metadata
from typing import Any

import attrs
import numpy as np

from ..memory_sizing import MemoryLayout
from ..settings.config import ConfigError, SchedulerConfig
from ..settings.config_model import ModelConfig
from ..traces import RequestTable
from . import vllm_requests
from .core import Scheduler
from .state import (
    DECODING,
    EMITS_FIRST,
    FINISHED,
    ROWS,
    SPEC,
    WAITING,
    RequestProgress,
    StepRows,
)
from .vllm_limits import check_model_len, check_page_bytes
from .vllm_requests import HASHED_TOKEN, UnfinishedRequest, placeholder_drafts, prompt_tokens

#: vLLM releases (``major.minor``) whose scheduler interface this module drives.
SUPPORTED_VLLM = ("0.33",)
INSTALL = "pip install 'vllm==0.33.*' einops"


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


def _vllm_config(
    config: SchedulerConfig, layout: MemoryLayout, max_model_len: int, folder: str
) -> Any:
    """vLLM's ``VllmConfig`` for ``config`` (no environment variable read or set)."""
    from transformers import LlamaConfig
    from vllm import config as vllm_config

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
    return vllm_config.VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        speculative_config=spec,
        device_config=vllm_config.DeviceConfig(device="cpu"),
    )


def _kv_cache_config(whole: Any, layout: MemoryLayout, model: ModelConfig, spec_tokens: int) -> Any:
    """The KV-cache config as vLLM builds it for ``model``: one attention group of the
    layout's blocks; for a hybrid model (conv layers beside attention) the attention
    layers and the short-conv state layers (``MambaSpec``) in vLLM's groups of one
    shared pool, the attention block made as large as a conv-state page and that page
    padded to it (vLLM's hybrid alignment), the memory divided by vLLM's planner."""
    import torch
    from vllm.v1.core import kv_cache_planning
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    dtype = {1: torch.int8, 2: torch.float16, 4: torch.float32}[model.dtype_bytes]
    hybrid = 0 < model.conv_layers < model.layers
    attention_layers = model.layers - model.conv_layers if hybrid else model.layers
    per_token = model.kv_bytes_per_token / attention_layers  # one layer's K and V
    head = max(1, int(per_token // (2 * model.dtype_bytes)))
    if not hybrid:
        attention = FullAttentionSpec(
            block_size=layout.block_size, num_kv_heads=1, head_size=head, dtype=dtype
        )
        groups = [KVCacheGroupSpec(["model.layers.0.attn"], attention)]
        blocks = layout.num_blocks + 1  # vLLM keeps block 0 as its null block
        return KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    specs = _hybrid_specs(whole, layout, model, spec_tokens, head, dtype)
    # what vLLM's engine core settles before it plans a hybrid model's cache
    whole.scheduler_config.disable_hybrid_kv_cache_manager = False
    whole.cache_config.kv_cache_layout = "LBHNC"
    groups = kv_cache_planning.get_kv_cache_groups(whole, specs)
    return kv_cache_planning.get_kv_cache_config_from_groups(
        whole, groups, int(layout.budget_bytes)
    )


def _hybrid_specs(
    whole: Any, layout: MemoryLayout, model: ModelConfig, spec_tokens: int, head: int, dtype: Any
) -> dict[str, Any]:
    """Every layer's cache spec of a hybrid model, sized as vLLM sizes them."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    reach = (model.conv_kernel_size - 1) * model.conv_dilation
    state_page = model.conv_channels * reach * model.dtype_bytes
    token_page = 2 * head * model.dtype_bytes
    align = layout.block_size
    block = align * -(-state_page // (align * token_page))  # attention page >= state page
    cache = whole.cache_config
    # prefix caching keeps a conv state at every block boundary: vLLM's "align" mode
    mode = "align" if layout.prefix_caching else "none"
    cache.block_size, cache.mamba_cache_mode = block, mode
    cache.mamba_block_size = block if layout.prefix_caching else whole.model_config.max_model_len
    attention = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=head, dtype=dtype)
    conv = MambaSpec(
        block_size=cache.mamba_block_size,
        shapes=((model.conv_channels, reach),),
        dtypes=(dtype,),
        page_size_padded=block * token_page,
        mamba_type=MambaAttentionBackendEnum.SHORT_CONV,
        mamba_cache_mode=mode,
        num_speculative_blocks=spec_tokens,  # one state per draft, as vLLM's baseline
        tp_replicated=True,
    )
    attention_layers = model.layers - model.conv_layers
    specs = {f"model.layers.{i}.attn": attention for i in range(attention_layers)}
    specs.update({f"model.layers.{i}.conv": conv for i in range(model.conv_layers)})
    return specs


def _engine(
    config: SchedulerConfig, layout: MemoryLayout, model: ModelConfig, folder: str
) -> tuple[Any, int | None, int]:
    """vLLM's scheduler for ``config`` over ``layout``'s memory, the index of its
    conv-state group (``None``: no such group) and the tokens its block hashes cover."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.structured_output import StructuredOutputManager

    whole = _vllm_config(config, layout, model.max_model_len, folder)
    kv_config = _kv_cache_config(whole, layout, model, config.num_spec_tokens)
    whole.cache_config.num_gpu_blocks = kv_config.num_blocks
    specs = [group.kv_cache_spec for group in kv_config.kv_cache_groups]
    state = next((i for i, s in enumerate(specs) if isinstance(s, MambaSpec)), None)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_config, whole)
    engine = VllmScheduler(
        whole,
        kv_config,
        StructuredOutputManager(whole),
        block_size=block_size,
        hash_block_size=hash_block_size,
        log_stats=True,
    )
    return engine, state, hash_block_size


class VllmEngineScheduler(RequestProgress):
    """:class:`~stepplan.sim.scheduler.Scheduler`'s interface over vLLM's scheduler:
    :meth:`schedule_rows` fills :attr:`rows`, :meth:`commit_rows` hands vLLM the
    step's outcome. Per-request arrays are ``[N]`` by the table's row, as there."""

    def __init__(
        self,
        requests: RequestTable,
        config: SchedulerConfig,
        layout: MemoryLayout,
        model: ModelConfig,
    ) -> None:
        version = check_vllm()
        check_model_len(requests, model.resolved().max_model_len)
        check_page_bytes(model.resolved())
        try:
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
            from vllm.v1.request import Request
        except ImportError as error:  # an install whose scheduler interface moved
            raise VllmUnavailable(
                f"--scheduler vllm drives vLLM {', '.join(SUPPORTED_VLLM)}; the installed "
                f"vLLM {version} lacks its scheduler interface ({error}): {INSTALL}"
            ) from None

        super().__init__(requests)
        self.config, self.table = config, requests
        self._folder = tempfile.TemporaryDirectory(prefix="stepplan-vllm-")
        self.engine, self._state_group, block_size = _engine(
            config, layout, model.resolved(), self._folder.name
        )
        self._moving_states = self._state_group is not None and layout.prefix_caching
        self.pool = VllmCache(layout, self.engine.kv_cache_manager)
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)  # as vLLM's engine core does before its first request
        # without prefix caching no block is ever looked up: hashing would be wasted
        self._hasher = (
            get_request_block_hasher(block_size, hash_fn) if layout.prefix_caching else None
        )
        self._request, self._sampling = Request, SamplingParams
        self._output, self._drafts = ModelRunnerOutput, DraftTokenIds
        self.slot_capacity = self.engine.max_num_running_reqs
        self._free_slots = list(range(self.slot_capacity, 0, -1))  # a stack, top at end
        self.rows = StepRows(self.slot_capacity)
        self.native = None  # the compiled stepper binds to stepplan's scheduler only
        self._arrivals: list[float] = self.arrival.tolist()
        self._added = 0  # requests handed to vLLM (those arrived)
        # every request added and not finished, by vLLM's name, in arrival order
        self.unfinished: dict[str, UnfinishedRequest] = {}
        self._scheduled: Any = None  # the step's SchedulerOutput
        self._step: list[UnfinishedRequest] = []  # its requests, in row order
        self._flags: list[int] = []  # their StepRows flags
        self._ids: list[int] = []  # their rows in the table
        self._block_tokens = layout.prefix_block_tokens
        self._block_ids = vllm_requests.hashed_block_tokens(requests)  # each block's token id
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
        return self._arrivals[self._added] if self._added < len(self._arrivals) else np.inf

    def _add_arrived(self, now_s: float) -> None:
        arrivals, request = self._arrivals, self._added
        while request < len(arrivals) and arrivals[request] <= now_s:
            tokens = prompt_tokens(self.table, request, self._block_tokens, self._block_ids)
            left = int(self.output[request])
            params = self._sampling(max_tokens=left, ignore_eos=True)
            name = str(request)
            vllm_request = self._request(
                name,
                tokens,
                params,
                pooling_params=None,
                arrival_time=arrivals[request],
                block_hasher=self._hasher,
            )
            self.engine.add_request(vllm_request)
            self.unfinished[name] = UnfinishedRequest(request, vllm_request, len(tokens), left)
            request += 1
        self._added = request

    def schedule_rows(self, now_s: float) -> tuple[int, int, float] | None:
        """vLLM's next step at ``now_s`` in :attr:`rows`: ``(rows, kv_tokens,
        attention_pairs)``, or ``None`` when it schedules nothing."""
        self._add_arrived(now_s)
        out = self.engine.schedule()
        self._scheduled = out
        preempted = out.preempted_req_ids
        for name in preempted or ():
            self._preempted(self.unfinished[name])
        scheduled = out.num_scheduled_tokens
        count = len(scheduled)
        self.counters.values[ROWS] = count
        if count == 0:
            self.engine.update_from_output(out, self._runner_output([], []))
            return None
        live, drafted = self.unfinished, out.scheduled_spec_decode_tokens
        running = DECODING | (SPEC if self.config.num_spec_tokens else 0)
        step = [live[name] for name in scheduled]
        q = list(scheduled.values())
        computed, flags = [], []
        for entry, tokens in zip(step, q, strict=True):
            start = entry.request.num_computed_tokens - tokens  # schedule() advanced it
            if not entry.slot:
                self._admitted(entry, start)
            if start >= entry.target:
                flags.append(running)
            else:
                # a prefill row's drafts are vLLM's placeholders (placeholder_drafts)
                prompt = tokens
                if drafted:
                    prompt -= len(drafted.get(entry.request.request_id, ()))
                flags.append(EMITS_FIRST if start + prompt == entry.target else 0)
            computed.append(start)
        if self._moving_states:
            self._follow_states(step)
        ids = [entry.index for entry in step]
        self._step, self._flags, self._ids = step, flags, ids
        slots = [entry.slot for entry in step]
        accepted = [entry.accepted for entry in step]
        kv_tokens, pairs = self.rows.fill_lists(ids, q, computed, flags, slots, accepted)
        self.rows.info[WAITING:] = self._memory_row(len(preempted or ()))
        return count, kv_tokens, pairs

    _placeholders = staticmethod(placeholder_drafts)

    def _admitted(self, entry: UnfinishedRequest, start: int) -> None:
        """``entry`` was admitted (new or resumed) this step with ``start`` tokens
        computed: a slot, and the tokens its prefix-cache hit saved or its preemption
        lost."""
        request = entry.index
        if self._state_group is None:
            entry.slot = self._free_slots.pop()
        elif not self._moving_states:  # its one conv-state block is its slot
            blocks = self.engine.kv_cache_manager.get_block_ids(entry.request.request_id)
            entry.slot = blocks[self._state_group][0]
        self.slot[request] = entry.slot
        lost = int(self.lost[request])
        self.recomputed[request] += max(0, lost - start)
        self.cached[request] += max(0, start - lost)
        self.prefix_hits += start
        self.computed[request] = start

    def _preempted(self, entry: UnfinishedRequest) -> None:
        """vLLM preempted ``entry`` (by recompute) while scheduling this step."""
        request = entry.index
        self._release_slot(entry)
        self.lost[request] = self.computed[request]
        self.computed[request] = 0
        entry.target = int(self.prompt[request]) + entry.emitted
        self.target[request] = entry.target
        entry.accepted = 1
        self.last_accepted[request] = 1
        self.preemptions[request] += 1

    def _follow_states(self, step: list[UnfinishedRequest]) -> None:
        """Slots of the step's rows where vLLM keeps a conv state per block ("align"
        mode): the newest state block of each (its list holds NULL for states freed)."""
        blocks_of = self.engine.kv_cache_manager.get_block_ids
        group = self._state_group
        for entry in step:
            held = blocks_of(entry.request.request_id)[group]
            entry.slot = next((block for block in reversed(held) if block), 0)
            self.slot[entry.index] = entry.slot

    def _release_slot(self, entry: UnfinishedRequest) -> None:
        if self._state_group is None:
            self._free_slots.append(entry.slot)
        entry.slot = 0
        self.slot[entry.index] = 0

    def _memory_row(self, preempted: int) -> tuple[int, int, int, int, float]:
        """The step's ``StepMemory`` fields: vLLM's queue and its block pool."""
        _, waiting = self.engine.get_request_counts()
        pool = self.engine.kv_cache_manager.block_pool
        blocks = pool.num_gpu_blocks - 1  # the null block is never handed out
        used = blocks - pool.get_num_free_blocks()
        return (waiting, preempted, used, 0, used / blocks)

    def listed_rows(self) -> tuple[list[int], list[int]]:
        """The step's requests and the spec steps each made before, as lists (what
        :class:`~stepplan.sim.stepper.Stepper` reads of the step besides :attr:`rows`)."""
        return self._ids, [entry.spec_steps for entry in self._step]

    def commit_rows(self, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hand vLLM the step in :attr:`rows` as its model runner would: the sampled
        tokens (``accepted`` drafts per row, ``[R], int64``, plus one), then the next
        drafts. Returns ``(emitted [R] int64, finished [R] bool)``."""
        emitted, finished = self.commit_listed(accepted.tolist())
        return np.array(emitted, np.int64), np.array(finished, bool)

    def commit_listed(self, accepted: list[int]) -> tuple[list[int], list[bool]]:
        """:meth:`commit_rows` with lists: ``(emitted, finished)`` per row. The
        ``[N]`` arrays are written element by element (a step holds a few rows)."""
        step, flags = self._step, self._flags
        emitted: list[int] = []
        for flag, drawn in zip(flags, accepted, strict=True):
            if flag & DECODING:
                emitted.append(1 + drawn)
            else:
                emitted.append(1 if flag & EMITS_FIRST else 0)
        names = [entry.request.request_id for entry in step]
        tokens = [[entry.index] * k for entry, k in zip(step, emitted, strict=True)]
        self.engine.update_from_output(self._scheduled, self._runner_output(names, tokens))
        finished: list[bool] = []
        finishing = False
        for entry, flag, drawn, k in zip(step, flags, accepted, emitted, strict=True):
            request = entry.index
            entry.left -= k
            entry.emitted += k
            self.emitted[request] = entry.emitted
            self.computed[request] = entry.request.num_computed_tokens
            if flag & SPEC:
                entry.accepted = 1 + drawn
                entry.spec_steps += 1
                self.last_accepted[request] = entry.accepted
                self.spec_steps[request] = entry.spec_steps
            done = entry.left <= 0
            finishing |= done
            finished.append(done)
        if finishing:
            for entry, done in zip(step, finished, strict=True):
                if done:
                    self._release_slot(entry)
                    del self.unfinished[entry.request.request_id]
            self.counters.values[FINISHED] += sum(finished)
        if self.config.num_spec_tokens:
            self._propose(step, names)
        return emitted, finished

    def _propose(self, step: list[UnfinishedRequest], names: list[str]) -> None:
        """Drafts for the step's rows still running: ``num_spec_tokens``, fewer near the
        end of the output so no step overshoots it (stepplan's rule,
        ``scheduler/__init__``): a row may draft one token less than it has left."""
        most = self.config.num_spec_tokens
        kept = [row for row, entry in enumerate(step) if entry.left > 0]
        drafts = [[step[row].index] * min(most, step[row].left - 1) for row in kept]
        self.engine.update_draft_token_ids(self._drafts([names[row] for row in kept], drafts))

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
