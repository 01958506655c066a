"""The plugin on a CUDA GPU with vLLM 0.33 itself: builds equal vLLM's own and never
synchronize; vLLM's own PLE kernel (``ple_conv``) fed stepplan's metadata writes the same
outputs and states as fed vLLM's builder's, for spec, decode, prefill and mixed steps,
and stepplan's kernels over the same plan agree with both; a CUDA graph captured over
``build_for_cudagraph_capture``'s metadata replays later steps' builds.

Run on a CUDA machine with vLLM importable (``/work/wt/gpu/i45_device.sh`` carries vLLM's
Python files there): ``python -m pytest -q -m gpu -p no:xdist tests/test_vllm_plugin_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/run and /work/wt/gpu)")
import vllm_runner_batches as runner  # noqa: E402
from vllm.models.qwen4_exp.common.ops.ple import ple_conv  # noqa: E402
from vllm.v1.attention.backends.short_conv_attn import (  # noqa: E402
    PleShortConvAttentionMetadata,
    PleShortConvAttentionMetadataBuilder,
)

from stepplan.executor.kernels import launch_shape, launch_short_conv  # noqa: E402
from stepplan.executor.vllm.vllm_builder import StepplanPleBuilder, field_differences  # noqa: E402

CHANNELS, TAPS, DILATION, SLOTS = 256, 4, 3, 128
SPEC, PLAIN = runner.SETUPS[0], runner.SETUPS[4]  # Q = 4 with full graphs; no speculation
#: Step kinds: (setup, weights of decode, chunk with context and first chunk rows).
KINDS = {
    "spec": (SPEC, (1, 0, 0)),
    "decode": (PLAIN, (1, 0, 0)),
    "prefill": (SPEC, (0, 1, 2)),
    "mixed": (SPEC, (3, 2, 1)),
    "mixed without spec": (PLAIN, (3, 2, 1)),
}


def make_builders(setup: runner.EngineSetup):
    config, spec = setup.vllm_config(), setup.kv_cache_spec()
    device = torch.device("cuda")
    return (
        StepplanPleBuilder(spec, ["ple"], config, device),
        PleShortConvAttentionMetadataBuilder(spec, ["ple"], config, device),
    )


@pytest.mark.parametrize("setup", runner.SETUPS, ids=str)
def test_builds_equal_vllms_own_on_the_gpu_and_never_synchronize(setup):
    ours, theirs = make_builders(setup)
    rng = np.random.default_rng(1)
    weights = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 2, 1), (1, 3, 3), (6, 1, 1)]
    for index in range(60):
        batch = runner.runner_batch(rng, setup, int(rng.integers(1, 40)), weights[index % 6])
        m, kwargs = batch.common_metadata("cuda"), batch.build_kwargs("cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises
        try:
            got = ours.build(0, m, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = theirs.build(0, m, **kwargs)
        assert isinstance(got, PleShortConvAttentionMetadata)
        assert field_differences(got, want) == [], index


def operands(rng: np.random.Generator, tokens: int, dtype: torch.dtype, spec_tokens: int):
    """Inputs, a residual, weights and a state pool in vLLM's ``[slot, window, channel]``
    memory seen as ``[slot, channel, window]`` (window ``(K - 1) D + Q - 1``)."""
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
    window = (TAPS - 1) * DILATION + spec_tokens
    x = torch.randn(tokens, CHANNELS, generator=gen).to("cuda", dtype)
    residual = torch.randn(tokens, CHANNELS, generator=gen).to("cuda", dtype)
    weight = (0.3 * torch.randn(CHANNELS, TAPS, generator=gen)).to("cuda", dtype)
    state = torch.randn(SLOTS, window, CHANNELS, generator=gen).to("cuda", dtype)
    return x, residual, weight, state.permute(0, 2, 1)


def vllm_kernel_step(md, x, residual, state, weight) -> None:
    """vLLM's ``ple_conv`` over one step's metadata, ``residual += y`` (its fused form, with
    an outer residual of zeros), a launch per kind of row, each fed the fields vLLM's PLE
    layer (``Qwen4ExpPLELayer``) feeds it: spec rows by their own slots, starts and
    accepted counts; decode rows (with their has-initial-state flags) and prefill rows
    (with their starts and flags) by the non-spec slots, through the token lists where
    the step also has spec rows, else on their own token ranges."""
    tokens = md.num_actual_tokens
    x, residual = x[:tokens], residual[:tokens]
    outer = torch.zeros_like(residual)
    spec, plain = md.spec_sequence_masks is not None, md.num_decodes + md.num_prefills > 0
    spec_map = plain_map = None
    if spec and plain:
        spec_map, plain_map = md.spec_token_indx, md.non_spec_token_indx
    common = dict(conv_state=state, conv_weights=weight, dilation=DILATION)
    if spec:
        ple_conv(
            x, residual, outer_residual=outer,
            state_indices=md.spec_state_indices_tensor[: md.num_spec_decodes], mode="spec",
            query_start_loc=md.spec_query_start_loc, num_accepted_tokens=md.num_accepted_tokens,
            spec_query_len=md.spec_query_len, token_indices=spec_map, **common,
        )  # fmt: skip
    if not plain:
        return
    slots = md.state_indices_tensor
    if not md.num_prefills:
        rows = x.shape[0] if plain_map is None else plain_map.numel()
        ple_conv(
            x, residual, outer_residual=outer, state_indices=slots[:rows], mode="decode",
            has_initial_states=md.has_initial_states_d, token_indices=plain_map, **common,
        )  # fmt: skip
        return
    split = [md.num_decode_tokens, md.num_prefill_tokens]
    slots_d, slots_p = slots.split([md.num_decodes, md.num_prefills])
    if plain_map is None:
        parts = x.split(split), residual.split(split), outer.split(split), (None, None)
    else:
        parts = (x, x), (residual, residual), (outer, outer), plain_map.split(split)
    (x_d, x_p), (r_d, r_p), (o_d, o_p), (map_d, map_p) = parts
    if md.num_decodes:
        ple_conv(
            x_d, r_d, outer_residual=o_d, state_indices=slots_d, mode="decode",
            has_initial_states=md.has_initial_states_d, token_indices=map_d, **common,
        )  # fmt: skip
    ple_conv(
        x_p, r_p, outer_residual=o_p, state_indices=slots_p, mode="prefill",
        query_start_loc=md.query_start_loc_p, has_initial_states=md.has_initial_states_p,
        token_indices=map_p, **common,
    )  # fmt: skip


def stepplan_kernel_step(md, x, residual, state, weight) -> None:
    """stepplan's kernels over the plan the build left on the device."""
    shape = launch_shape(md.plan)
    launch_short_conv(shape, md.plan_buffer, x, residual, state, weight, dilation=DILATION, group=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_vllms_kernel_fed_stepplans_metadata_equals_it_fed_vllms(kind, dtype):
    setup, weights = KINDS[kind]
    ours, theirs = make_builders(setup)
    rng = np.random.default_rng(list(KINDS).index(kind))
    for rows in (1, 3, 17, 40):
        batch = runner.runner_batch(rng, setup, rows, weights)
        # A padded token per padding row, no more: vLLM's decode launch runs a program per
        # token over the step's slots, so its graphs pad tokens and rows alike.
        live = int(batch.query_lens.sum())
        batch = runner.padded_to(
            batch, len(batch.query_lens), live + int((batch.query_lens == 0).sum())
        )
        m, kwargs = batch.common_metadata("cuda"), batch.build_kwargs("cuda")
        x, residual, weight, state = operands(
            rng, batch.num_actual_tokens, dtype, setup.spec_tokens
        )
        runs = {}
        for name, builder, step in (
            ("vllm", theirs, vllm_kernel_step),
            ("stepplan metadata", ours, vllm_kernel_step),
            ("stepplan kernels", ours, stepplan_kernel_step),
        ):
            out, pool = residual.clone(), state.clone()
            step(builder.build(0, m, **kwargs), x, out, pool, weight)
            torch.cuda.synchronize()
            runs[name] = out[:live], pool[1:]  # slot 0 is NULL: never live state
        what = f"{kind}, {rows} rows"
        for a, b in zip(runs["stepplan metadata"], runs["vllm"], strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=what)
        tolerance = (
            dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
        )
        torch.testing.assert_close(
            runs["stepplan kernels"][0], runs["vllm"][0], **tolerance, msg=what
        )
        torch.testing.assert_close(
            runs["stepplan kernels"][1], runs["vllm"][1], atol=0, rtol=0, msg=what
        )


def test_a_graph_captured_over_capture_metadata_replays_later_builds():
    """vLLM's kernel captured in a CUDA graph over ``build_for_cudagraph_capture``'s fields
    (a uniform spec batch of 8 rows); each later step of up to 8 spec rows, padded to
    8 as vLLM's runner pads it, builds into the same buffers and replays the graph: its
    outputs and states equal vLLM's kernel run eagerly over vLLM's own builder's fields."""
    ours, theirs = make_builders(SPEC)
    rng = np.random.default_rng(9)
    rows, q_max = 8, SPEC.spec_tokens + 1  # 32 tokens: the largest capture size
    capture = runner.capture_batch(rng, SPEC, rows)
    tokens = rows * q_max
    x, residual, weight, state = operands(rng, tokens, torch.float32, SPEC.spec_tokens)
    captured = ours.build_for_cudagraph_capture(capture.common_metadata("cuda"))
    scratch_out, scratch_state = residual.clone(), state.clone()
    vllm_kernel_step(captured, x, scratch_out, scratch_state, weight)  # compiles the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vllm_kernel_step(captured, x, residual, state, weight)
    for number in range(6):
        live_rows = int(rng.integers(1, rows + 1))
        batch = runner.runner_batch(rng, SPEC, live_rows, (1, 0, 0))
        batch = runner.padded_to(batch, rows, tokens)
        m, kwargs = batch.common_metadata("cuda"), batch.build_kwargs("cuda")
        x.copy_(torch.randn_like(x))
        start = torch.randn_like(residual)
        eager_out, eager_state = start.clone(), state.clone()
        vllm_kernel_step(theirs.build(0, m, **kwargs), x, eager_out, eager_state, weight)
        residual.copy_(start)
        ours.build(0, m, **kwargs)  # writes the fields the graph reads
        graph.replay()
        torch.cuda.synchronize()
        live = int(batch.query_lens.sum())
        what = f"step {number}, {live_rows} spec rows"
        torch.testing.assert_close(residual[:live], eager_out[:live], atol=0, rtol=0, msg=what)
        torch.testing.assert_close(state[1:], eager_state[1:], atol=0, rtol=0, msg=what)
