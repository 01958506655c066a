"""The vLLM adapter, duck-typed (vLLM is never imported): everything stepplan knows of vLLM.

:mod:`.bridge` reads vLLM's ``CommonAttentionMetadata`` (host data only for the builder;
everything for the offline oracle); :mod:`.seed` says which of the seed builder's fields
a plan sets and where each lies; :mod:`.builder` is the drop-in metadata builder, whose
layer groups share one plan per step through :mod:`.share`, laid out in one persistent
device buffer (:mod:`.stage`) and completed on the device by :mod:`.door`'s kernels
(launched by :mod:`.launcher`).
"""

from .bridge import (
    batch_from_common_metadata,
    host_array,
    host_only_array,
    plan_from_common_metadata,
)
from .builder import PlanMetadata, PlanMetadataBuilder
from .seed import (
    ARRAY_FIELDS,
    COUNT_FIELDS,
    SPEC_FIELDS,
    SeedShape,
    seed_graph_limits,
    seed_shape,
    seed_view,
)
from .share import StepShare

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
