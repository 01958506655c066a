"""The single files the subcommands write besides results folders, as ``sim/results/outfile.py``'s
kinds: the HTML report, figures, and the graph-size config of ``stepplan buckets``
(the engine profile's kind is ``engine_profile.PROFILE_FILE``). Each kind recognises
stepplan's own files by the mark its format carries; the plots' marks are looked at only
when a file is in the way, so that commands start without matplotlib.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..results.outfile import FileKind, OutputError, OutputFile

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: First line of a graph-size file ``stepplan buckets --write`` writes: its mark.
SIZES_HEADER = "# graph sizes chosen by `stepplan buckets` (`stepplan simulate --config` reads it)"


def _is_report(sample: bytes) -> bool:
    from stepplan.plots.report import is_report

    return is_report(sample)


def _is_figure(sample: bytes) -> bool:
    from stepplan.plots.canvas import is_figure

    return is_figure(sample)


def _is_sizes_file(sample: bytes) -> bool:
    return sample.startswith(SIZES_HEADER.encode() + b"\n")


REPORT = FileKind("an HTML report", _is_report)
FIGURE = FileKind("a figure", _is_figure)
GRAPH_SIZES = FileKind("a graph-size file", _is_sizes_file)


def claim_figure(path: str | Path, overwrite: bool, option: str = "--figure") -> OutputFile:
    """A figure file: its suffix checked (``.png``, ``.svg``, ``.pdf``), then the rule."""
    from stepplan.plots.canvas import figure_format

    try:
        figure_format(path)
    except ValueError as exc:
        raise OutputError(f"{option}: {exc}") from None
    return OutputFile.claim(path, FIGURE, overwrite=overwrite)


def save_figure(figure: Figure, out: OutputFile, dpi: int = 110) -> Path:
    """Write ``figure`` to the claimed file, in the format its suffix names."""
    from stepplan.plots.canvas import figure_bytes, figure_format

    return out.write(figure_bytes(figure, figure_format(out.path), dpi))
