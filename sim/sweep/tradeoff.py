"""The trade-off over a sweep's points: SLOs, the Pareto front, the best point per SLO.

An SLO is a set of upper bounds on metric columns of the sweep table
(``ttft_p99_ms=500,tpot_p99_ms=50``): a point meets it when every bound holds (a NaN
metric never does). The Pareto front, per trace, is the points no other point beats on
both axes of the trade-off (``x`` lower is better, ``y`` higher); the best point of an
SLO is, per trace, the one with the highest ``y`` among those that meet it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ..settings.config import SimConfig


@attrs.frozen
class Slo:
    """Upper bounds on metrics.

    Attributes:
        name: its name in tables and the figure.
        limits: ``(metric column, largest value allowed)`` pairs, in the order given.
    """

    name: str
    limits: tuple[tuple[str, float], ...]

    def text(self) -> str:
        """``ttft_p99_ms <= 500, tpot_p99_ms <= 50``."""
        return ", ".join(f"{metric} <= {limit:g}" for metric, limit in self.limits)

    def met(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """``[num_points], bool``: which rows of ``columns`` meet every bound."""
        rows = len(next(iter(columns.values()))) if columns else 0
        mask = np.ones(rows, bool)
        for metric, limit in self.limits:
            values = np.asarray(columns[metric], np.float64)
            mask &= np.nan_to_num(values, nan=np.inf) <= limit
        return mask

    def to_dict(self) -> dict[str, float]:
        """The bounds as JSON: ``{"ttft_p99_ms": 500.0, ...}``."""
        return dict(self.limits)


def parse_slo(text: str, metrics: Sequence[str], error: type[ValueError], name: str = "slo") -> Slo:
    """An :class:`Slo` from ``metric=limit,...`` (``--slo``); a bad item is an ``error``
    naming it."""
    limits = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        metric, sep, value = item.partition("=")
        limits.append(
            _limit(f"--slo {item!r}", metric.strip(), value if sep else None, metrics, error)
        )
    if not limits:
        raise error(f"--slo {text!r}: expected metric=limit,... (e.g. ttft_p99_ms=500)")
    return Slo(name, tuple(limits))


def parse_slo_table(
    where: str, table: object, metrics: Sequence[str], error: type[ValueError]
) -> tuple[Slo, ...]:
    """The ``[slos]`` table of a sweep file: ``name = {metric = limit, ...}`` each."""
    if not isinstance(table, dict) or not table:
        raise error(f"{where}: slos: must be a table of SLOs, name = {{metric = limit}}")
    slos = []
    for name, bounds in table.items():
        if not isinstance(bounds, dict) or not bounds:
            raise error(f"{where}: [slos] {name}: must be a table of metric = limit")
        limits = tuple(
            _limit(f"{where}: [slos] {name}.{metric}", metric, value, metrics, error)
            for metric, value in bounds.items()
        )
        slos.append(Slo(name, limits))
    return tuple(slos)


def _limit(
    where: str, metric: str, value: Any, metrics: Sequence[str], error: type[ValueError]
) -> tuple[str, float]:
    if metric not in metrics:
        raise error(f"{where}: {metric!r} is not a metric (e.g. {', '.join(metrics[8:12])})")
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # --slo gives text; left as is, refused below
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise error(f"{where}: the limit must be a finite number, got {value!r}")
    return metric, float(value)


def default_slo(config: SimConfig) -> Slo:
    """The settings' ``[slo]`` on p99: TTFT p99 within ``slo.ttft_ms``, TPOT p99 within
    ``slo.tpot_ms``."""
    return Slo("slo", (("ttft_p99_ms", config.slo.ttft_ms), ("tpot_p99_ms", config.slo.tpot_ms)))


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[n], bool``: the points no other point beats on both axes (``x`` lower and
    ``y`` higher, one of them strictly); a point with a NaN is on no front. Equal points
    are both on it."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    front = np.zeros(x.size, bool)
    finite = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    order = finite[np.lexsort((-y[finite], x[finite]))]  # x up, then y down
    best, last = -np.inf, None
    for index in order:  # a point is beaten iff an earlier one has a y at least as high
        if y[index] > best or (last is not None and (x[index], y[index]) == last):
            front[index], best, last = True, y[index], (x[index], y[index])
    return front


def grouped_front(groups: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`pareto_front` within each group (a sweep's traces), ``[n], bool``."""
    front = np.zeros(len(groups), bool)
    for group in dict.fromkeys(groups.tolist()):
        rows = np.flatnonzero(groups == group)
        front[rows] = pareto_front(x[rows], y[rows])
    return front


def best_points(
    columns: Mapping[str, np.ndarray], slos: Sequence[Slo], y: str, group: str = "trace"
) -> list[tuple[str, Slo, int | None]]:
    """For every group and SLO, ``(group, slo, row)``: the row meeting the SLO with the
    highest ``y`` (the first such row on ties), ``None`` when no row meets it."""
    groups, values = np.asarray(columns[group]), np.asarray(columns[y], np.float64)
    chosen = []
    for name in dict.fromkeys(groups.tolist()):
        mine = groups == name
        for slo in slos:
            rows = np.flatnonzero(mine & slo.met(columns) & np.isfinite(values))
            row = int(rows[np.argmax(values[rows])]) if rows.size else None
            chosen.append((name, slo, row))
    return chosen
