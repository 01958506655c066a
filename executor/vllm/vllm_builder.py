"""stepplan's builder as vLLM's own: a ``ShortConvAttentionMetadataBuilder`` subclass.

Imports vLLM (the rest of :mod:`stepplan.executor.vllm` does not). vLLM's model runner
hands ``num_accepted_tokens`` and ``num_decode_draft_tokens_cpu`` only to subclasses of
``ShortConvAttentionMetadataBuilder``, and the PLE layer refuses metadata that is not a
``PleShortConvAttentionMetadata``: :class:`StepplanPleBuilder` is the one and returns the
other (:class:`StepplanPleMetadata`, vLLM's dataclass plus the plan). A build is
:class:`~.builder.PlanMetadataBuilder`'s, under the rules of the revision of the vLLM
that runs (:func:`~.revisions.revision_for_vllm`): the same fields, values, shapes,
dtypes and devices as vLLM's own ``PleShortConvAttentionMetadataBuilder``, without
waiting for the device.

Refused at construction, each in one line: vLLM releases without a revision here,
``mamba_cache_mode`` other than ``"none"`` (``"align"``, prefix caching for state
layers, needs prefill checkpoints and per-step block columns this builder does not make),
ReplaySSM, and block tables narrower than ``1 + num_speculative_tokens`` columns.
Each builder (vLLM makes one per KV-cache group) has its own
:class:`~.step_share.StepShare`.
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import vllm
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.short_conv_attn import (
    PleShortConvAttentionMetadata,
    ShortConvAttentionMetadataBuilder,
)

from stepplan.planner import PlanError, PlannerConfig

from .builder import PLAN_FIELDS, PlanMetadataBuilder, _PlanAccess
from .metadata_fields import GraphLimits
from .revisions import Revision, revision_for_vllm


@dataclasses.dataclass(slots=True)
class StepplanPleMetadata(_PlanAccess, PleShortConvAttentionMetadata):
    """vLLM's ``PleShortConvAttentionMetadata`` as stepplan's builder fills it, plus the
    plan (``plan``, ``plan_shape``, ``plan_buffer``; see :class:`~.builder.PlanMetadata`).

    Every field is a slot: a build stores each in the object itself, not in a
    ``__dict__`` it would first have to make (:func:`metadata_maker`).
    """

    plan_record: Any = None
    group: int = 0
    step: int = 0


def planner_config(vllm_config: Any) -> tuple[PlannerConfig, GraphLimits]:
    """The planner config of a ``VllmConfig`` (speculative tokens, ``max_num_seqs``,
    capture sizes, full graphs or none) and the limits under which vLLM's builder pads
    uniform batches for its full graphs."""
    spec_tokens = vllm_config.num_speculative_tokens
    max_num_seqs = vllm_config.scheduler_config.max_num_seqs
    compilation = vllm_config.compilation_config
    full = compilation.cudagraph_mode.has_full_cudagraphs()
    sizes = tuple(sorted(compilation.cudagraph_capture_sizes or ())) or None
    try:
        config = PlannerConfig(
            num_spec_tokens=spec_tokens,
            graph_mode="full" if full else "none",
            graph_sizes=sizes,
            max_num_seqs=max_num_seqs,
        )
    except PlanError as error:
        raise ValueError(f"vllm_config: {error}") from None
    rows, tokens = max_num_seqs, max_num_seqs * (spec_tokens + 1)
    largest = compilation.max_cudagraph_capture_size
    if largest is not None:
        rows, tokens = min(rows, largest), min(tokens, largest)
    return config, GraphLimits(full, rows, tokens)


def running_revision() -> Revision:
    """The revision of the running vLLM (``ValueError``, one line, for a release without
    one)."""
    return revision_for_vllm(vllm.__version__)


def check_supported(vllm_config: Any, kv_cache_spec: Any) -> Revision:
    """The revision of the running vLLM, or ``ValueError`` (one line) where this builder
    cannot equal vLLM's own (see the module)."""
    revision = running_revision()
    cache = vllm_config.cache_config
    mode = kv_cache_spec.mamba_cache_mode
    if mode != "none":
        raise ValueError(
            f"cache_config.mamba_cache_mode: stepplan's PLE builder supports 'none' only, "
            f"got {mode!r} (switch prefix caching for state layers off, or the plugin off "
            "with STEPPLAN_VLLM_BUILDER=0)"
        )
    if cache.use_replayssm:
        raise ValueError("cache_config.use_replayssm: not supported by stepplan's PLE builder")
    spec_tokens = vllm_config.num_speculative_tokens
    if kv_cache_spec.num_speculative_blocks < spec_tokens:
        raise ValueError(
            f"kv_cache_spec.num_speculative_blocks: {kv_cache_spec.num_speculative_blocks} "
            f"for {spec_tokens} speculative tokens (the block table needs "
            f"{1 + spec_tokens} columns)"
        )
    return revision


