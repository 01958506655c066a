"""A sweep file (``SWEEP.toml``): its traces, its points and what to pick among them.

::

    traces = ["embedded", "synthetic:n=500,rate=6"]    # default: ["embedded"]
    config = "base.toml"          # optional settings file, relative to this one

    [settings]                    # every point
    workload.limit = 2000

    [grid]                        # the cartesian product of these lists
    scheduler.num_spec_tokens = [1, 3]
    workload.rate_scale = [1.0, 2.0]

    [[points]]                    # and/or a list of points (each crossed with the grid)
    scheduler.max_num_seqs = 64

    [slos]                        # the best point of each (default: the config's [slo] on p99)
    interactive = { ttft_p99_ms = 500, tpot_p99_ms = 30 }

    [tradeoff]                    # the figure's axes: x lower is better, y higher
    x = "tpot_p99_ms"
    y = "output_tok_s"

A trace is ``embedded`` (the bundled Azure code trace, as ``stepplan simulate`` reads it
without a TRACE), a ``synthetic:...`` workload, or a file path (relative to the sweep
file); or a table ``{path = ..., format = ..., name = ...}``. Settings are any key
``--set`` takes. Every point's settings are checked (``check``) when the file is read,
so a bad file is one :class:`SweepError` naming the file and the key, before anything
runs or is written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import tomllib

from ..results.schema import SWEEP_METRICS
from ..settings.config import (
    SECTIONS,
    ConfigError,
    SimConfig,
    check_config,
    flatten,
    load_config,
    read_text,
    with_settings,
)
from ..workloads import SYNTHETIC_PREFIX
from .tradeoff import Slo, parse_slo_table

EMBEDDED = "embedded"
_TOP_KEYS = ("traces", "config", "settings", "grid", "points", "slos", "tradeoff")
_TRACE_KEYS = ("path", "format", "name")
#: The trade-off figure's default axes: p99 TPOT (lower is better), output tokens/s.
DEFAULT_TRADEOFF = ("tpot_p99_ms", "output_tok_s")
_NUMERIC_METRICS = tuple(c.name for c in SWEEP_METRICS)


class SweepError(ValueError):
    """A sweep file that cannot run; the message names the file and the key."""


@attrs.frozen
class TraceEntry:
    """One trace of a sweep.

    Attributes:
        spec: ``None`` for the embedded trace, a ``synthetic:`` spec, or a file path
            (made absolute against the sweep file's folder).
        format: the trace format (``None``: detected).
        label: its name in the table (a file's stem unless named).
        where: where the file gives it (``traces[1]``), for messages.
    """

    spec: str | None
    format: str | None
    label: str
    where: str


@attrs.frozen
class SweepSpec:
    """A sweep file, read and checked.

    Attributes:
        path: the file.
        traces: every trace, in order.
        keys: the swept settings (dotted keys), in the order the file first gives them.
        points: each point's own settings (a value for every key of ``keys`` it sets).
        configs: each point's effective settings, checked.
        slos: the SLOs to pick a best point for (``None``: the config's ``[slo]``).
        tradeoff: the figure's ``(x, y)`` metric columns.
    """

    path: Path
    traces: tuple[TraceEntry, ...]
    keys: tuple[str, ...]
    points: tuple[Mapping[str, Any], ...]
    configs: tuple[SimConfig, ...]
    slos: tuple[Slo, ...] | None
    tradeoff: tuple[str, str]


def known_settings() -> frozenset[str]:
    """Every dotted setting key ``--set`` takes (``name``, ``seed``, ``section.field``)."""
    keys = {"name", "seed"}
    keys |= {f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in attrs.fields(cls)}
    return frozenset(keys)


def describe(settings: Mapping[str, Any]) -> str:
    """A point's settings in one line: ``scheduler.max_num_seqs=64, workload.rate_scale=2``."""
    return ", ".join(f"{key}={value}" for key, value in settings.items()) or "the base settings"


def read_sweep(
    path: str | Path, check: Callable[[SimConfig], SimConfig] = check_config
) -> SweepSpec:
    """Read and check the sweep file ``path``; ``check`` is run on every point's settings
    (the CLI's ``checked``: limits, the planner, the files they name)."""
    path = Path(path)
    where = str(path)
    try:
        document = tomllib.loads(read_text(path, SweepError))
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{where}: {exc}") from None
    unknown = sorted(set(document) - set(_TOP_KEYS))
    if unknown:
        raise SweepError(
            f"{where}: {unknown[0]}: unknown key (a sweep file has {', '.join(_TOP_KEYS)}; "
            "settings go in [settings], [grid] or [[points]])"
        )
    traces = _traces(where, path.parent, document.get("traces", [EMBEDDED]))
    base = _base_config(where, path.parent, document)
    points = _points(where, document)
    keys = tuple(dict.fromkeys(key for point in points for key in point))
    configs = tuple(_point_config(where, base, index, p, check) for index, p in enumerate(points))
    slos = document.get("slos")
    slos = None if slos is None else parse_slo_table(where, slos, _NUMERIC_METRICS, SweepError)
    tradeoff = _tradeoff(where, document.get("tradeoff", {}))
    return SweepSpec(path, traces, keys, points, configs, slos, tradeoff)


def _traces(where: str, folder: Path, value: object) -> tuple[TraceEntry, ...]:
    if not isinstance(value, list) or not value:
        raise SweepError(f"{where}: traces: must be a non-empty list of traces, got {value!r}")
    entries: list[TraceEntry] = []
    for index, item in enumerate(value):
        entry = _trace(f"{where}: traces[{index}]", folder, item, index)
        taken = {e.label for e in entries}
        label, counter = entry.label, 2
        while label in taken:  # two synthetic workloads, two files of one name
            label, counter = f"{entry.label}-{counter}", counter + 1
        entries.append(attrs.evolve(entry, label=label))
    return tuple(entries)


def _trace(where: str, folder: Path, item: object, index: int) -> TraceEntry:
    fmt, name = None, None
    if isinstance(item, dict):
        unknown = sorted(set(item) - set(_TRACE_KEYS))
        if unknown:
            raise SweepError(f"{where}: {unknown[0]}: unknown key (known: path, format, name)")
        fmt, name, item = item.get("format"), item.get("name"), item.get("path")
        for key, text in (("format", fmt), ("name", name)):
            if text is not None and (not isinstance(text, str) or not text):
                raise SweepError(f"{where}: {key}: must be text, got {text!r}")
    if not isinstance(item, str) or not item:
        raise SweepError(f"{where}: must be a path, 'embedded' or 'synthetic:...', got {item!r}")
    label = f"traces[{index}]"
    if item == EMBEDDED:
        spec, stem = None, "azure_llm_2023_code"
    elif item.startswith(SYNTHETIC_PREFIX):
        spec, stem = item, "synthetic"
    else:
        file = Path(item).expanduser()
        spec = str(file if file.is_absolute() else folder / file)
        if not Path(spec).is_file():
            raise SweepError(f"{where}: {item}: no such trace file")
        stem = Path(spec).name.split(".")[0]
    return TraceEntry(spec, fmt, name or stem, label)


def _base_config(where: str, folder: Path, document: dict[str, Any]) -> SimConfig:
    config = SimConfig()
    file = document.get("config")
    if file is not None:
        if not isinstance(file, str):
            raise SweepError(f"{where}: config: must be a path, got {file!r}")
        path = Path(file).expanduser()
        try:
            config = load_config(path if path.is_absolute() else folder / path)
        except ConfigError as exc:
            raise SweepError(f"{where}: config: {exc}") from None
    settings = _table(where, document, "settings")
    _check_keys(f"{where}: [settings]", settings)
    try:
        return with_settings(config, settings)
    except ConfigError as exc:
        raise SweepError(f"{where}: [settings] {exc}") from None


def _table(where: str, document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise SweepError(f"{where}: {key}: must be a table ([{key}]), got {value!r}")
    return flatten(value)


def _check_keys(where: str, settings: Mapping[str, Any]) -> None:
    known = known_settings()
    for key in settings:
        if key in known:
            continue
        section = key.partition(".")[0]
        if section in SECTIONS:
            fields = ", ".join(f.name for f in attrs.fields(SECTIONS[section]))
            raise SweepError(f"{where}: {key}: unknown setting ([{section}] has {fields})")
        raise SweepError(
            f"{where}: {key}: unknown setting (sections: {', '.join(SECTIONS)}; or name, seed)"
        )


def _points(where: str, document: dict[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """Every point's settings: each of ``[[points]]`` crossed with the ``[grid]``."""
    grid = _table(where, document, "grid")
    _check_keys(f"{where}: [grid]", grid)
    for key, values in grid.items():
        if not isinstance(values, list):
            raise SweepError(
                f"{where}: [grid] {key}: must be a list of values, got {values!r} "
                "(one value for every point goes in [settings])"
            )
        if not values:
            raise SweepError(f"{where}: [grid] {key}: empty list, the grid has no points")
    listed = document.get("points")
    if listed is not None and (not isinstance(listed, list) or not listed):
        raise SweepError(f"{where}: points: must be a non-empty list of tables ([[points]])")
    if not grid and listed is None:
        raise SweepError(f"{where}: nothing to sweep: give a [grid] or [[points]]")
    chosen = []
    for index, point in enumerate(listed or [{}]):
        if not isinstance(point, dict):
            raise SweepError(f"{where}: points[{index}]: must be a table, got {point!r}")
        flat = flatten(point)
        _check_keys(f"{where}: points[{index}]", flat)
        both = sorted(set(flat) & set(grid))
        if both:
            raise SweepError(f"{where}: points[{index}]: {both[0]}: also in [grid]; give it once")
        for combo in itertools.product(*grid.values()):
            chosen.append(MappingProxyType({**flat, **dict(zip(grid, combo, strict=True))}))
    return tuple(chosen)


def _point_config(
    where: str,
    base: SimConfig,
    index: int,
    settings: Mapping[str, Any],
    check: Callable[[SimConfig], SimConfig],
) -> SimConfig:
    try:
        return check(with_settings(base, dict(settings)))
    except ConfigError as exc:
        raise SweepError(f"{where}: point {index} ({describe(settings)}): {exc}") from None


def _tradeoff(where: str, table: object) -> tuple[str, str]:
    if not isinstance(table, dict):
        raise SweepError(f"{where}: tradeoff: must be a table with x and y, got {table!r}")
    unknown = sorted(set(table) - {"x", "y"})
    if unknown:
        raise SweepError(f"{where}: [tradeoff] {unknown[0]}: unknown key (known: x, y)")
    axes = (table.get("x", DEFAULT_TRADEOFF[0]), table.get("y", DEFAULT_TRADEOFF[1]))
    for key, metric in zip("xy", axes, strict=True):
        if metric not in _NUMERIC_METRICS:
            raise SweepError(
                f"{where}: [tradeoff] {key}: {metric!r} is not a metric of the table "
                f"(e.g. {', '.join(_NUMERIC_METRICS[3:9])})"
            )
    return axes
