"""Validators for configuration values: each names the field, echoes the value and states the range.

:func:`parse_seconds` is the one validator for durations ("positive finite seconds, or null") used
by the config, the saved-state reader and the rank monitor's timeout updates. The others parse
numbers, signals, log levels, choices and section timeout maps, given as their type or as the
strings of a command line or YAML file. :mod:`ft_core.wire.config` declares which field uses which
(and re-exports the public names).

Standard library only: the rank monitor uses it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Mapping
from typing import Any, Optional

MAX_SECONDS = 1_000_000.0
"""Upper bound of every duration we accept (about 11.6 days). A longer timeout is no limit in
practice: write ``null`` for that. The bound keeps every deadline representable by the event
loops that wait for it (``epoll`` takes at most about 24.8 days in milliseconds)."""

MAX_SECTIONS = 32
MAX_SECTION_NAME_CHARS = 64
"""With at most :data:`MAX_SECTIONS` names of at most this many characters, the handshake reply
that carries them twice fits in one protocol message (64 KiB), whatever the characters."""

_NONE_STRINGS = frozenset({"", "none", "null", "~"})

class ConfigError(ValueError):
    """A configuration value or file is invalid; the message names the field and the value."""


def seconds_bounds(minimum: float, maximum: float, allow_none: bool) -> str:
    """The accepted durations in words, as error messages and ``--help`` state them."""
    lower = f">= {minimum:g}" if minimum > 0 else "> 0"
    none_hint = " or null (no limit)" if allow_none else ""
    return f"seconds {lower} and <= {maximum:g}{none_hint}"


def number_bounds(minimum: float, maximum: float) -> str:
    """The accepted numbers in words."""
    return f">= {minimum:g} and <= {maximum:g}"


def parse_seconds(
    field_name: str,
    value: Any,
    *,
    allow_none: bool = True,
    minimum: float = 0.0,
    maximum: float = MAX_SECONDS,
) -> Optional[float]:
    """The one validator for durations: positive finite seconds, or ``None`` (no limit).

    Accepts numbers and their string forms (``"12.5"``); ``None``, ``"null"``, ``"none"``,
    ``"~"`` and ``""`` mean no limit when ``allow_none``.

    Args:
        field_name: Named in the error message.
        value: The value to check.
        allow_none: Whether "no limit" is allowed.
        minimum: The value must be greater than 0 and at least this.
        maximum: The value must be at most this.

    Returns:
        The value as a float, or None.

    Raises:
        ConfigError: Not a number, not finite, not positive, or outside ``[minimum, maximum]``;
            the message names the field, echoes the value and states the accepted range.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_STRINGS):
        if allow_none:
            return None
        raise ConfigError(f"{field_name} must be a number of seconds (no null), got {short_repr(value)}")
    if isinstance(value, bool):
        raise ConfigError(f"{field_name} must be a number of seconds, got {value!r}")
    number = _to_float(value)
    if not math.isfinite(number) or number <= 0 or number < minimum or number > maximum:
        raise ConfigError(
            f"{field_name} must be a number of {seconds_bounds(minimum, maximum, allow_none)}, "
            f"got {short_repr(value)}"
        )
    return number


def parse_number(field_name: str, value: Any, *, minimum: float, maximum: float) -> float:
    """Validate a finite number in ``[minimum, maximum]`` given as a number or a string.

    Raises:
        ConfigError: Not a number or out of range; names the field, echoes the value and states
            the range.
    """
    number = math.nan if isinstance(value, bool) else _to_float(value)
    if not math.isfinite(number) or not minimum <= number <= maximum:
        raise ConfigError(
            f"{field_name} must be a number {number_bounds(minimum, maximum)}, got {short_repr(value)}"
        )
    return number


def _to_float(value: Any) -> float:
    """``float(value)`` for numbers and numeric strings; NaN for anything else."""
    try:
        return float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float range
        return math.nan


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened so that a huge value cannot flood an error message."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else f"<{value.bit_length()}-bit int>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_count(field_name: str, value: Any, *, minimum: int, maximum: int, exclude: tuple[int, ...] = ()) -> int:
    """Validate a whole number in ``[minimum, maximum]`` (not one of ``exclude``), given as an int
    or a string of digits.

    Raises:
        ConfigError: Not a whole number, out of range or excluded; names the field, echoes the
            value and states the range.
    """
    number: Any = value.strip() if isinstance(value, str) else value
    if isinstance(number, str) and number.lstrip("-").isdigit() and len(number) <= 20:
        number = int(number)
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int) or not minimum <= number <= maximum \
            or number in exclude:
        others = f", other than {' and '.join(map(str, exclude))}" if exclude else ""
        raise ConfigError(f"{field_name} must be a whole number from {minimum} to {maximum}{others}, "
                          f"got {short_repr(value)}")
    return number


