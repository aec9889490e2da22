"""The reference's options for features we do not have (NIC and GPU health checks, ...).

Users port command lines and config files from NVIDIA nvidia-resiliency-ext (0.4.1 and newer
releases), which carry options such as ``--ft-enable-nic-monitor`` or ``pci_topo_file:``. Each
option here is accepted where the reference accepts it (``ft_launcher`` option, YAML key,
``FaultToleranceConfig.from_kwargs`` keyword) and judged by its value:

- a value that leaves the feature off, or only tunes it, is harmless: accepted, with one warning
  line saying that it is ignored and why;
- a value that asks for the feature is a :class:`~ft_core.wire.config_values.ConfigError` naming the
  option and the feature, so nobody believes a check runs that does not.

None of them is a field of :class:`~ft_core.wire.config.FaultToleranceConfig`. Standard library only
(the config module, which the rank monitor imports, uses this one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ft_core.wire.config_values import ConfigError, parse_choice, parse_number, short_repr

logger = logging.getLogger(__name__)

MAX_NUMBER = 1e9
"""Largest number a numeric reference-only option accepts (they are all ignored anyway)."""
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _parse_bool(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"{where} must be true or false, got {short_repr(value)}")


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none"))


def _parse_number_or_null(where: str, value: Any) -> Optional[float]:
    return None if _is_null(value) else parse_number(where, value, minimum=0.0, maximum=MAX_NUMBER)


def _parse_path_or_null(where: str, value: Any) -> Optional[str]:
    if _is_null(value):
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a path or null, got {short_repr(value)}")
    return value.strip()


def _parse_int_or_null(where: str, value: Any) -> Optional[int]:
    if _is_null(value):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{where} must be an integer or null, got {short_repr(value)}") from None


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    return lambda where, value: parse_choice(where, value, choices)


@dataclass(frozen=True)
class ReferenceOnlyOption:
    """One option of the reference's that names a feature we lack.

    Attributes:
        name: The reference's config field (``enable_nic_monitor``); the ``ft_launcher`` option
            is ``--ft-<name with dashes>`` with the reference's other spellings.
        feature: The feature it controls in the reference, in words.
        parse: ``parse(where, value) -> value``: validates the value (a bad one is an error
            whatever it asks for).
        asks_for_feature: Whether a parsed value turns the feature on.
        metavar: Placeholder in ``--help``.
    """

    name: str
    feature: str
    parse: Callable[[str, Any], Any]
    asks_for_feature: Callable[[Any], bool]
    metavar: str

    @property
    def flag(self) -> str:
        """The reference's preferred command-line spelling."""
        return "--ft-" + self.name.replace("_", "-")


def _never(_value: Any) -> bool:
    return False


def _is_set(value: Any) -> bool:
    return value is not None


def _positive(value: Any) -> bool:
    return value is not None and value > 0


REFERENCE_ONLY_OPTIONS: tuple[ReferenceOnlyOption, ...] = (
    # nvidia-resiliency-ext 0.4.1:
    ReferenceOnlyOption("enable_nic_monitor", "NIC health monitoring", _parse_bool, bool, "BOOL"),
    ReferenceOnlyOption("pci_topo_file", "NIC health monitoring (the GPU/NIC topology file)",
                        _parse_path_or_null, _is_set, "PATH"),
    ReferenceOnlyOption("link_down_path_template", "NIC health monitoring (link-down counter files)",
                        _parse_path_or_null, _is_set, "TEMPLATE"),
    ReferenceOnlyOption("node_health_check_interval", "the interval of GPU/NIC health checks",
                        _parse_number_or_null, _never, "SECONDS"),
    ReferenceOnlyOption("restart_check_interval", "the interval of the in-process restart check",
                        _parse_number_or_null, _never, "SECONDS"),
    # newer releases:
    ReferenceOnlyOption("enable_nic_healthcheck", "the NIC link state check before rendezvous",
                        _parse_bool, bool, "BOOL"),
    ReferenceOnlyOption("link_state_path_template", "the NIC link state check (link state files)",
                        _parse_path_or_null, _is_set, "TEMPLATE"),
    ReferenceOnlyOption("gpu_memory_reclaim_timeout", "waiting for GPU memory to be freed before a restart",
                        _parse_number_or_null, _positive, "SECONDS"),
    ReferenceOnlyOption("gpu_memory_tolerance_mb", "waiting for GPU memory to be freed (its tolerance)",
                        _parse_number_or_null, _never, "MB"),
    ReferenceOnlyOption("gpu_memory_poll_interval", "waiting for GPU memory to be freed (its poll interval)",
                        _parse_number_or_null, _never, "SECONDS"),
    ReferenceOnlyOption("segment", "segment-aware rank assignment on NVLink domains",
                        _parse_int_or_null, _is_set, "N"),
    ReferenceOnlyOption("skip_section_response", "not waiting for the monitor's answer to a section call "
                        "(ours never waits)", _parse_bool, _never, "BOOL"),
    ReferenceOnlyOption("check_remaining_processes", "logging worker processes left after a stop "
                        "(ours always finds and ends them)", _parse_bool, _never, "BOOL"),
    ReferenceOnlyOption("rdzv_impl", "its own rendezvous implementations (ours is torch's)",
                        _parse_choice(("barrier", "legacy")), _never, "IMPL"),
)
"""Every reference-only option, in the order ``docs/launcher.md`` lists them."""

