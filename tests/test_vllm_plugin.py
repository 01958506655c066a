"""stepplan in vLLM itself: the plugin as vLLM loads it, and its builder's fields against
vLLM 0.33's own ``PleShortConvAttentionMetadataBuilder`` on batches made as vLLM's runner
makes them (``vllm_runner_batches.py``), on vLLM's own ``CommonAttentionMetadata``."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vLLM 0.33.0: see .ci/run)")
import vllm_runner_batches as runner
from vllm.plugins import load_general_plugins
from vllm.v1.attention.backends.short_conv_attn import (
    PleShortConvAttentionBackend,
    PleShortConvAttentionMetadata,
    PleShortConvAttentionMetadataBuilder,
    ShortConvAttentionMetadataBuilder,
)
from vllm.v1.worker.utils import AttentionGroup

from stepplan.executor.vllm import VLLM_0_33, PlanMetadataBuilder, plugin, revision_for_vllm
from stepplan.executor.vllm.vllm_builder import field_differences


def load_plugins(monkeypatch, switch: str | None) -> type:
    """vLLM's own loader, run afresh with the switch as given (``None``: unset); the
    builder class vLLM's PLE backend then hands its runner."""
    if switch is None:
        monkeypatch.delenv(plugin.SWITCH, raising=False)
    else:
        monkeypatch.setenv(plugin.SWITCH, switch)
    monkeypatch.setattr("vllm.plugins.plugins_loaded", False)
    load_general_plugins()
    return PleShortConvAttentionBackend.get_builder_cls()


@pytest.fixture(scope="module")
def plugged():
    """The plugin on, as vLLM loads it, for the module's tests; off again after."""
    with pytest.MonkeyPatch.context() as patch:
        builder_cls = load_plugins(patch, "1")
        yield builder_cls
    plugin.unregister()


@pytest.fixture(scope="module")
def builders(plugged):
    """Per engine setup: stepplan's builder (the class vLLM's backend hands out), vLLM's
    own, made alike, and stepplan's duck-typed builder under revision ``vllm-0.33``."""
    made = {}

    def of(setup: runner.EngineSetup):
        if setup not in made:
            config, spec = setup.vllm_config(), setup.kv_cache_spec()
            ours = plugged(spec, ["model.layers.0.ple"], config, torch.device("cpu"))
            theirs = PleShortConvAttentionMetadataBuilder(
                spec, ["model.layers.0.ple"], config, torch.device("cpu")
            )
            inside = ours.stepplan
            duck = PlanMetadataBuilder(
                inside.config,
                "cpu",
                max_num_tokens=setup.max_num_batched_tokens,
                revision=VLLM_0_33,
                graph_limits=inside.share.graph_limits,
            )
            made[setup] = ours, theirs, duck
        return made[setup]

    return of


def test_vllm_loads_the_plugin_only_when_asked(monkeypatch):
    assert load_plugins(monkeypatch, None) is PleShortConvAttentionMetadataBuilder
    assert load_plugins(monkeypatch, "0") is PleShortConvAttentionMetadataBuilder
    plugged_cls = load_plugins(monkeypatch, "1")
    try:
        assert plugged_cls.__module__ == "stepplan.executor.vllm.vllm_builder"
        # What vLLM's runner and PLE layer check of a builder and its metadata.
        assert issubclass(plugged_cls, ShortConvAttentionMetadataBuilder)
        assert issubclass(plugged_cls.metadata_cls, PleShortConvAttentionMetadata)
        # Loading twice (vLLM may, in each process) changes nothing.
        assert load_plugins(monkeypatch, "1") is plugged_cls
        plugin.register()
        assert PleShortConvAttentionBackend.get_builder_cls() is plugged_cls
        monkeypatch.setenv(plugin.SWITCH, "yes")
        with pytest.raises(ValueError, match=r"^STEPPLAN_VLLM_BUILDER: must be 1 \(on\) or 0"):
            plugin.register()
    finally:
        plugin.unregister()
    assert PleShortConvAttentionBackend.get_builder_cls() is PleShortConvAttentionMetadataBuilder


def test_the_revision_follows_the_installed_vllm():
    vllm = importlib.import_module("vllm")
    assert revision_for_vllm(vllm.__version__) is VLLM_0_33
    assert revision_for_vllm("0.33.2.dev7+gabc") is VLLM_0_33
    with pytest.raises(ValueError, match=r"^vLLM 0\.34\.0: stepplan's builder follows vLLM 0\.33"):
        revision_for_vllm("0.34.0")


def test_every_field_of_vllms_metadata_has_a_place_in_the_revision():
    """vLLM 0.33's dataclass, field for field: set by a build, or always unset."""
    names = {field.name for field in dataclasses.fields(PleShortConvAttentionMetadata)}
    known = set(VLLM_0_33.field_names) | set(VLLM_0_33.unset_fields)
    assert names == known


