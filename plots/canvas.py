"""Figures without a display: matplotlib's object API on the Agg canvas, rendered to bytes
that carry stepplan's mark (the command line writes them, by ``sim/results/outfile.py``'s rule).

No ``pyplot``: it keeps global state (the current figure) and may pick a GUI
backend; a :class:`~matplotlib.figure.Figure` bound to an Agg canvas needs neither.
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter

#: Output formats by file suffix.
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
#: Who made a figure, in its metadata (PNG ``Software``, SVG and PDF ``Creator``): what
#: :func:`is_figure` recognises, so that a figure stepplan drew may be replaced.
MAKER = "stepplan"
#: Each format's first bytes, and its metadata as matplotlib writes :data:`MAKER` there.
_MARKS = {
    "png": (b"\x89PNG", b"tEXtSoftware\x00" + MAKER.encode()),
    "svg": (b"<?xml", b"<dc:title>" + MAKER.encode() + b"</dc:title>"),
    "pdf": (b"%PDF", b"/Creator (" + MAKER.encode() + b")"),
}

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


def plain_log_labels(axis: Axis, base: float = 10) -> None:
    """Label a log-scaled ``axis`` in plain numbers (``1,000``, ``0.01``), not TeX powers:
    the same ticks, and no mathtext to lay out, whose metrics cost milliseconds a label
    in every figure (matplotlib caches them per canvas)."""
    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False))


def _plain_number(value: float, _position: object = None) -> str:
    if 1 <= value < 1e6 and value == round(value):
        return f"{value:,.0f}"
    return f"{value:g}"


def figure_bytes(figure: Figure, fmt: str, dpi: int = 110) -> bytes:
    """The figure rendered as ``png``, ``svg`` or ``pdf`` bytes, marked as stepplan's (no
    timestamps: equal figures, equal bytes)."""
    if fmt not in FORMATS.values():
        raise ValueError(f"figure format must be one of {tuple(FORMATS.values())}, got {fmt!r}")
    metadata = {
        "svg": {"Date": None, "Creator": MAKER},
        "pdf": {"CreationDate": None, "Creator": MAKER},
    }.get(fmt, {"Software": MAKER})
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


def is_figure(sample: bytes) -> bool:
    """Whether a file's start and end (``sample``) are a figure :func:`figure_bytes` made."""
    return any(sample.startswith(magic) and mark in sample for magic, mark in _MARKS.values())
