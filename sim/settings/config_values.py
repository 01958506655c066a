"""What a setting's value may be: the converters and validators of ``config.py``'s
sections, each raising a :class:`ConfigError` that names the setting.

Numbers are checked as the command-line flags check them: an integer setting takes an
integer (or text that parses as one, as ``--set`` gives), never a float that would be
truncated (``64.5``) nor a boolean; a number setting takes a finite number.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

import attrs


class ConfigError(ValueError):
    """A setting is unknown or out of range; the message names it."""


def _positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{attribute.name}: must be positive, got {value}")


def _non_negative(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value is not None and value < 0:
        raise ConfigError(f"{attribute.name}: must be >= 0, got {value}")


def _at_least_one(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if value < 1:
        raise ConfigError(f"{attribute.name}: must be >= 1 (accepted drafts + 1), got {value}")


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(instance: object, attribute: attrs.Attribute, value: str) -> None:
        if value not in choices:
            raise ConfigError(f"{attribute.name}: must be one of {choices}, got {value!r}")

    return check


def _optional_one_of(choices: tuple[str, ...]) -> Any:
    """:func:`_one_of`, or ``None`` (the default decides)."""
    check = _one_of(choices)

    def optional(instance: object, attribute: attrs.Attribute, value: str | None) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def _as_int(value: object) -> int | None:
    """``value`` as an integer setting, or ``None``: TOML and flag integers, or text
    that parses as one (``--set``); never a float (64.5 must not become 64) nor a
    boolean."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _as_real(value: object) -> float | None:
    """``value`` as a finite number setting, or ``None`` (booleans are not numbers)."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value) if math.isfinite(value) else None


def _integer(value: object, field: attrs.Attribute) -> int:
    number = _as_int(value)
    if number is None:
        raise ConfigError(f"{field.name}: must be an integer, got {value!r}")
    return number


def _real(value: object, field: attrs.Attribute) -> float:
    number = _as_real(value)
    if number is None:
        raise ConfigError(f"{field.name}: must be a finite number, got {value!r}")
    return number


def _items(value: object, field: attrs.Attribute) -> list:
    """A list setting from TOML, a single value, or ``--flag`` text ``1,2,4``."""
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if isinstance(value, int | float):
        value = [value]
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{field.name}: must be a non-empty list, got {value!r}")
    return list(value)


def _optional_ints(value: object, field: attrs.Attribute) -> tuple[int, ...] | None:
    if value is None or value == "default":
        return None
    entries = _items(value, field)
    bad = next((v for v in entries if _as_int(v) is None), None)
    if bad is not None:
        raise ConfigError(f"{field.name}: entries must be integers, got {bad!r}")
    return tuple(sorted({_as_int(v) for v in entries}))  # type: ignore[type-var]


def _floats(value: object, field: attrs.Attribute) -> tuple[float, ...]:
    entries = _items(value, field)
    bad = next((v for v in entries if _as_real(v) is None), None)
    if bad is not None:
        raise ConfigError(f"{field.name}: entries must be finite numbers, got {bad!r}")
    return tuple(_as_real(v) for v in entries)  # type: ignore[misc]


def _text(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{attribute.name}: must be text, got {value!r}")


def _run_name(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """A run's name is one folder name under ``results/``: never a path."""
    _text(instance, attribute, value)
    if not value:
        return
    text = str(value)
    if text in (".", "..") or any(c in text for c in "/\\\0") or text != text.strip():
        raise ConfigError(
            f"{attribute.name}: {text!r} is not a plain name: a run's name is one folder name "
            "under results/ (no '/', not '.' or '..', no surrounding spaces); --out takes a path"
        )


def _flag(value: object, field: attrs.Attribute) -> bool:
    try:
        return attrs.converters.to_bool(value)
    except ValueError:
        raise ConfigError(f"{field.name}: must be true or false, got {value!r}") from None


def _optional(convert: Any) -> Any:
    return attrs.Converter(
        lambda value, field: None if value is None else convert(value, field), takes_field=True
    )


INT = attrs.Converter(_integer, takes_field=True)
REAL = attrs.Converter(_real, takes_field=True)


def read_text(path: str | Path, error: type[ValueError] = ConfigError) -> str:
    """A settings file's UTF-8 text (a byte-order mark dropped): a file that can't be
    read or is not UTF-8 text is an ``error`` naming it (and the line)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    if data.startswith(b"\x1f\x8b"):
        raise error(f"{path}: is gzip-compressed, not a text file: decompress it first")
    if data.startswith(b"version https://git-lfs.github.com/spec/v1"):
        raise error(f"{path}: is a Git LFS pointer, not the file: run git lfs pull")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        byte = data[exc.start]
        raise error(f"{path}:{line}: not UTF-8 text (byte 0x{byte:02x})") from None


def flatten(table: dict[str, Any]) -> dict[str, Any]:
    """A parsed TOML document as dotted keys; sections must be tables."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{inner}": v for inner, v in value.items()})
        else:
            flat[key] = value
    return flat