BY_NAME: dict[str, ReferenceOnlyOption] = {option.name: option for option in REFERENCE_ONLY_OPTIONS}

REFERENCE_LAUNCHER_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # torchrun's options, as the reference's parser spells them
    ("nnodes", ("--nnodes",)),
    ("nproc_per_node", ("--nproc-per-node", "--nproc_per_node")),
    ("rdzv_backend", ("--rdzv-backend", "--rdzv_backend")),
    ("rdzv_endpoint", ("--rdzv-endpoint", "--rdzv_endpoint")),
    ("rdzv_id", ("--rdzv-id", "--rdzv_id")),
    ("rdzv_conf", ("--rdzv-conf", "--rdzv_conf")),
    ("standalone", ("--standalone",)),
    ("max_restarts", ("--max-restarts", "--max_restarts")),
    ("term_timeout", ("--term-timeout", "--term_timeout")),
    ("workers_stop_timeout", ("--workers-stop-timeout", "--workers_stop_timeout")),
    ("monitor_interval", ("--monitor-interval", "--monitor_interval")),
    ("start_method", ("--start-method", "--start_method")),
    ("role", ("--role",)),
    ("module", ("-m", "--module")),
    ("no_python", ("--no-python", "--no_python")),
    ("run_path", ("--run-path", "--run_path")),
    ("log_dir", ("--log-dir", "--log_dir")),
    ("redirects", ("-r", "--redirects")),
    ("tee", ("-t", "--tee")),
    ("local_ranks_filter", ("--local-ranks-filter", "--local_ranks_filter")),
    ("node_rank", ("--node-rank", "--node_rank")),
    ("master_addr", ("--master-addr", "--master_addr")),
    ("master_port", ("--master-port", "--master_port")),
    ("local_addr", ("--local-addr", "--local_addr")),
    ("logs_specs", ("--logs-specs", "--logs_specs")),
    # fault tolerance: ft_<field> is a config field (ours: --ft-param-<field> and these spellings)
    ("ft_cfg_path", ("--ft-cfg-path", "--ft-cfg_path", "--fault-tol-cfg-path")),
    *((f"ft_{field}", (f"--ft-{field.replace('_', '-')}", f"--ft-{field}", f"--ft-param-{field}"))
      for field in ("workload_check_interval", "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout",
                    "node_health_check_interval", "safety_factor", "rank_termination_signal", "log_level",
                    "rank_out_of_section_timeout", "rank_section_timeouts", "restart_check_interval")),
    ("ft_restart_policy", ("--ft-restart-policy", "--ft-restart_policy", "--restart-policy", "--restart_policy")),
    *((f"ft_{name}", (f"--ft-{name.replace('_', '-')}", f"--ft-{name}", f"--ft-param-{name.replace('_', '-')}",
                      f"--ft_param_{name}"))
      for name in ("enable_nic_monitor", "pci_topo_file", "link_down_path_template")),
    ("ft_ignore_missing_cfg", ("--ignore-missing-fault-tol-cfg",)),
)
"""Every option of the reference's ``ft_launcher --help`` (nvidia-resiliency-ext 0.4.1): its
destination there and its spellings. ``ft_launcher`` accepts each spelling with the same meaning
(a torchrun option, a config field's ``--ft-param-*``, an option of
:data:`REFERENCE_ONLY_OPTIONS`, ``--ft-ignore-missing-cfg``);
``tests/integration/test_bad_input.py`` checks it against the parser."""


def check(option: ReferenceOnlyOption, value: Any, where: str) -> str:
    """Judge one value of a reference-only option.

    Args:
        option: The option.
        value: Its value, as given (a command-line string, a YAML value, a keyword argument).
        where: How the user gave it, for messages (``--ft-enable-nic-monitor``, ``enable_nic_monitor
            in cfg.yaml``).

    Returns:
        The warning line for a harmless value (the caller logs it once).

    Raises:
        ConfigError: The value is invalid, or asks for the feature.
    """
    parsed = option.parse(where, value)
    if option.asks_for_feature(parsed):
        raise ConfigError(
            f"{where}={short_repr(value)} asks for {option.feature}, which ptl-resiliency does not have; "
            "remove the option (see 'porting from the reference' in docs/porting.md)"
        )
    return (f"ignoring {where}={short_repr(value)}: an option of nvidia-resiliency-ext for {option.feature}; "
            "ptl-resiliency has no such setting, and the value asks for nothing, so the run is unaffected")


def take_from(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Judge and remove the reference-only keys of a config mapping; log one warning per key.

    Args:
        values: Config keys and values (a YAML section, keyword arguments).
        where: Appended to each key in messages (e.g. ``" in cfg.yaml"``; ``""`` for keywords).

    Returns:
        ``values`` without the reference-only keys.

    Raises:
        ConfigError: A value is invalid or asks for a feature we lack.
    """
    rest = {}
    for key, value in values.items():
        option = BY_NAME.get(key) if isinstance(key, str) else None
        if option is None:
            rest[key] = value
        else:
            logger.warning("%s", check(option, value, f"{key}{where}"))
    return rest
