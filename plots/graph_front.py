"""Step time against CUDA-graph memory: the size lists on the front of the two (the
fastest list for each memory), and the lists of a comparison as labelled points."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from .canvas import new_figure


def plot_time_memory(
    front: Sequence[tuple[float, float]],
    lists: Sequence[tuple[str, float, float]],
    title: str,
) -> Figure:
    """``front``: ``(graph MiB, total step s)`` of the front's lists, by memory;
    ``lists``: ``(label, graph MiB, total step s)`` of the lists to mark."""
    figure = new_figure(7.5, 4.5)
    axes = figure.add_subplot()
    if front:
        memory, seconds = zip(*front, strict=True)
        axes.step(memory, seconds, where="post", color="#4C72B0", lw=1.5)
        axes.plot(memory, seconds, "o", color="#4C72B0", ms=4, label="fastest list at its memory")
    markers = "sD^vP*X"
    for i, (label, mib, total) in enumerate(lists):
        axes.plot([mib], [total], markers[i % len(markers)], ms=7, label=label)
    axes.set_xlabel("graph memory (MiB)")
    axes.set_ylabel("predicted total step time (s)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    return figure