@settings(max_examples=1000, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 40),
    setup=st.sampled_from(runner.SETUPS),
    weights=st.sampled_from([(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1),
                             (0, 1, 1), (3, 2, 1), (1, 3, 3), (6, 1, 1)]),
)  # fmt: skip
def test_builds_equal_vllms_own_field_for_field(builders, seed, rows, setup, weights):
    """Every field of vLLM's metadata, with vLLM's value, shape, dtype and device, and
    None exactly where vLLM's builder leaves it, on a step as vLLM's runner makes it."""
    ours, theirs, duck = builders(setup)
    batch = runner.runner_batch(np.random.default_rng(seed), setup, rows, weights)
    m, kwargs = batch.common_metadata(), batch.build_kwargs()
    want = theirs.build(0, m, **kwargs)
    got = ours.build(0, m, **kwargs)
    assert isinstance(got, PleShortConvAttentionMetadata)
    assert field_differences(got, want) == []
    assert field_differences(duck.build(0, m, **kwargs), want) == []  # without the subclass


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), setup=st.sampled_from(runner.SETUPS), data=st.data())
def test_capture_builds_equal_vllms_own(builders, seed, setup, data):
    """``build_for_cudagraph_capture`` on the uniform batches vLLM captures graphs over."""
    ours, theirs, _ = builders(setup)
    fit = min(
        theirs.decode_cudagraph_max_bs,
        theirs.decode_cudagraph_max_tokens // (1 + setup.spec_tokens),
    )
    rows = data.draw(st.integers(1, fit + 2), label="rows")  # a few beyond: refused
    batch = runner.capture_batch(np.random.default_rng(seed), setup, rows)
    m = batch.common_metadata()
    if m.num_reqs > theirs.decode_cudagraph_max_bs or (
        m.num_actual_tokens > theirs.decode_cudagraph_max_tokens
    ):
        with pytest.raises(ValueError, match="full graphs are captured for at most"):
            ours.build_for_cudagraph_capture(m)
        return
    want = theirs.build_for_cudagraph_capture(m)
    got = ours.build_for_cudagraph_capture(m)
    assert field_differences(got, want) == []


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), setup=st.sampled_from(runner.SETUPS))
def test_vllms_own_call_paths_reach_the_builder(plugged, seed, setup):
    """Through vLLM's ``AttentionGroup``, as its runner and its drafters call builders
    (``build_metadata`` with the runner's keyword arguments, ``..._for_cudagraph_capture``,
    ``..._for_drafting``, which passes ``fast_build``): the same fields as vLLM's own
    builder through the same calls."""
    config, spec = setup.vllm_config(), setup.kv_cache_spec()
    groups = []
    for backend_builder in (plugged, PleShortConvAttentionMetadataBuilder):
        group = AttentionGroup(PleShortConvAttentionBackend, ["ple"], spec, 0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                PleShortConvAttentionBackend,
                "get_builder_cls",
                staticmethod(lambda b=backend_builder: b),
            )
            group.create_metadata_builders(config, torch.device("cpu"))
        groups.append(group)
    ours, theirs = groups
    assert type(ours.get_metadata_builder()) is plugged
    rng = np.random.default_rng(seed)
    batch = runner.runner_batch(rng, setup, int(rng.integers(1, 30)), (3, 2, 1))
    m, kwargs = batch.common_metadata(), batch.build_kwargs()
    assert (
        field_differences(
            ours.build_metadata(m, 0, **kwargs), theirs.build_metadata(m, 0, **kwargs)
        )
        == []
    )
    assert (
        field_differences(
            ours.build_metadata_for_drafting(m, 0), theirs.build_metadata_for_drafting(m, 0)
        )
        == []
    )
    capture = runner.capture_batch(rng, setup, 2).common_metadata()
    assert (
        field_differences(
            ours.build_metadata_for_cudagraph_capture(capture),
            theirs.build_metadata_for_cudagraph_capture(capture),
        )
        == []
    )


def test_limits_equal_vllms_own(builders):
    for setup in runner.SETUPS:
        ours, theirs, _ = builders(setup)
        assert (ours.decode_cudagraph_max_bs, ours.decode_cudagraph_max_tokens) == (
            theirs.decode_cudagraph_max_bs,
            theirs.decode_cudagraph_max_tokens,
        )
        assert ours.reorder_batch_threshold == theirs.reorder_batch_threshold
        assert type(ours).get_cudagraph_support(None, None) == type(theirs).get_cudagraph_support(
            None, None
        )


def test_unsupported_settings_are_refused_in_one_line(plugged):
    setup = runner.SETUPS[0]
    config = setup.vllm_config()
    with pytest.raises(ValueError, match=r"^cache_config\.mamba_cache_mode: .*got 'align'"):
        plugged(setup.kv_cache_spec("align"), ["layer"], config, torch.device("cpu"))
    narrow = dataclasses.replace(setup.kv_cache_spec(), num_speculative_blocks=1)
    with pytest.raises(ValueError, match=r"^kv_cache_spec\.num_speculative_blocks: 1 for 3"):
        plugged(narrow, ["layer"], config, torch.device("cpu"))
