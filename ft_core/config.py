"""Fault tolerance configuration: one dataclass, readable from kwargs, YAML and CLI strings.

Precedence when the launcher builds the effective config: dataclass defaults < YAML file
(``fault_tolerance:`` section) < ``--ft-param-*`` command-line values. A timeout of ``None``
means "infinite": that check is off until a timeout is set or calculated.

This module imports only the standard library at import time (PyYAML is imported lazily by the
YAML readers) because the rank monitor, which must stay small, uses it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Optional

logger = logging.getLogger(__name__)

RESTART_POLICIES = ("any-failed", "min-healthy")

_NONE_STRINGS = frozenset({"", "none", "null", "~"})

_TIMEOUT_FIELDS = (
    "initial_rank_heartbeat_timeout",
    "rank_heartbeat_timeout",
    "rank_out_of_section_timeout",
)


class ConfigError(ValueError):
    """A configuration value or file is invalid; the message names the field and the value."""


@dataclass
class FaultToleranceConfig:
    """Configuration of hang detection and restarts.

    Attributes:
        workload_check_interval: Seconds between the rank monitor's housekeeping checks (is the
            launcher still alive, does the rank process still exist). Hang detection itself is
            deadline-driven and does not wait for this interval.
        initial_rank_heartbeat_timeout: Seconds allowed from client initialisation to the first
            heartbeat. ``None``: no limit.
        rank_heartbeat_timeout: Seconds allowed between two heartbeats. ``None``: no limit.
        rank_section_timeouts: Section name to seconds a section may stay open (``None``: no
            limit). Only sections named here may be used by the client.
        rank_out_of_section_timeout: Seconds the rank may spend with no section open.
            ``None``: no limit.
        safety_factor: Calculated timeouts are this factor times the longest observed interval.
        rank_termination_signal: Signal the monitor sends to a hung rank (after ``SIGCONT``).
        log_level: Log level of the monitor and the client.
        restart_policy: ``any-failed`` (restart all workers when one fails) or ``min-healthy``
            (restart only when fewer than the minimum number of nodes are healthy).
    """

    workload_check_interval: float = 5.0
    initial_rank_heartbeat_timeout: Optional[float] = 3600.0
    rank_heartbeat_timeout: Optional[float] = 2700.0
    rank_section_timeouts: Mapping[str, Optional[float]] = field(default_factory=dict)
    rank_out_of_section_timeout: Optional[float] = None
    safety_factor: float = 5.0
    rank_termination_signal: signal.Signals = signal.SIGKILL
    log_level: int = logging.INFO
    restart_policy: str = "any-failed"

    def __post_init__(self) -> None:
        for name in _TIMEOUT_FIELDS:
            setattr(self, name, _parse_timeout(name, getattr(self, name)))
        self.rank_section_timeouts = _parse_section_timeouts(self.rank_section_timeouts)
        self.workload_check_interval = _parse_positive_float(
            "workload_check_interval", self.workload_check_interval
        )
        self.safety_factor = _parse_positive_float("safety_factor", self.safety_factor)
        if self.safety_factor < 1.0:
            raise ConfigError(
                f"safety_factor must be >= 1.0 (a smaller factor makes timeouts shorter than "
                f"the intervals observed), got {self.safety_factor!r}"
            )
        self.rank_termination_signal = parse_signal(
            "rank_termination_signal", self.rank_termination_signal
        )
        self.log_level = parse_log_level("log_level", self.log_level)
        if self.restart_policy not in RESTART_POLICIES:
            raise ConfigError(
                f"restart_policy must be one of {', '.join(RESTART_POLICIES)}, "
                f"got {self.restart_policy!r}"
            )

    # ------------------------------------------------------------------ constructors

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """Names of all configuration fields, in declaration order."""
        return tuple(f.name for f in fields(FaultToleranceConfig))

    @classmethod
    def from_kwargs(
        cls, ignore_not_recognized: bool = True, **kwargs: Any
    ) -> FaultToleranceConfig:
        """Build a config from keyword arguments.

        Args:
            ignore_not_recognized: If True, unknown keys are skipped with a warning; if False,
                they raise.
            **kwargs: Field values. Strings are parsed as on the command line.

        Returns:
            The validated config.

        Raises:
            ConfigError: An unknown key (when strict) or an invalid value.
        """
        known = set(cls.field_names())
        unknown = sorted(k for k in kwargs if k not in known)
        if unknown:
            if not ignore_not_recognized:
                raise ConfigError(
                    f"unknown fault tolerance config key(s): {', '.join(unknown)}; "
                    f"valid keys are: {', '.join(cls.field_names())}"
                )
            logger.warning("Ignoring unknown fault tolerance config key(s): %s", ", ".join(unknown))
        values = {}
        for key, value in kwargs.items():
            if key in known:
                values[key] = parse_cli_value(key, value) if isinstance(value, str) else value
        return cls(**values)

    @classmethod
    def from_yaml_file(
        cls, cfg_path: str | os.PathLike[str], ignore_not_recognized: bool = True
    ) -> FaultToleranceConfig:
        """Read the ``fault_tolerance:`` section of a YAML file.

        The section may be at the top level or nested at any depth (e.g. inside a model
        config); the first one found breadth-first is used. An empty section (every field
        commented out) means the defaults.

        Args:
            cfg_path: Path of the YAML file.
            ignore_not_recognized: As in :meth:`from_kwargs`.

        Returns:
            The validated config.

        Raises:
            ConfigError: The file cannot be read, is not YAML, has no ``fault_tolerance``
                section, or holds an invalid value.
        """
        section = cls.read_yaml_section(cfg_path)
        try:
            return cls.from_kwargs(ignore_not_recognized=ignore_not_recognized, **section)
        except ConfigError as err:
            raise ConfigError(f"{cfg_path}: {err}") from None

    @staticmethod
    def read_yaml_section(cfg_path: str | os.PathLike[str]) -> dict[str, Any]:
        """Return the raw ``fault_tolerance`` mapping of a YAML file (unvalidated).

        Raises:
            ConfigError: As in :meth:`from_yaml_file`.
        """
        import yaml  # lazy: the monitor never reads YAML and must stay stdlib-only

        try:
            with open(cfg_path, encoding="utf-8") as stream:
                data = yaml.safe_load(stream)
        except OSError as err:
            raise ConfigError(
                f"cannot read fault tolerance config file {str(cfg_path)!r}: {err.strerror}"
            ) from None
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"fault tolerance config file {str(cfg_path)!r} is not UTF-8 text: {err}"
            ) from None
        except (yaml.YAMLError, RecursionError) as err:
            raise ConfigError(
                f"fault tolerance config file {str(cfg_path)!r} is not valid YAML: {err}"
            ) from None
        found, section = _find_section(data, "fault_tolerance")
        if found and section is None:
            return {}  # "fault_tolerance:" with every field commented out: the defaults
        if not found:
            raise ConfigError(
                f"no 'fault_tolerance' section in {str(cfg_path)!r}; add one, e.g.\n"
                "fault_tolerance:\n  initial_rank_heartbeat_timeout: 600\n"
                "  rank_heartbeat_timeout: 300"
            )
        if not isinstance(section, Mapping):
            raise ConfigError(
                f"the 'fault_tolerance' section of {str(cfg_path)!r} must be a mapping of "
                f"field: value, got {type(section).__name__}"
            )
        for key in section:
            if not isinstance(key, str):
                raise ConfigError(
                    f"fault tolerance config keys must be strings, got {key!r} "
                    f"in {str(cfg_path)!r}"
                )
        return dict(section)

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-safe dict: signals and log levels as names, sections as a dict."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "rank_termination_signal":
                value = signal.Signals(value).name
            elif f.name == "log_level":
                # A level without a name (e.g. 15) stays a number: "Level 15" would not parse back.
                name = logging.getLevelName(value)
                value = name if isinstance(logging.getLevelName(name), int) else value
            elif f.name == "rank_section_timeouts":
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultToleranceConfig:
        """Inverse of :meth:`to_dict`; strict about unknown keys.

        Raises:
            ConfigError: Unknown keys or invalid values.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
        return cls.from_kwargs(ignore_not_recognized=False, **dict(data))

    def to_yaml_file(self, cfg_path: str | os.PathLike[str]) -> None:
        """Write the config as a ``fault_tolerance:`` section, atomically.

        :meth:`from_yaml_file` reads the file back to an equal config.
        """
        import yaml

        from ft_core.atomic import atomic_write_text

        text = yaml.safe_dump({"fault_tolerance": self.to_dict()}, sort_keys=False)
        atomic_write_text(cfg_path, text)

    def with_overrides(self, **overrides: Any) -> FaultToleranceConfig:
        """Return a copy with the given fields replaced (strings parsed as CLI values)."""
        parsed = {
            key: parse_cli_value(key, value) if isinstance(value, str) else value
            for key, value in overrides.items()
        }
        unknown = sorted(set(parsed) - set(self.field_names()))
        if unknown:
            raise ConfigError(f"unknown fault tolerance config key(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **parsed)


# ---------------------------------------------------------------------- value parsing


def parse_cli_value(field_name: str, text: Any) -> Any:
    """Parse a command-line string for one config field.

    ``"null"``/``"None"``/``""`` give ``None`` for timeouts; ``"setup:600,step:180"`` gives a
    section mapping; ``"SIGTERM"``/``"TERM"``/``"15"`` give a signal; ``"DEBUG"``/``"10"``
    give a log level.

    Args:
        field_name: A :class:`FaultToleranceConfig` field name.
        text: The string to parse (non-strings are returned unchanged).

    Returns:
        The parsed value (validated again when the config is built).

    Raises:
        ConfigError: Unknown field or malformed value.
    """
    if field_name not in FaultToleranceConfig.field_names():
        raise ConfigError(
            f"unknown fault tolerance config field {field_name!r}; valid fields are: "
            f"{', '.join(FaultToleranceConfig.field_names())}"
        )
    if not isinstance(text, str):
        return text
    if field_name in _TIMEOUT_FIELDS:
        return _parse_timeout(field_name, text)
    if field_name == "rank_section_timeouts":
        return _parse_section_timeouts(text)
    if field_name in ("workload_check_interval", "safety_factor"):
        return _parse_positive_float(field_name, text)
    if field_name == "rank_termination_signal":
        return parse_signal(field_name, text)
    if field_name == "log_level":
        return parse_log_level(field_name, text)
    return text.strip()


def _parse_timeout(field_name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in _NONE_STRINGS:
        return None
    return _parse_positive_float(field_name, value)


def _parse_positive_float(field_name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{field_name} must be a number of seconds, got {value!r}")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float range
        raise ConfigError(f"{field_name} must be a positive number, got {_short(value)}") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{field_name} must be a positive number, got {_short(value)}")
    return number


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened so that a huge value cannot flood an error message."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else f"<{value.bit_length()}-bit int>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_section_timeouts(value: Any) -> dict[str, Optional[float]]:
    name = "rank_section_timeouts"
    if value is None:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if not text or text.lower() in _NONE_STRINGS - {""}:
            return {}
        result: dict[str, Optional[float]] = {}
        for item in text.split(","):
            section, sep, timeout = item.partition(":")
            section = section.strip()
            if not sep or not section:
                raise ConfigError(
                    f"{name}: malformed entry {item.strip()!r} in {value!r}; expected "
                    "'name:seconds,name:seconds' (seconds may be 'null'), "
                    "e.g. 'setup:600,step:180,checkpointing:420'"
                )
            if section in result:
                raise ConfigError(f"{name}: section {section!r} is given twice in {value!r}")
            result[section] = _parse_timeout(f"{name}[{section}]", timeout)
        return result
    if isinstance(value, Mapping):
        result = {}
        for section, timeout in value.items():
            if not isinstance(section, str) or not section.strip():
                raise ConfigError(f"{name}: section names must be non-empty strings, got {section!r}")
            result[section.strip()] = _parse_timeout(f"{name}[{section}]", timeout)
        return result
    raise ConfigError(
        f"{name} must be a mapping of section name to seconds or a string "
        f"'name:seconds,...', got {value!r}"
    )


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
            raise ConfigError(f"{field_name}: unknown signal number {_short(value)}") from None
    if isinstance(value, str):
        text = value.strip().upper()
        if text.isascii() and text.isdigit() and len(text) <= 3:
            return parse_signal(field_name, int(text))
        name = text if text.startswith("SIG") else "SIG" + text
        try:
            return signal.Signals[name]
        except KeyError:
            raise ConfigError(
                f"{field_name}: unknown signal {_short(value)}; use a name such as SIGKILL or "
                "SIGTERM, or a number"
            ) from None
    raise ConfigError(f"{field_name}: not a signal: {value!r}")


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
                f"{field_name}: log level {_short(value)} is outside {logging.NOTSET}..{logging.CRITICAL}"
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
            f"{field_name}: unknown log level {value!r}; use DEBUG, INFO, WARNING, ERROR or "
            "CRITICAL"
        )
    raise ConfigError(f"{field_name}: not a log level: {value!r}")


def _find_section(data: Any, key: str) -> tuple[bool, Any]:
    """Breadth-first search for ``key`` in nested mappings and lists: ``(found, value)``."""
    queue = [data]
    seen: set[int] = set()  # YAML aliases can make the document a graph with cycles
    while queue:
        node = queue.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Mapping):
            if key in node:
                return True, node[key]
            queue.extend(node.values())
        elif isinstance(node, list):
            queue.extend(node)
    return False, None
