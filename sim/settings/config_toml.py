"""Settings as TOML text that :func:`~stepplan.sim.settings.config.load_config` (``--config``)
reads back to equal settings.

Python's ``tomllib`` only reads. ``SimConfig`` is two top-level keys and flat sections
of strings, ints, floats, bools and lists of them, so a small writer covers it. TOML
has no null: a setting that is ``None`` is left out (a comment line names it and what it
stands for, ``config_defaults.setting_text``), and a
missing key reads back as the default. That is the same thing because every setting
that may be ``None`` has ``None`` as its default; the writer refuses any other.
"""

from __future__ import annotations

from typing import Any

import attrs

from .config import ConfigError, SimConfig
from .config_defaults import setting_text

#: TOML basic-string escapes (any other control character is written as ``\\uXXXX``).
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def config_toml(config: SimConfig, header: str = "") -> str:
    """``config`` as a TOML document: ``name`` and ``seed``, then one table per section.

    ``header`` (one or more lines) is written first as ``#`` comments.
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    sections: list[str] = []
    for field in attrs.fields(type(config)):
        value = getattr(config, field.name)
        if attrs.has(type(value)):
            sections += ["", f"[{field.name}]"]
            sections += [
                _line(config, field.name, f, getattr(value, f.name))
                for f in attrs.fields(type(value))
            ]
        else:
            lines.append(_line(config, "", field, value))
    return "\n".join(lines + sections) + "\n"


def _line(config: SimConfig, section: str, field: attrs.Attribute, value: Any) -> str:
    key = f"{section}.{field.name}" if section else field.name
    if value is None:
        if field.default is not None:
            raise ConfigError(f"{key}: None cannot be written (its default is {field.default!r})")
        return f"# {field.name}: not set: {setting_text(config, key)}"
    try:
        return f"{field.name} = {toml_value(value)}"
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def toml_value(value: Any) -> str:
    """One TOML value: a bool, int, float, string, or a list or tuple of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # repr is the shortest text that reads back to the same float, and it spells
        # inf, -inf and nan as TOML does.
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise ValueError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _string(text: str) -> str:
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:  # a lone surrogate (undecodable bytes of a path)
            raise ValueError(f"{text!r} is not valid Unicode text")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
