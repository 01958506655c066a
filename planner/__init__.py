"""The planner: one step's request set to one immutable execution plan.

Imports nothing else of stepplan. See ``SPEC.md`` §1 and §3.
"""

from .batch import DECODE, KIND_NAMES, PADDING, PREFILL, SPEC, StepBatch
from .compile import compile_plan, largest_graph_layout, layout_capacity
from .config import GRAPH_MODES, PlannerConfig, default_graph_sizes
from .errors import PlanError
from .layout import FIELDS, BufferField, PlanLayout
from .native import NativeBuildError
from .plan import ExecutionPlan, GraphKey, Op
from .planner import Planner

__all__ = [
    "DECODE",
    "FIELDS",
    "GRAPH_MODES",
    "KIND_NAMES",
    "PADDING",
    "PREFILL",
    "SPEC",
    "BufferField",
    "ExecutionPlan",
    "GraphKey",
    "NativeBuildError",
    "Op",
    "PlanError",
    "PlanLayout",
    "Planner",
    "PlannerConfig",
    "StepBatch",
    "compile_plan",
    "default_graph_sizes",
    "largest_graph_layout",
    "layout_capacity",
]