class StepplanPleBuilder(ShortConvAttentionMetadataBuilder):
    """vLLM's PLE metadata builder, built by stepplan (see the module). vLLM's model
    runner makes it through ``PleShortConvAttentionBackend.get_builder_cls()`` once the
    plugin is on (:mod:`.plugin`). ``stepplan`` is the
    :class:`~.builder.PlanMetadataBuilder` it builds with."""

    metadata_cls = StepplanPleMetadata
    # As vLLM's PLE builder: full graphs of uniform (spec) batches, decodes first.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    reorder_batch_threshold: int = 1
    supports_update_block_table = False
    needs_causal_conv1d_metadata = False

    def __init__(
        self,
        kv_cache_spec: Any,
        layer_names: list[str],
        vllm_config: Any,
        device: torch.device,
    ) -> None:
        revision = check_supported(vllm_config, kv_cache_spec)
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        config, limits = planner_config(vllm_config)
        scheduler = vllm_config.scheduler_config
        self.stepplan = PlanMetadataBuilder(
            config,
            device,
            max_num_reqs=scheduler.max_num_seqs,
            max_num_tokens=scheduler.max_num_batched_tokens,
            revision=revision,
            graph_limits=limits,
            make_metadata=metadata_maker(revision),
        )
        self.decode_cudagraph_max_bs = self.stepplan.decode_cudagraph_max_bs
        self.decode_cudagraph_max_tokens = self.stepplan.decode_cudagraph_max_tokens
        # vLLM's calls go straight to stepplan's builder, whose signatures take what vLLM
        # passes: the methods below would add a call and their keyword arguments' repacking
        # (0.3 µs a build on this project's VM).
        self.build = self.stepplan.build
        self.build_for_cudagraph_capture = self.stepplan.build_for_cudagraph_capture

    def build(  # type: ignore[override]
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        *,
        num_accepted_tokens: torch.Tensor | None = None,
        num_decode_draft_tokens_cpu: torch.Tensor | None = None,
    ) -> StepplanPleMetadata:
        """:meth:`.builder.PlanMetadataBuilder.build` (an instance's ``build`` is that
        method itself)."""
        return self.stepplan.build(
            common_prefix_len,
            common_attn_metadata,
            fast_build,
            num_accepted_tokens=num_accepted_tokens,
            num_decode_draft_tokens_cpu=num_decode_draft_tokens_cpu,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> StepplanPleMetadata:
        """:meth:`.builder.PlanMetadataBuilder.build_for_cudagraph_capture` (an
        instance's is that method itself)."""
        return self.stepplan.build_for_cudagraph_capture(common_attn_metadata)


def metadata_maker(revision: Revision) -> Callable[[tuple], StepplanPleMetadata]:
    """Makes a :class:`StepplanPleMetadata` from a build's values (``revision``'s field
    order, then :data:`~.builder.PLAN_FIELDS`), the fields the revision leaves unset
    ``None`` (:func:`instance_maker`)."""
    order = revision.field_names + PLAN_FIELDS
    names = [field.name for field in dataclasses.fields(StepplanPleMetadata)]
    missing = set(names) - set(order) - set(revision.unset_fields)
    if missing or set(order) - set(names):
        raise ValueError(
            f"vLLM {vllm.__version__}: PleShortConvAttentionMetadata's fields differ from "
            f"revision {revision.name}'s ({sorted(missing or set(order) - set(names))})"
        )
    return instance_maker(StepplanPleMetadata, order, revision.unset_fields)


def instance_maker(
    cls: type, names: tuple[str, ...], nones: tuple[str, ...] = ()
) -> Callable[[tuple], Any]:
    """A function that makes a ``cls`` instance without its ``__init__``, sets its
    attributes ``names`` to a tuple's values, in order, and ``nones`` to ``None``.

    Made for these names as :mod:`dataclasses` makes an ``__init__``: from source, one
    attribute store per name, which Python runs as specialized instructions. For vLLM
    0.33's metadata, its fields slots, 0.5 µs a build on this project's VM, as much as the
    duck-typed builder's named tuple, against 1.6 µs for a ``__dict__`` of the values.
    """
    for name in (*names, *nones):
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"names: {name!r} is not an attribute name")
    values = [f"value_{index}" for index in range(len(names))]
    lines = [
        "def make(values):",
        f"    {', '.join(values)}, = values",
        "    made = new(cls)",
        *(f"    made.{name} = {value}" for name, value in zip(names, values, strict=True)),
        *(f"    made.{name} = None" for name in nones),
        "    return made",
    ]
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    exec(compile("\n".join(lines), f"<{cls.__name__} maker>", "exec"), namespace)
    return namespace["make"]


def field_differences(ours: Any, theirs: Any) -> list[str]:
    """Where two ``PleShortConvAttentionMetadata`` differ, field by field over vLLM's
    dataclass: ``None`` against a value, ints, and tensors by shape, dtype, device and
    values (each tensor read back: for checks, not for a build's path)."""
    found = []
    for name in (field.name for field in dataclasses.fields(PleShortConvAttentionMetadata)):
        a, b = getattr(ours, name), getattr(theirs, name)
        tensors = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
        if tensors != (True, True):
            if any(tensors) or (a is None) != (b is None) or a != b:
                found.append(f"{name}: {a!r} against vLLM's {b!r}")
        elif (a.shape, a.dtype, a.device.type) != (b.shape, b.dtype, b.device.type):
            found.append(
                f"{name}: {list(a.shape)} {a.dtype} {a.device} against vLLM's "
                f"{list(b.shape)} {b.dtype} {b.device}"
            )
        elif not torch.equal(a.cpu(), b.cpu()):
            found.append(f"{name}: {a.tolist()} against vLLM's {b.tolist()}")
    return found
