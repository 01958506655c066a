"""``Planner``: ``compile_plan`` for a stream of steps, keeping what repeats between them."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .batch import PADDING, StepBatch
from .compile import _choose_graph, _compile, _rows_in_group_order, graph_and_layout, shape_rows
from .config import PlannerConfig
from .layout import PlanLayout
from .plan import ExecutionPlan, GraphKey

#: Graph choices kept (a few small objects each); all are let go when this many are kept.
_MAX_GRAPHS = 4096


class Planner:
    """Compiles steps for one config; ``compile(batch)`` equals ``compile_plan(batch, config)``.

    An engine's steps repeat their shape: the same graph bucket, and often the
    same rows per group. The planner keeps its graph choices (graph plans only),
    and for the last ``max_templates`` shapes (live rows per group, the layout
    of a graph plan or the padded rows and layer groups of an eager one, whether
    rows come in engine order) the entries that shape alone decides
    (:func:`shape_rows`), so a step copies them in one write and fills only its
    own entries. Templates are read-only and only ever copied: plans never
    share memory with them. Instance state only; one planner per engine thread.
    """

    def __init__(self, config: PlannerConfig, max_templates: int = 8) -> None:
        if max_templates < 1:
            raise ValueError(f"max_templates must be positive, got {max_templates}")
        self.config = config
        self.max_templates = max_templates
        self._graphs: dict[tuple[object, ...], tuple[GraphKey | None, PlanLayout]] = {}
        self._templates: OrderedDict[tuple[object, ...], np.ndarray] = OrderedDict()

    def compile(self, batch: StepBatch) -> ExecutionPlan:
        """The plan of ``batch``: the same value as ``compile_plan(batch, self.config)``."""
        order = _rows_in_group_order(batch)
        return _compile(batch, self.config, in_engine_order=order, shapes=self)

    def graph_and_layout(
        self, batch: StepBatch, num_tokens: int, num_tiles: int
    ) -> tuple[GraphKey | None, PlanLayout]:
        """The plan's graph and layout as ``compile_plan`` chooses them, kept per
        (rows per kind, tokens, padded tokens, layer groups) when a graph fits
        (an eager layout changes with every step's tiles and is made afresh)."""
        key = (batch.kind_counts, num_tokens, batch.num_padded_tokens, batch.num_groups)
        found = self._graphs.get(key)
        if found is not None:
            return found
        bucket = _choose_graph(batch, self.config, num_tokens)
        live = sum(batch.kind_counts[:PADDING])
        found = graph_and_layout(bucket, num_tokens, live, num_tiles, batch.num_groups)
        if bucket is not None:
            if len(self._graphs) >= _MAX_GRAPHS:
                self._graphs.clear()
            self._graphs[key] = found
        return found

    def template(
        self,
        layout: PlanLayout,
        counts: tuple[int, int, int],
        in_engine_order: bool,
        graph: GraphKey | None,
    ) -> np.ndarray:
        """Read-only ``int32``: what :func:`shape_rows` writes for this shape.

        For a graph plan the whole ``[layout.size]`` buffer (token map at -1,
        tile fields 0: every step writes them); for an eager plan, whose token
        and tile counts change from step to step, the row section
        ``[R + 1 + 6 R + G R]`` alone. Entries a step writes are 0 here.
        """
        key = (layout if graph else (layout.num_rows, layout.num_groups), counts, in_engine_order)
        templates = self._templates
        template = templates.get(key)
        if template is not None:
            templates.move_to_end(key)
            return template
        tokens, rows, groups = layout.num_tokens, layout.num_rows, layout.num_groups
        at_tiles = tokens + (7 + groups) * rows + 1
        template = np.zeros(layout.size if graph else at_tiles - tokens, dtype=np.int32)
        section = template[tokens:at_tiles] if graph else template
        if graph:
            template[:tokens] = -1
        shape_rows(section, rows, groups, counts, in_engine_order, self.config.index_ramp)
        template.flags.writeable = False
        templates[key] = template
        if len(templates) > self.max_templates:
            templates.popitem(last=False)
        return template
