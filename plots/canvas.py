"""Figures without a display: matplotlib's object API on the Agg canvas, saved atomically.

No ``pyplot``: it keeps global state (the current figure) and may pick a GUI
backend; a :class:`~matplotlib.figure.Figure` bound to an Agg canvas needs neither.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: Output formats by file suffix.
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

#: One colour per step part, used by every figure.
COLORS = {
    "spec": "#4C72B0",
    "decode": "#55A868",
    "prefill": "#DD8452",
    "graph": "#2CA02C",
    "eager": "#B0B0B0",
    "planner": "#4C72B0",
    "seed": "#C44E52",
}


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches on an Agg canvas."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def figure_bytes(figure: Figure, fmt: str, dpi: int = 110) -> bytes:
    """The figure rendered as ``png``, ``svg`` or ``pdf`` bytes (no timestamps: equal
    figures, equal bytes)."""
    if fmt not in FORMATS.values():
        raise ValueError(f"figure format must be one of {tuple(FORMATS.values())}, got {fmt!r}")
    metadata = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt, {"Software": None})
    buffer = io.BytesIO()
    # SVG element ids are random unless salted; the salt is set only while saving.
    with rc_context({"svg.hashsalt": "stepplan"}):
        figure.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata)
    return buffer.getvalue()


def figure_format(path: str | Path) -> str:
    """The format a figure file's suffix asks for; ``ValueError`` for any other suffix
    (check it before the work that draws the figure)."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: figure files must end in {', '.join(FORMATS)}")
    return fmt


def save_figure(figure: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write the figure to ``path`` (``.png``, ``.svg`` or ``.pdf``), all at once or not
    at all."""
    path = Path(path)
    fmt = figure_format(path)
    write_atomically(path, figure_bytes(figure, fmt, dpi))
    return path


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, then rename it over ``path``,
    so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)  # mkstemp makes it owner-only; results are for sharing
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
