"""A deployment's replicas over the simulated clock: each one's waiting queue and KV-cache
usage (time-weighted means over spans of the run, ``sim/cli/report_reading.py``)."""

from __future__ import annotations

from matplotlib import colormaps
from matplotlib.figure import Figure

from stepplan.sim.results.table import Table

from .canvas import new_figure


def plot_replicas(series: Table) -> Figure:
    """Two panels over simulated time, a line per replica: requests waiting, and the
    share of KV blocks in use. ``series``: ``replica``, ``time_s``, ``num_waiting``,
    ``kv_usage`` (``[k]`` each; NaN where a replica ran no step in a span)."""
    replica = series.column("replica")
    figure = new_figure(10.0, 5.5)
    queue, kv = figure.subplots(2, 1, sharex=True)
    count = int(replica.max()) + 1 if replica.size else 0
    colors = colormaps["tab20"]  # 20 distinct colours; more replicas share them
    for index in range(count):
        mine = replica == index
        time = series.column("time_s")[mine]
        color = colors(index % 20)
        waiting = series.column("num_waiting")[mine]
        queue.plot(time, waiting, linewidth=0.8, color=color, label=f"replica {index}")
        kv.plot(time, series.column("kv_usage")[mine] * 100.0, linewidth=0.8, color=color)
    queue.set_ylabel("requests waiting (mean)")
    queue.set_ylim(bottom=0)
    queue.grid(alpha=0.3)
    if count <= 16:
        queue.legend(loc="upper right", fontsize=7, ncol=4)
    kv.set_ylabel("KV cache used (%)")
    kv.set_ylim(bottom=0)
    kv.set_xlabel("simulated time (s)")
    kv.grid(alpha=0.3)
    figure.suptitle(f"{count} replicas: queue and KV cache over time")
    return figure


def replica_rows(per_replica: list[dict]) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
    """The report's table of replicas from ``summary.json``'s ``deployment.per_replica``:
    its header and a row per replica (with each one's pool where a run has two)."""
    header = (
        "replica",
        "requests",
        "steps",
        "tokens",
        "utilisation",
        "mean queue",
        "peak queue",
        "mean KV usage",
        "peak KV usage",
        "prefix hit rate",
        "TTFT mean ms",
    )
    keys = (
        "replica",
        "requests",
        "steps",
        "tokens",
        "utilisation",
        "mean_queue",
        "peak_queue",
        "mean_kv_usage",
        "peak_kv_usage",
        "prefix_cache_hit_rate",
        "ttft_ms_mean",
    )
    if any("pool" in entry for entry in per_replica):  # a prefill pool and a decode pool
        header, keys = ("replica", "pool", *header[1:]), ("replica", "pool", *keys[1:])
    rows = [tuple(entry.get(key) for key in keys) for entry in per_replica]
    return header, rows
