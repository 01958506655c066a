"""The part of ``vllm_builder_bench.py`` that runs vLLM 0.33 itself.

Builders of one layer group each, on the same steps drawn the same way, timed in the same
rounds as the bench's other cases:

- ``in vLLM``: stepplan's builder as vLLM's loader hands it out (the plugin switched on,
  ``load_general_plugins()``, then ``PleShortConvAttentionBackend.get_builder_cls()``:
  ``StepplanPleBuilder``, revision ``vllm-0.33``);
- ``vLLM 0.33``: vLLM's own ``PleShortConvAttentionMetadataBuilder``.

Both get vLLM's own ``CommonAttentionMetadata`` over persistent device buffers, as vLLM's
runner keeps them (:class:`VllmEngine`). Per batch the report then gives the
synchronizations per build of each (GPU), and whether every field of stepplan's metadata
equals vLLM's (:func:`~stepplan.executor.vllm.vllm_builder.field_differences`). On a GPU,
:func:`graph_replay` captures vLLM's ``ple_conv`` (spec rows) in a CUDA graph over the
fields of ``build_for_cudagraph_capture`` and replays it after each later ``build``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():  # vLLM's config needs a platform: the CPU one here
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import vllm.plugins
from vllm.config import CompilationConfig, CUDAGraphMode, SpeculativeConfig, VllmConfig
from vllm.config.scheduler import SchedulerConfig
from vllm.plugins import load_general_plugins
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.attention.backends.short_conv_attn import (
    PleShortConvAttentionBackend,
    PleShortConvAttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import MambaSpec

from stepplan.executor.vllm import plugin
from stepplan.executor.vllm.vllm_builder import StepplanPleBuilder, field_differences

#: vLLM's capture sizes for these batches: up to 1,024 tokens, so a pure spec step of 256
#: rows x 4 tokens is padded and captured as vLLM's builder pads it.
CAPTURE_SIZES = (1, 2, 4, 8, *range(16, 1025, 16))
CHANNELS, TAPS, DILATION = 1024, 4, 3


def engine_config(spec_tokens: int, max_num_seqs: int) -> VllmConfig:
    """The engine's ``VllmConfig``: n-gram drafts, full CUDA graphs at
    :data:`CAPTURE_SIZES` (set as the CUDA platform leaves them)."""
    config = VllmConfig(
        speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=spec_tokens),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=8192,
            max_model_len=8192,
            is_encoder_decoder=False,
        ),
        compilation_config=CompilationConfig(),
    )
    compilation = config.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    compilation.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    compilation.max_cudagraph_capture_size = CAPTURE_SIZES[-1]
    return config


def kv_cache_spec(spec_tokens: int) -> MambaSpec:
    return MambaSpec(
        block_size=16,
        shapes=((CHANNELS, (TAPS - 1) * DILATION + spec_tokens),),
        dtypes=(torch.bfloat16,),
        mamba_type=MambaAttentionBackendEnum.SHORT_CONV,
        num_speculative_blocks=spec_tokens,
    )


def plugged_builder_class() -> type:
    """The builder class vLLM's PLE backend hands out with the plugin switched on, loaded
    by vLLM's own loader as a fresh vLLM process loads it; the switch and vLLM's backend
    are left as they were."""
    before = os.environ.get(plugin.SWITCH)
    os.environ[plugin.SWITCH] = "1"
    vllm.plugins.plugins_loaded = False  # the loader runs once per process
    try:
        load_general_plugins()
        found = PleShortConvAttentionBackend.get_builder_cls()
    finally:
        if before is None:
            del os.environ[plugin.SWITCH]
        else:
            os.environ[plugin.SWITCH] = before
        plugin.unregister()
    if found is not StepplanPleBuilder:
        raise RuntimeError(f"vLLM's loader handed out {found.__name__}, not stepplan's builder")
    return found


class VllmEngine:
    """Persistent buffers as vLLM's runner keeps them (device: query starts, ``seq_lens``,
    the block table, accepted counts, the slot mapping), and each step's own
    ``CommonAttentionMetadata`` over them."""

    def __init__(self, device: str, rows: int, spec_tokens: int, *, uploads: bool = True) -> None:
        self.device = torch.device(device)
        # Without ``uploads`` a step leaves the device values as they were (stepplan's
        # builder reads only host values): it shows what the runner's uploads cost the build.
        self.uploads = uploads
        self.query_start = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.accepted = torch.ones(rows, dtype=torch.int32, device=device)
        self.table = torch.zeros(rows, 1 + spec_tokens, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(8192, dtype=torch.int64, device=device)

    def _put(self, target: torch.Tensor, values: np.ndarray) -> None:
        source = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int32))
        if self.device.type == "cuda":
            source = source.pin_memory()
        target.copy_(source, non_blocking=True)

    def step(
        self, inputs: dict, *, upload: bool = False, padded_tokens: int | None = None
    ) -> tuple[list[CommonAttentionMetadata], dict]:
        """The step's metadata (one group) and the build's keyword arguments, as vLLM's
        runner passes them, its device values uploaded (always, unless the engine was made
        without ``uploads``; ``upload`` asks for them regardless, for checks)."""
        q = inputs["query_lens"]
        rows = len(q)
        starts = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        seq_lens = (inputs["num_computed_tokens"] + q).astype(np.int32)
        # vLLM's own builder reads the device query starts, so every step uploads them,
        # as the runner does before its builds: from pinned memory, in stream order, so a
        # busy GPU keeps the host free and each build still sees its own step's values.
        if upload or self.uploads:
            self._put(self.query_start[: rows + 1], starts)
            self._put(self.seq_lens[:rows], seq_lens)
            self._put(self.accepted[:rows], inputs["num_accepted_tokens"])
            self._put(self.table[:rows, 0], inputs["slots"][0])
        tokens = padded_tokens or int(starts[-1])
        drafts = inputs["num_draft_tokens"]
        m = CommonAttentionMetadata(
            query_start_loc=self.query_start[: rows + 1],
            query_start_loc_cpu=torch.from_numpy(starts),
            seq_lens=self.seq_lens[:rows],
            seq_lens_cpu_upper_bound=torch.from_numpy(seq_lens),
            num_reqs=rows,
            num_actual_tokens=tokens,
            max_query_len=int(q.max()),
            max_seq_len=int(seq_lens.max()),
            block_table_tensor=self.table[:rows],
            slot_mapping=self.slot_mapping[:tokens],
            is_prefilling=torch.from_numpy((q > 1) & (drafts < 0)),
        )
        kwargs = dict(
            num_accepted_tokens=self.accepted[:rows],
            num_decode_draft_tokens_cpu=torch.from_numpy(drafts.copy()),
        )
        return [m], kwargs


class PluggedCase:
    """One batch's builder (stepplan's in vLLM, or vLLM's own) and its engine; steps are
    drawn as the bench's other cases draw them (``draw(rng, count)``)."""

    modes = ("idle", "busy")

    def __init__(self, builder: Any, engine: VllmEngine, draw: Any, seed: int) -> None:
        self.builders, self.engine = [builder], engine
        self.rng, self._draw = np.random.default_rng(seed), draw

    def steps(self, count: int) -> list[dict]:
        return self._draw(self.rng, count)


