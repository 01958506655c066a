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
_UNSEEN = object()


class Planner:
    """Compiles steps for one config; ``compile(batch)`` equals ``compile_plan(batch, config)``.

    An engine's steps repeat their shape: the same graph bucket, and often the
    same rows per group. The planner keeps its graph choices (eager ones too,
    so a repeated eager shape skips the bucket search), and for the last
    ``max_templates`` graph shapes (layout, live rows per group, whether rows
    come in engine order) the whole buffer as far as that shape alone decides
    it (:func:`shape_rows`), so a graph step copies it in one write and fills
    only its own entries. Eager plans change size with every step's token and
    tile counts, so they keep no template and cost what ``compile_plan`` does
    (plus one lookup). Templates are read-only and only ever copied: plans
    never share memory with them. Instance state only; one planner per engine
    thread.
    """

    def __init__(self, config: PlannerConfig, max_templates: int = 8) -> None:
        if max_templates < 1:
            raise ValueError(f"max_templates must be positive, got {max_templates}")
        self.config = config
        self.max_templates = max_templates
        # A graph plan's (graph, layout), or None where the shape runs eagerly.
        self._graphs: dict[tuple[object, ...], tuple[GraphKey, PlanLayout] | None] = {}
        self._templates: OrderedDict[tuple[object, ...], np.ndarray] = OrderedDict()

    def compile(self, batch: StepBatch) -> ExecutionPlan:
        """The plan of ``batch``: the same value as ``compile_plan(batch, self.config)``."""
        order = _rows_in_group_order(batch)
        return _compile(batch, self.config, in_engine_order=order, shapes=self)

    def graph_and_layout(
        self, batch: StepBatch, num_tokens: int, num_tiles: int
    ) -> tuple[GraphKey | None, PlanLayout]:
        """The plan's graph and layout as ``compile_plan`` chooses them; the choice is
        kept per (rows per kind, tokens, padded tokens, layer groups), an eager
        layout (sized by this step's tiles) is made afresh."""
        key = (batch.kind_counts, num_tokens, batch.num_padded_tokens, batch.num_groups)
        found = self._graphs.get(key, _UNSEEN)
        if found is _UNSEEN:
            return self._choose(batch, key, num_tokens, num_tiles)
        if found is not None:
            return found  # type: ignore[return-value]
        live = sum(batch.kind_counts[:PADDING])
        return graph_and_layout(None, num_tokens, live, num_tiles, batch.num_groups)

    def _choose(
        self, batch: StepBatch, key: tuple[object, ...], num_tokens: int, num_tiles: int
    ) -> tuple[GraphKey | None, PlanLayout]:
        """A first-seen shape: ``compile_plan``'s choice, kept (``None`` for eager)."""
        bucket = _choose_graph(batch, self.config, num_tokens)
        live = sum(batch.kind_counts[:PADDING])
        graph, layout = graph_and_layout(bucket, num_tokens, live, num_tiles, batch.num_groups)
        if len(self._graphs) >= _MAX_GRAPHS:
            self._graphs.clear()
        self._graphs[key] = None if graph is None else (graph, layout)
        return graph, layout

    def template(
        self, layout: PlanLayout, counts: tuple[int, int, int], in_engine_order: bool
    ) -> np.ndarray:
        """``[layout.size], int32`` read-only: a graph plan's buffer as far as its shape
        decides it (:func:`shape_rows`), the token map at -1; entries a step writes
        are 0 here."""
        key = (layout, counts, in_engine_order)
        templates = self._templates
        template = templates.get(key)
        if template is not None:
            templates.move_to_end(key)
            return template
        tokens, rows, groups = layout.num_tokens, layout.num_rows, layout.num_groups
        template = np.zeros(layout.size, dtype=np.int32)
        template[:tokens] = -1
        section = template[tokens : tokens + (7 + groups) * rows + 1]
        shape_rows(section, rows, groups, counts, in_engine_order, self.config.index_ramp)
        template.flags.writeable = False
        templates[key] = template
        if len(templates) > self.max_templates:
            templates.popitem(last=False)
        return template
