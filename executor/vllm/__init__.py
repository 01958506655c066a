"""The vLLM adapter: everything stepplan knows of vLLM.

Duck-typed (vLLM is never imported) but for :mod:`.vllm_builder` and :mod:`.plugin`,
which import vLLM when an engine loads them. :mod:`.common_metadata` reads vLLM's
``CommonAttentionMetadata`` (host data only for the builder; everything for the offline
oracle); :mod:`.revisions` says which revision of vLLM's builder sets which field, from
which source (:mod:`.metadata_fields`); :mod:`.builder` is the drop-in metadata builder,
whose layer groups share one plan per step through :mod:`.step_share`, laid out in one
persistent device buffer (:mod:`.device_buffer`) and completed on the device by the
kernels of :mod:`.gather_kernels` (launched by :mod:`.kernel_launcher`);
:mod:`.vllm_builder` is that builder as vLLM's own subclass, which :mod:`.plugin` hands
vLLM's PLE layers.
"""

from .builder import PlanMetadata, PlanMetadataBuilder, Vllm033PlanMetadata
from .common_metadata import (
    batch_from_common_metadata,
    host_array,
    host_only_array,
    plan_from_common_metadata,
)
from .metadata_fields import (
    ARRAY_FIELDS,
    COUNT_FIELDS,
    SPEC_FIELDS,
    GraphLimits,
    SeedShape,
    seed_graph_limits,
    seed_shape,
    seed_view,
)
from .revisions import (
    REVISIONS,
    SEED,
    VLLM_0_33,
    Revision,
    revision,
    revision_for_vllm,
    vllm_split,
)
from .step_share import StepShare

__all__ = [
    "ARRAY_FIELDS",
    "COUNT_FIELDS",
    "REVISIONS",
    "SEED",
    "SPEC_FIELDS",
    "VLLM_0_33",
    "GraphLimits",
    "PlanMetadata",
    "PlanMetadataBuilder",
    "Revision",
    "SeedShape",
    "StepShare",
    "Vllm033PlanMetadata",
    "batch_from_common_metadata",
    "host_array",
    "host_only_array",
    "plan_from_common_metadata",
    "revision",
    "revision_for_vllm",
    "seed_graph_limits",
    "seed_shape",
    "seed_view",
    "vllm_split",
]