def make_cases(
    device: str,
    batches: dict,
    draw: Any,
    spec_tokens: int,
    plugged: type,
    *,
    own: bool = True,
    without_uploads: bool = False,
) -> dict:
    """Per batch whose steps are drawn afresh, stepplan's builder through vLLM's subclass
    and (``own``) vLLM's own, each on the same steps (``draw(rng, batch, count)``, the
    same seed); ``without_uploads`` adds stepplan's through vLLM on an engine that
    uploads nothing between builds."""
    batches = {name: batch for name, batch in batches.items() if not batch[4]}
    rows = max(spec + decode + len(prefills) for spec, decode, prefills, *_ in batches.values())
    config, spec = engine_config(spec_tokens, max(rows, 8)), kv_cache_spec(spec_tokens)
    cases = {}
    for index, (name, batch) in enumerate(batches.items()):
        engine = VllmEngine(device, rows, spec_tokens)
        kinds = {"in vLLM": (plugged, engine)}
        if own:
            kinds["vLLM 0.33"] = (PleShortConvAttentionMetadataBuilder, engine)
        if without_uploads:
            quiet = VllmEngine(device, rows, spec_tokens, uploads=False)
            kinds["in vLLM, no uploads"] = (plugged, quiet)
        for label, (kind, its_engine) in kinds.items():
            builder = kind(spec, ["model.layers.0.ple"], config, torch.device(device))
            cases[f"{name} | {label}"] = PluggedCase(
                builder, its_engine, lambda rng, count, batch=batch: draw(rng, batch, count), index
            )
    return cases


