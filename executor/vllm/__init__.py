"""The vLLM adapter, duck-typed (vLLM is never imported): everything stepplan knows of vLLM.

:mod:`.common_metadata` reads vLLM's ``CommonAttentionMetadata`` (host data only for the builder;
everything for the offline oracle); :mod:`.metadata_fields` says which of the seed builder's fields
a plan sets and where each lies; :mod:`.builder` is the drop-in metadata builder, whose
layer groups share one plan per step through :mod:`.step_share`, laid out in one persistent
device buffer (:mod:`.device_buffer`) and completed on the device by the kernels of
:mod:`.gather_kernels` (launched by :mod:`.kernel_launcher`).
"""

from .builder import PlanMetadata, PlanMetadataBuilder
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
    SeedShape,
    seed_graph_limits,
    seed_shape,
    seed_view,
)
from .step_share import StepShare

__all__ = [
    "ARRAY_FIELDS",
    "COUNT_FIELDS",
    "SPEC_FIELDS",
    "PlanMetadata",
    "PlanMetadataBuilder",
    "SeedShape",
    "StepShare",
    "batch_from_common_metadata",
    "host_array",
    "host_only_array",
    "plan_from_common_metadata",
    "seed_graph_limits",
    "seed_shape",
    "seed_view",
]
