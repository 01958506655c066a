"""The vLLM adapter, duck-typed (vLLM is never imported): everything stepplan knows of vLLM.

:mod:`.bridge` reads vLLM's ``CommonAttentionMetadata`` into a step batch and compiles
its plan; :mod:`.seed` lays a plan out as the seed builder's metadata fields;
:mod:`.builder` is the drop-in metadata builder that uploads both in one copy.
"""

from .bridge import batch_from_common_metadata, host_array, plan_from_common_metadata
from .builder import (
    BOOL_FIELDS,
    COUNT_FIELDS,
    INT32_FIELDS,
    TOKEN_FIELDS,
    PlanMetadata,
    PlanMetadataBuilder,
)
from .seed import SPEC_FIELDS, seed_graph_limits, seed_view

__all__ = [
    "BOOL_FIELDS",
    "COUNT_FIELDS",
    "INT32_FIELDS",
    "SPEC_FIELDS",
    "TOKEN_FIELDS",
    "PlanMetadata",
    "PlanMetadataBuilder",
    "batch_from_common_metadata",
    "host_array",
    "plan_from_common_metadata",
    "seed_graph_limits",
    "seed_view",
]
