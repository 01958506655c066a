"""The op graph of one plan: kernel launches and the buffers each reads and writes."""

from __future__ import annotations

from typing import Any

import networkx as nx
from matplotlib.figure import Figure

from stepplan.sim.results.table import ResultsError

from .canvas import COLORS, new_figure

#: Layers of the drawing, left to right: buffers only read, ops, buffers written.
INPUTS, OPS, OUTPUTS = 0, 1, 2


def op_graph_of(plan_or_graph: Any) -> nx.DiGraph:
    """The graph of a plan (anything with ``op_graph()``) or a graph as is, checked:
    every node has ``kind`` ``op`` or ``buffer`` and edges join an op and a buffer."""
    graph = plan_or_graph.op_graph() if hasattr(plan_or_graph, "op_graph") else plan_or_graph
    if not isinstance(graph, nx.DiGraph):
        raise ResultsError(f"expected a plan or a networkx DiGraph, got {type(graph).__name__}")
    if graph.number_of_nodes() == 0:
        raise ResultsError("the op graph is empty")
    for node, kind in graph.nodes(data="kind"):
        if kind not in ("op", "buffer"):
            raise ResultsError(
                f"op graph node {node!r}: kind must be 'op' or 'buffer', got {kind!r}"
            )
    for source, target in graph.edges:
        if graph.nodes[source]["kind"] == graph.nodes[target]["kind"]:
            raise ResultsError(
                f"op graph edge {source!r} -> {target!r} must join an op and a buffer"
            )
    return graph


def _layers(graph: nx.DiGraph) -> dict[Any, int]:
    layer = {}
    for node, kind in graph.nodes(data="kind"):
        if kind == "op":
            layer[node] = OPS
        else:
            layer[node] = OUTPUTS if graph.in_degree(node) else INPUTS
    return layer


def _op_label(graph: nx.DiGraph, node: Any) -> str:
    data = graph.nodes[node]
    grid = data.get("grid") or ()
    shape = f"[{'x'.join(map(str, grid))}]" if grid else ""
    return f"{node}\n{data.get('kernel', '')}{shape}"


def plot_op_graph(plan_or_graph: Any, title: str | None = None) -> Figure:
    """Draw the plan's op graph: buffers only read on the left, ops in launch order (top
    to bottom) in the middle, buffers written on the right; reads grey, writes red."""
    graph = op_graph_of(plan_or_graph)
    layer = _layers(graph)
    columns = {k: [n for n in graph if layer[n] == k][::-1] for k in (INPUTS, OPS, OUTPUTS)}
    # multipartite_layout stacks each list bottom-up, so reversed lists read top-down.
    position = nx.multipartite_layout(graph, subset_key={k: v for k, v in columns.items() if v})
    height = 1.0 + 0.75 * max(len(nodes) for nodes in columns.values())
    figure = new_figure(10.0, height)
    axes = figure.subplots()
    reads = [(u, v) for u, v in graph.edges if layer[u] != OPS]
    writes = [(u, v) for u, v in graph.edges if layer[u] == OPS]
    common = {"ax": axes, "arrows": True, "arrowsize": 9, "node_size": 2600}
    nx.draw_networkx_edges(graph, position, edgelist=reads, edge_color="#999999", **common)
    bent = "arc3,rad=0.12"  # writes bend, so a read and a write of one buffer stay apart
    nx.draw_networkx_edges(
        graph, position, edgelist=writes, edge_color=COLORS["seed"], connectionstyle=bent, **common
    )
    for kind, box, color in (("op", "square", "#F5E6C8"), ("buffer", "round", "#DDE8F5")):
        labels = {
            n: _op_label(graph, n) if kind == "op" else str(n)
            for n, k in graph.nodes(data="kind")
            if k == kind
        }
        style = {"boxstyle": f"{box},pad=0.4", "facecolor": color, "edgecolor": "#666666"}
        nx.draw_networkx_labels(graph, position, labels, font_size=7, bbox=style, ax=axes)
    axes.plot([], [], color="#999999", label="reads")
    axes.plot([], [], color=COLORS["seed"], label="writes")
    axes.legend(loc="lower left", fontsize=7, frameon=False)
    axes.set_axis_off()
    axes.margins(x=0.12, y=0.08)
    ops = len(columns[OPS])
    axes.set_title(title or f"Op graph: {ops} ops over {len(graph) - ops} buffers", fontsize=10)
    return figure
