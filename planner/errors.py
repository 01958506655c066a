"""The one error the planner raises for bad input."""

from __future__ import annotations


class PlanError(ValueError):
    """A step's input can't be planned.

    ``field`` names the offending input (``query_lens``, ``slots``, ...) and
    ``row`` the first offending request row (``None`` when the problem is not
    tied to one row). The message always starts with ``field[row]``.
    """

    def __init__(self, field: str, row: int | None, message: str) -> None:
        where = field if row is None else f"{field}[{row}]"
        super().__init__(f"{where}: {message}")
        self.field = field
        self.row = row
