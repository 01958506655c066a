"""The planner: one step's request set to one immutable execution plan.

Imports nothing else of stepplan. See ``SPEC.md`` §1 and §3.
"""

from .batch import DECODE, KIND_NAMES, PADDING, PREFILL, SPEC, StepBatch, host_ints, host_step_batch
from .buckets import (
    GraphChoices,
    choose_graph,
    choose_graphs,
    largest_graph_layout,
    layout_capacity,
)
from .compile import check_limits, compile_plan
from .config import GRAPH_MODES, MAX_GRAPH_SIZE, MAX_NUM_SEQS, PlannerConfig, default_graph_sizes
from .errors import PlanError
from .layout import FIELDS, BufferField, PlanLayout
from .native import NativeBuildError
from .plan import SUMMARY, ExecutionPlan, GraphKey, Op, PlanShape, plan_summary
from .planner import Planner

__all__ = [
    "DECODE",
    "FIELDS",
    "GRAPH_MODES",
    "KIND_NAMES",
    "MAX_GRAPH_SIZE",
    "MAX_NUM_SEQS",
    "PADDING",
    "PREFILL",
    "SPEC",
    "SUMMARY",
    "BufferField",
    "ExecutionPlan",
    "GraphChoices",
    "GraphKey",
    "NativeBuildError",
    "Op",
    "PlanError",
    "PlanLayout",
    "PlanShape",
    "Planner",
    "PlannerConfig",
    "StepBatch",
    "check_limits",
    "choose_graph",
    "choose_graphs",
    "compile_plan",
    "default_graph_sizes",
    "host_ints",
    "host_step_batch",
    "largest_graph_layout",
    "layout_capacity",
    "plan_summary",
]
