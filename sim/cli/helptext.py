"""``--help`` that shows every option's default, and usage errors in one line.

The setting flags default to ``None`` (an unset flag must not override the ``--config``
file), so argparse's own defaults would all read "None"; :class:`DefaultsHelpFormatter`
shows the default of the setting a flag overrides instead, as ``stepplan config`` and the
notes show it (``config_defaults.setting_text`` of ``SimConfig()``: ``--max-num-seqs``
256, ``--max-model-len`` the model preset's). A help text that states its default itself
(``buckets``' overrides: the run's) is left as it is.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from ..settings.config import SimConfig
from ..settings.config_defaults import describe, setting_text
from .options import OVERRIDES

#: Flag destinations -> the setting whose default they show (``OVERRIDES`` and the one
#: flag that sets a setting of another name).
_SETTINGS = {**OVERRIDES, "acceptance": "acceptance.model"}


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: ...)`` to every option's help (see the module docstring)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        takes_default = action.option_strings or action.nargs in (argparse.OPTIONAL, "*")
        if "default" in text.lower() or action.default is argparse.SUPPRESS or not takes_default:
            return text
        key = _SETTINGS.get(action.dest)
        shown = setting_text(SimConfig(), key) if key is not None else describe(action.default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class UsageError(SystemExit):
    """A command line argparse refuses: one line (:attr:`line`), ending with where
    ``--help`` is. A ``SystemExit`` with code 2, as argparse's own errors are, for
    callers of ``parse_args`` other than ``cli.main``."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` with :class:`DefaultsHelpFormatter`; the subcommands'
    parsers are of its class too, so every ``--help`` shows its defaults. A bad command
    line is a :class:`UsageError` (``cli.main`` prints it as one line, exit code 2)
    instead of argparse's usage text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, prog: str | None = None) -> NoReturn:
        """Raise :class:`UsageError`: the message, then where ``--help`` is."""
        raise UsageError(f"{message} (`{prog or self.prog} --help` lists the options)")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, but arguments no option takes are blamed on the subcommand
        they followed (its ``--help`` lists what it takes)."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(namespace, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            self.error(f"unrecognized arguments: {' '.join(extras)}", prog)
        return namespace