def parse_command(field_name: str, value: Any) -> Optional[str]:
    """A shell command line (one line, at most 4096 characters), or None for none.

    Raises:
        ConfigError: Not a string, empty, several lines or too long.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\n" in value or len(value) > 4096:
        raise ConfigError(f"{field_name} must be one shell command line of at most 4096 characters (or null), "
                          f"got {short_repr(value)}")
    return value.strip()


def parse_directories(field_name: str, value: Any) -> Optional[list[str]]:
    """Absolute directory paths, as a list or a comma-separated string; None for the defaults;
    an empty list (or ``""``) for none.

    Raises:
        ConfigError: Not a list of absolute paths.
    """
    if value is None:
        return None
    items = [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or len(items) > 64 or not all(
            isinstance(item, str) and os.path.isabs(item) and len(item) <= 4096 for item in items):
        raise ConfigError(f"{field_name} must be absolute directory paths (a list, or separated by commas), "
                          f"got {short_repr(value)}")
    return list(items)


def parse_bool(field_name: str, value: Any) -> bool:
    """A switch: ``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``) or a bool.

    Raises:
        ConfigError: Anything else.
    """
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{field_name} must be true or false, got {short_repr(value)}")


def parse_choice(field_name: str, value: Any, choices: tuple[str, ...]) -> str:
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or text not in choices:
        raise ConfigError(f"{field_name} must be one of {', '.join(choices)}, got {short_repr(value)}")
    return text


def parse_section_timeouts(name: str, value: Any) -> dict[str, Optional[float]]:
    if value is None:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if not text or text.lower() in _NONE_STRINGS - {""}:
            return {}
        parts = text.split(",")
        _check_section_count(name, len(parts))
        items: list[tuple[str, Any]] = []
        for item in parts:
            section, sep, timeout = item.partition(":")
            if not sep or not section.strip():
                raise ConfigError(
                    f"{name}: malformed entry {short_repr(item.strip())} in {short_repr(value)}; expected "
                    "'name:seconds,name:seconds' (seconds may be 'null'), "
                    "e.g. 'setup:600,step:180,checkpointing:420'"
                )
            if section.strip() in dict(items):
                raise ConfigError(f"{name}: section {section.strip()!r} is given twice in {short_repr(value)}")
            items.append((section.strip(), timeout))
    elif isinstance(value, Mapping):
        items = list(value.items())
    else:
        raise ConfigError(
            f"{name} must be a mapping of section name to seconds or a string "
            f"'name:seconds,...', got {short_repr(value)}"
        )
    _check_section_count(name, len(items))
    result: dict[str, Optional[float]] = {}
    for section, timeout in items:
        if not isinstance(section, str) or not section.strip():
            raise ConfigError(f"{name}: section names must be non-empty strings, got {short_repr(section)}")
        section = section.strip()
        if len(section) > MAX_SECTION_NAME_CHARS:
            raise ConfigError(
                f"{name}: section names must be at most {MAX_SECTION_NAME_CHARS} characters, "
                f"got {short_repr(section)}"
            )
        result[section] = parse_seconds(f"{name}[{section}]", timeout)
    return result


def _check_section_count(name: str, count: int) -> None:
    if count > MAX_SECTIONS:
        raise ConfigError(f"{name}: at most {MAX_SECTIONS} sections are supported, got {count}")


def parse_signal(field_name: str, value: Any) -> signal.Signals:
    """Parse a signal given as ``signal.Signals``, number, ``"SIGTERM"``, ``"TERM"`` or ``"15"``.

    Raises:
        ConfigError: Unknown signal.
    """
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"{field_name}: not a signal: {value!r}")
    if isinstance(value, int):
        try:
            return signal.Signals(value)
        except ValueError:
            raise ConfigError(f"{field_name}: unknown signal number {short_repr(value)}") from None
    if isinstance(value, str):
        text = value.strip().upper()
        if text.isascii() and text.isdigit() and len(text) <= 3:
            return parse_signal(field_name, int(text))
        name = text if text.startswith("SIG") else "SIG" + text
        try:
            return signal.Signals[name]
        except KeyError:
            raise ConfigError(
                f"{field_name}: unknown signal {short_repr(value)}; use a name such as SIGKILL or "
                "SIGTERM, or a number"
            ) from None
    raise ConfigError(f"{field_name}: not a signal: {short_repr(value)}")


NON_TERMINATING_SIGNALS = frozenset(
    getattr(signal, name) for name in (
        "SIGSTOP", "SIGCONT", "SIGCHLD", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGWINCH",
    ) if hasattr(signal, name)
)
"""Signals whose default action stops, continues or ignores a process: none of them ends a hung
rank (SIGSTOP would freeze the job for good, the others do nothing)."""


def parse_termination_signal(field_name: str, value: Any) -> signal.Signals:
    """:func:`parse_signal`, refusing the signals that cannot end a process.

    Raises:
        ConfigError: Unknown signal, or one of :data:`NON_TERMINATING_SIGNALS` (the message
            names the field, the signal and what to use instead).
    """
    sig = parse_signal(field_name, value)
    if sig in NON_TERMINATING_SIGNALS:
        refused = ", ".join(sorted(s.name for s in NON_TERMINATING_SIGNALS))
        raise ConfigError(
            f"{field_name}: {sig.name} cannot end a hung rank (it stops, continues or is ignored "
            f"by default); use a signal that terminates, such as SIGKILL or SIGTERM (refused: "
            f"{refused})"
        )
    return sig


def parse_seconds_or_off(field_name: str, value: Any, *, maximum: float = MAX_SECONDS,
                         zero_means: str = "off") -> float:
    """The one validator for "seconds, 0 means off": seconds in ``(0, maximum]``, or ``0``.

    For every duration where 0 has a meaning of its own (``stack_capture_budget``: no capture;
    the launcher's ``--term-timeout``: SIGKILL at once; ``store_lost_timeout``: no watchdog).
    Accepts numbers and their string forms (``"12.5"``, ``"0"``); never null.

    Args:
        field_name: Named in the error message.
        value: The value to check.
        maximum: The largest accepted number of seconds.
        zero_means: What 0 does, for the error message ("off", "at once").

    Returns:
        The value as a float; ``0.0`` for 0.

    Raises:
        ConfigError: Not a number, negative, not finite, above ``maximum`` or null; the message
            names the field, echoes the value and states the accepted values.
    """
    if not isinstance(value, bool) and _to_float(value) == 0.0:
        return 0.0
    number = math.nan if isinstance(value, bool) or value is None else _to_float(value)
    if not math.isfinite(number) or not 0.0 < number <= maximum:
        raise ConfigError(f"{field_name} must be {seconds_or_off_bounds(maximum, zero_means)}, "
                          f"got {short_repr(value)}")
    return number


def seconds_or_off_bounds(maximum: float, zero_means: str = "off") -> str:
    """The values :func:`parse_seconds_or_off` accepts, in words."""
    return f"0 ({zero_means}) or seconds > 0 and <= {maximum:g}"


def parse_log_level(field_name: str, value: Any) -> int:
    """Parse a log level given as a number or a name such as ``"DEBUG"``.

    Raises:
        ConfigError: Unknown level name or invalid type.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{field_name}: not a log level: {value!r}")
    if isinstance(value, int):
        if not logging.NOTSET <= value <= logging.CRITICAL:
            raise ConfigError(
                f"{field_name}: log level {short_repr(value)} is outside {logging.NOTSET}..{logging.CRITICAL}"
            )
        return value
    if isinstance(value, str):
        text = value.strip().upper()
        if text.isascii() and text.isdigit() and len(text) <= 3:
            return parse_log_level(field_name, int(text))
        level = logging.getLevelName(text)
        if isinstance(level, int):
            return level
        raise ConfigError(
            f"{field_name}: unknown log level {short_repr(value)}; use DEBUG, INFO, WARNING, ERROR or "
            "CRITICAL"
        )
    raise ConfigError(f"{field_name}: not a log level: {short_repr(value)}")


def dump_log_level(value: Optional[int]) -> Any:
    if value is None:
        return None
    # A level without a name (e.g. 15) stays a number: "Level 15" would not parse back.
    name = logging.getLevelName(value)
    return name if isinstance(logging.getLevelName(name), int) else value
