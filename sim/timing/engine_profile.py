"""Engine profiles: an engine's measured step times, one JSON document.

``stepplan profile`` times the live engine (a model preset served by the executor) over a
grid of step shapes and writes one JSON document; ``--profile FILE`` makes the cost model
predict each step from it instead of the roofline wherever the profile covers the step.

The shapes measured and their fit: :mod:`stepplan.sim.timing.engine_fit`; coverage, the roofline
fallback and the document's layout: ``docs/profile_format.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from ..results.outfile import FileKind, OutputFile
from .engine_fit import EngineFit, ProfilePoint, StepShape, fit_points

FORMAT = "stepplan-engine-profile"
VERSION = 3
#: Planner settings a profile must share with a simulation; graph sizes and
#: ``max_num_seqs`` need not match: each step is covered when its bucket was measured.
PLANNER_KEYS = ("num_spec_tokens", "graph_mode", "prefill_tile_tokens", "num_groups")


class EngineProfileError(ValueError):
    """An engine profile is unreadable, malformed, or made for another setup."""


@attrs.frozen(eq=False)
class EngineProfile:
    """One engine profile document (see the module docstring) and its fit.

    Attributes:
        source: where it was read from (a path), for messages.
        device, versions, preset, planner, runner: the setup it was measured on.
        token_grid: the eager token grid.
        points: every measured shape.
        graph_mib: ``(kind, size) -> MiB``: GPU memory one captured graph holds, by graph
            kind (``spec``, ``decode``, ``mixed``) and size (rows for a uniform graph,
            tokens for a mixed one); empty when the profile has no memory figures.
        fit: :func:`fit_points` of the points.
    """

    source: str
    device: str
    versions: Mapping[str, str]
    preset: Mapping[str, Any]
    planner: Mapping[str, Any]
    runner: Mapping[str, Any]
    token_grid: tuple[int, ...]
    points: tuple[ProfilePoint, ...]
    graph_mib: Mapping[tuple[str, int], float] = attrs.field(factory=lambda: MappingProxyType({}))
    fit: EngineFit = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "fit", fit_points(self.points, self.token_grid))

    def to_json(self) -> dict[str, Any]:
        """The document :func:`read_engine_profile` reads back."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "device": self.device,
            "versions": dict(self.versions),
            "preset": dict(self.preset),
            "planner": dict(self.planner),
            "runner": dict(self.runner),
            "token_grid": list(self.token_grid),
            "points": [
                {
                    **p.shape.to_json(),
                    "wall_us": p.wall_us,
                    "gpu_us": p.gpu_us,
                    "host_us": p.host_us,
                }
                for p in self.points
            ],
            **({"graph_memory": self.memory_entries()} if self.graph_mib else {}),
        }

    def memory_entries(self) -> list[dict[str, Any]]:
        """:attr:`graph_mib` as the document's ``graph_memory`` list."""
        return [
            {"kind": kind, "size": size, "mib": mib}
            for (kind, size), mib in sorted(self.graph_mib.items())
        ]

    def check_setup(self, preset: Mapping[str, Any], planner: Mapping[str, Any]) -> None:
        """Refuse, naming the first difference, a simulation of another model or planner
        (every preset dimension; the planner's :data:`PLANNER_KEYS`)."""
        checks = (
            (
                "preset",
                self.preset,
                preset,
                sorted(set(self.preset) | set(preset), key=_name_first),
            ),
            ("planner", self.planner, planner, PLANNER_KEYS),
        )
        for what, mine, theirs, keys in checks:
            for key in keys:
                if _plain(mine.get(key)) != _plain(theirs.get(key)):
                    raise EngineProfileError(
                        f"{self.source}: measured with {what} {key} = {mine.get(key)!r}, "
                        f"the simulation has {theirs.get(key)!r}"
                    )


def _name_first(key: str) -> tuple[bool, str]:
    """Sort key: ``name`` first (the clearest difference to report), then alphabetically."""
    return key != "name", key