def check_fields(ours: PluggedCase, theirs: PluggedCase, inputs: dict) -> str:
    """stepplan's fields against vLLM's own for one step (device values uploaded)."""
    metadata, kwargs = ours.engine.step(inputs, upload=True)
    mine = ours.builders[0].build(0, metadata[0], **kwargs)
    differences = field_differences(mine, theirs.builders[0].build(0, metadata[0], **kwargs))
    if differences:
        return f"differs from vLLM's: {differences[0]}"
    return "every field equals vLLM 0.33's own builder's"


def graph_replay(
    plugged: type, engine_rows: int, draw_spec: Any, steps: int, spec_tokens: int
) -> str:
    """A CUDA graph of vLLM's ``ple_conv`` (spec rows) captured over stepplan's
    ``build_for_cudagraph_capture`` fields for ``engine_rows`` rows of ``Q`` tokens; each
    later pure spec step is built into the same buffers (host µs timed), the graph
    replayed, and its outputs and states compared with vLLM's kernel run eagerly over
    vLLM's own builder's fields."""
    from vllm.models.qwen4_exp.common.ops.ple import ple_conv

    config, spec = engine_config(spec_tokens, engine_rows), kv_cache_spec(spec_tokens)
    ours = plugged(spec, ["ple"], config, torch.device("cuda"))
    theirs = PleShortConvAttentionMetadataBuilder(spec, ["ple"], config, torch.device("cuda"))
    engine = VllmEngine("cuda", engine_rows, spec_tokens)
    tokens = engine_rows * (spec_tokens + 1)
    window = (TAPS - 1) * DILATION + spec_tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, CHANNELS, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.zeros_like(x)
    weight = torch.randn(CHANNELS, TAPS, device="cuda", dtype=torch.bfloat16, generator=gen)
    # Slots as the bench draws them: up to 2 x 4 groups x rows.
    pool = torch.randn(8 * engine_rows + 1, window, CHANNELS, device="cuda", dtype=torch.bfloat16)
    state = pool.permute(0, 2, 1)  # vLLM's [slot, window, channel] memory

    def run(md: Any, residual: torch.Tensor, conv_state: torch.Tensor) -> None:
        ple_conv(
            x[: md.num_actual_tokens], residual[: md.num_actual_tokens], conv_state, weight,
            md.spec_state_indices_tensor[: md.num_spec_decodes], None, mode="spec",
            dilation=DILATION, query_start_loc=md.spec_query_start_loc,
            num_accepted_tokens=md.num_accepted_tokens, spec_query_len=md.spec_query_len,
        )  # fmt: skip

    uniform = draw_spec(np.random.default_rng(1), 1, fixed=True)[0]
    metadata, _ = engine.step(uniform, upload=True)
    start = time.perf_counter()
    captured = ours.build_for_cudagraph_capture(metadata[0])
    capture_us = (time.perf_counter() - start) * 1e6
    run(captured, out.clone(), state.clone())  # compiles the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(captured, out, state)
    builds, replays, equal = [], [], 0
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for inputs in draw_spec(np.random.default_rng(2), steps, fixed=False):
        metadata, kwargs = engine.step(inputs, upload=True, padded_tokens=tokens)
        want_out, want_state = out.clone(), state.clone()
        run(theirs.build(0, metadata[0], **kwargs), want_out, want_state)
        torch.cuda.synchronize()
        start = time.perf_counter()
        ours.build(0, metadata[0], **kwargs)
        builds.append((time.perf_counter() - start) * 1e6)
        began.record()
        graph.replay()
        ended.record()
        torch.cuda.synchronize()
        replays.append(began.elapsed_time(ended) * 1e3)
        live = int(inputs["query_lens"].sum())
        equal += bool(torch.equal(out[:live], want_out[:live]) and torch.equal(state, want_state))
    return (
        f"graph over build_for_cudagraph_capture ({engine_rows} x {spec_tokens + 1}): capture "
        f"build {capture_us:.0f} µs; {steps} later steps: build p50 "
        f"{statistics.median(builds):.1f} µs, replay p50 {statistics.median(replays):.1f} µs "
        f"GPU; outputs and states equal vLLM's eager run on its own fields: {equal} of {steps}"
    )