def _plain(value: object) -> object:
    """Lists and tuples compare alike (JSON reads tuples back as lists)."""
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def _is_profile(sample: bytes) -> bool:
    """Whether a file's start (``sample``) is a profile :func:`write_engine_profile` wrote:
    a JSON object whose first key is ``format``, :data:`FORMAT`."""
    return sample.startswith(b'{\n "format": ' + json.dumps(FORMAT).encode())


#: The engine profile as one file stepplan writes (``sim/results/outfile.py``'s rule).
PROFILE_FILE = FileKind("an engine profile", _is_profile)


def write_engine_profile(
    profile: EngineProfile, out: str | Path | OutputFile, *, overwrite: bool = False
) -> Path:
    """Write ``profile`` as JSON to ``out``: a file already claimed, or a path claimed now
    (an earlier profile there is replaced only with ``overwrite``)."""
    if not isinstance(out, OutputFile):
        out = OutputFile.claim(out, PROFILE_FILE, overwrite=overwrite)
    return out.write((json.dumps(profile.to_json(), indent=1) + "\n").encode())


def read_engine_profile(path: str | Path) -> EngineProfile:
    """Read and check an engine profile; every defect is one :class:`EngineProfileError`."""
    try:
        document = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as exc:
        raise EngineProfileError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise EngineProfileError(f"{path}: not a text file (expected profile JSON)") from None
    except json.JSONDecodeError as exc:
        raise EngineProfileError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise EngineProfileError(f'{path}: not an engine profile (no "format": "{FORMAT}")')
    if document.get("version") != VERSION:
        raise EngineProfileError(
            f"{path}: profile version {document.get('version')!r}, this stepplan reads {VERSION}"
        )
    try:
        points = tuple(_point(entry) for entry in document["points"])
        grid = tuple(int(t) for t in document["token_grid"])
        return EngineProfile(
            source=str(path),
            device=str(document["device"]),
            versions=MappingProxyType(dict(document["versions"])),
            preset=MappingProxyType(dict(document["preset"])),
            planner=MappingProxyType(dict(document["planner"])),
            runner=MappingProxyType(dict(document["runner"])),
            token_grid=grid,
            points=points,
            graph_mib=MappingProxyType(_graph_memory(document.get("graph_memory", []))),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineProfileError(
            f"{path}: malformed profile ({type(exc).__name__}: {exc})"
        ) from None


def _graph_memory(entries: Any) -> dict[tuple[str, int], float]:
    """The optional ``graph_memory`` list: ``{"kind", "size", "mib"}`` per captured graph."""
    if not isinstance(entries, list):
        raise ValueError("graph_memory must be a list of {kind, size, mib}")
    memory: dict[tuple[str, int], float] = {}
    for entry in entries:
        kind, size, mib = str(entry["kind"]), int(entry["size"]), float(entry["mib"])
        if kind not in ("spec", "decode", "mixed") or size < 1 or not mib >= 0:
            raise ValueError(
                f"graph_memory entry {dict(entry)}: kind spec/decode/mixed, size >= 1, mib >= 0"
            )
        memory[kind, size] = mib
    return memory


def _point(entry: Mapping[str, Any]) -> ProfilePoint:
    graph = entry["graph"]
    key = None if graph is None else (str(graph[0]), int(graph[1]), int(graph[2]), int(graph[3]))
    rows = tuple(int(r) for r in entry["rows"])
    tokens = tuple(int(t) for t in entry["tokens"])
    if len(rows) != 3 or len(tokens) != 3:
        raise ValueError("rows and tokens give (spec, decode, prefill)")
    wall = float(entry["wall_us"])
    if not wall > 0:
        raise ValueError(f"wall_us must be positive, got {wall}")
    gpu, host = entry.get("gpu_us"), entry.get("host_us")
    shape = StepShape(
        graph=key,
        rows=rows,  # type: ignore[arg-type]
        tokens=tokens,  # type: ignore[arg-type]
        tiles=int(entry["tiles"]),
        context_tokens=int(entry["context_tokens"]),
        prefill_pairs=float(entry["prefill_pairs"]),
        max_context=int(entry["max_context"]),
        prefill_context=int(entry["prefill_context"]),
    )
    return ProfilePoint(
        shape, wall, None if gpu is None else float(gpu), None if host is None else float(host)
    )
