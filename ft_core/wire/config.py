"""Fault tolerance configuration: one dataclass, readable from kwargs, YAML and CLI strings.

Each field is declared once, with its type, default, help text, accepted range, parser and the
processes that use it (:class:`FieldSpec`, attached as dataclass field metadata). The
constructor, :meth:`FaultToleranceConfig.from_kwargs`, YAML, :meth:`~FaultToleranceConfig.to_dict`
/ :meth:`~FaultToleranceConfig.from_dict`, ``ft_launcher``'s ``--ft-param-*`` options and their
``--help`` text all read that one declaration.

Precedence when the launcher builds the effective config: dataclass defaults < YAML file
(``fault_tolerance:`` section) < ``--ft-param-*`` command-line values. A timeout of ``None``
means "infinite": that check is off until a timeout is set or calculated.

Every process holds the whole config the launcher runs with: a rank monitor gets
:meth:`~FaultToleranceConfig.sent_to` ``(Role.MONITOR)`` and hands each rank
``sent_to(Role.RANK)`` at the handshake, and both are every field (a few hundred bytes), so that a
rank's ``cfg`` is a valid config that :meth:`~FaultToleranceConfig.to_yaml_file` and
:meth:`~FaultToleranceConfig.from_yaml_file` round-trip (as the reference's is);
:meth:`~FaultToleranceConfig.as_received` rebuilds it. :attr:`FieldSpec.used_by` records which
processes act on a field.

This module imports only the standard library at import time (PyYAML is imported lazily by the
YAML readers) because the rank monitor, which must stay small, uses it.
"""

from __future__ import annotations

import difflib
import enum
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Optional

from ft_core.wire import reference_options
from ft_core.wire.config_values import (
    MAX_SECONDS,
    MAX_SECTION_NAME_CHARS,
    MAX_SECTIONS,
    ConfigError,
    dump_log_level,
    number_bounds,
    parse_bool,
    parse_choice,
    parse_command,
    parse_count,
    parse_directories,
    parse_log_level,
    parse_number,
    parse_seconds,
    parse_seconds_or_off,
    parse_section_timeouts,
    parse_signal,
    parse_termination_signal,
    seconds_bounds,
    seconds_or_off_bounds,
)
from ft_core.wire.restart_policies import HELP_TEXT as RESTART_POLICY_HELP
from ft_core.wire.restart_policies import POLICY_NAMES, RestartPolicyName

__all__ = [
    "MAX_SAFETY_FACTOR",
    "MAX_SECONDS",
    "MAX_SECTIONS",
    "MAX_SECTION_NAME_CHARS",
    "MAX_STACK_CAPTURE_BUDGET",
    "MAX_TERMINATION_GRACE",
    "MAX_WORKLOAD_CHECK_INTERVAL",
    "MIN_CALCULATED_DEFAULTS",
    "MIN_SAFETY_FACTOR",
    "MIN_WORKLOAD_CHECK_INTERVAL",
    "RESTART_POLICIES",
    "ConfigError",
    "MissingSectionError",
    "FaultToleranceConfig",
    "FieldSpec",
    "Role",
    "parse_cli_value",
    "parse_log_level",
    "parse_number",
    "parse_seconds",
    "parse_signal",
]

logger = logging.getLogger(__name__)

RESTART_POLICIES = POLICY_NAMES  # the names are defined once, in ft_core.wire.restart_policies

MIN_WORKLOAD_CHECK_INTERVAL = 0.1
"""Shortest housekeeping interval of a monitor: shorter ones only burn CPU (detection of hangs
does not depend on it)."""
MAX_WORKLOAD_CHECK_INTERVAL = 3600.0
"""Longest housekeeping interval: a rank that died while a child of it holds its monitor
connection open is noticed within this time."""
MIN_SAFETY_FACTOR = 1.0
"""A smaller factor would make calculated timeouts shorter than the intervals observed."""
MAX_SAFETY_FACTOR = 1e9
"""Already with this factor every calculated timeout is the longest one accepted
(:data:`MAX_SECONDS`) for any interval above a millisecond; far larger ones overflowed to
``inf`` (``1e308``). To turn a check off, use a ``null`` timeout instead."""
MAX_TERMINATION_GRACE = 3600.0
"""Longest time a hung rank may take to exit after its termination signal before SIGKILL."""
MAX_STACK_CAPTURE_BUDGET = 60.0
MAX_NO_PROGRESS_CYCLES = 1000
MAX_PROGRESS_ITERATIONS = 10**9
"""Longest time a monitor may spend capturing stacks before it signals a hung rank: the budget
delays the restart, and py-spy or faulthandler need well under a second."""
MIN_CALCULATED_DEFAULTS = {
    "initial_heartbeat": 600.0,
    "heartbeat": 120.0,
    "section": 60.0,
    "out_of_section": 120.0,
}
"""Defaults of the ``min_calculated_*_timeout`` fields, in seconds. Detection within one to ten
minutes is what a job on a shared GPU cluster can live with (the reference's fixed defaults are
45 and 60 minutes); a healthy rank crossing these is rare. docs/lightning.md explains each."""
_SPEC = "ft_core.wire.config"  # key of a field's FieldSpec in its dataclass metadata


class Role(str, enum.Enum):
    """A process that uses configuration fields (see :attr:`FieldSpec.used_by`)."""

    LAUNCHER = "launcher"
    MONITOR = "monitor"
    RANK = "rank"


class MissingSectionError(ConfigError):
    """A config file has no ``fault_tolerance`` section (or is empty)."""


@dataclass(frozen=True)
class FieldSpec:
    """Everything about one config field except its name, type and default.

    Attributes:
        help: What the field means (one or two sentences).
        parse: ``parse(field_name, value) -> value``: validates a value given as its type or as
            a command-line/YAML string and returns it normalised; raises :class:`ConfigError`
            naming the field, echoing the value and stating :attr:`accepts`.
        accepts: The accepted values, in words (built from the same bounds ``parse`` checks).
        used_by: The processes that act on this field (each process receives every field).
        dump: Turns a value into a plain JSON/YAML-safe one that ``parse`` reads back.
        metavar: Placeholder of the value in ``--help``.
    """

    help: str
    parse: Callable[[str, Any], Any]
    accepts: str
    used_by: frozenset[Role]
    dump: Callable[[Any], Any] = lambda value: value
    metavar: str = "VALUE"


def _declare(default: Any, spec: FieldSpec, *, factory: bool = False) -> Any:
    if factory:
        return field(default_factory=default, metadata={_SPEC: spec})
    return field(default=default, metadata={_SPEC: spec})


def _seconds_field(
    default: Optional[float], help: str, used_by: set[Role], *, allow_none: bool = True,
    minimum: float = 0.0, maximum: float = MAX_SECONDS,
) -> Any:
    def parse(name: str, value: Any) -> Optional[float]:
        return parse_seconds(name, value, allow_none=allow_none, minimum=minimum, maximum=maximum)

    accepts = seconds_bounds(minimum, maximum, allow_none)
    return _declare(default, FieldSpec(help, parse, accepts, frozenset(used_by), metavar="SECONDS"))


def _spec(f: Field) -> FieldSpec:
    return f.metadata[_SPEC]


MAX_JIT_HEAL_TIMEOUT = 3600.0


@dataclass
class FaultToleranceConfig:
    """Configuration of hang detection and restarts.

    Every field is validated when the config is built (:class:`ConfigError` otherwise). A config
    received by a monitor or a rank (:meth:`as_received`) is the launcher's, every field of it.
    The fields, their defaults and accepted values:
    """

    workload_check_interval: float = _seconds_field(
        5.0, "Seconds between a rank monitor's housekeeping checks (is the launcher still alive, "
        "does the rank process still exist). Hang detection is deadline-driven and does not "
        "wait for this interval.",
        {Role.MONITOR}, allow_none=False,
        minimum=MIN_WORKLOAD_CHECK_INTERVAL, maximum=MAX_WORKLOAD_CHECK_INTERVAL,
    )
    initial_rank_heartbeat_timeout: Optional[float] = _seconds_field(
        3600.0, "Seconds allowed from client initialisation to the first heartbeat.",
        {Role.MONITOR, Role.RANK},
    )
    rank_heartbeat_timeout: Optional[float] = _seconds_field(
        2700.0, "Seconds allowed between two heartbeats.", {Role.MONITOR, Role.RANK},
    )
    rank_section_timeouts: Mapping[str, Optional[float]] = _declare(dict, FieldSpec(
        "Seconds each section may stay open, as 'name:seconds,...' on the command line (e.g. "
        "'setup:600,step:180,checkpointing:420') or a mapping in YAML. Only sections named here "
        "may be used by the client.",
        parse_section_timeouts,
        f"at most {MAX_SECTIONS} sections, names of 1 to {MAX_SECTION_NAME_CHARS} characters, "
        f"each timeout {seconds_bounds(0.0, MAX_SECONDS, True)}",
        frozenset({Role.MONITOR, Role.RANK}),
        dump=lambda value: None if value is None else dict(value),
        metavar="NAME:SECONDS,...",
    ), factory=True)
    rank_out_of_section_timeout: Optional[float] = _seconds_field(
        None, "Seconds the rank may spend with no section open.", {Role.MONITOR, Role.RANK},
    )
    safety_factor: float = _declare(5.0, FieldSpec(
        "Calculated timeouts are this factor times the longest observed interval.",
        lambda name, value: parse_number(name, value, minimum=MIN_SAFETY_FACTOR, maximum=MAX_SAFETY_FACTOR),
        number_bounds(MIN_SAFETY_FACTOR, MAX_SAFETY_FACTOR),
        frozenset({Role.RANK}),
        metavar="FACTOR",
    ))
    # The floors of calculated timeouts. Our monitor acts at the deadline, so a
    # calculated timeout that is merely the observed maximum times safety_factor really fires:
    # these keep a GC pause, a slow first step after a resume, a data-loader stall or a slow
    # checkpoint on a busy node from killing a healthy rank. Applied by the client when it sets
    # or restores calculated timeouts (ft_core/client/timeout_bounds.py), never by TimeoutsCalc.
    min_calculated_initial_heartbeat_timeout: float = _seconds_field(
        MIN_CALCULATED_DEFAULTS["initial_heartbeat"],
        "Smallest calculated initial_rank_heartbeat_timeout the client applies: start-up (imports, "
        "rendezvous, checkpoint loading from a shared file system, the first step's compilation) "
        "varies far more between runs than a step.",
        {Role.RANK}, allow_none=False,
    )
    min_calculated_heartbeat_timeout: float = _seconds_field(
        MIN_CALCULATED_DEFAULTS["heartbeat"],
        "Smallest calculated rank_heartbeat_timeout the client applies: the gap between two "
        "heartbeats spans a step, its data loading and, at times, a checkpoint save or the start "
        "of an evaluation.",
        {Role.RANK}, allow_none=False,
    )
    min_calculated_section_timeout: float = _seconds_field(
        MIN_CALCULATED_DEFAULTS["section"],
        "Smallest calculated timeout of any section the client applies (a section is measured "
        "exactly, but a step, a save or a setup can still take many times its usual length on a "
        "busy node).",
        {Role.RANK}, allow_none=False,
    )
    min_calculated_out_of_section_timeout: float = _seconds_field(
        MIN_CALCULATED_DEFAULTS["out_of_section"],
        "Smallest calculated rank_out_of_section_timeout the client applies: out-of-section time "
        "holds data loading (which can stall on a shared file system), logging, epoch ends and "
        "the warm-up steps, which compile.",
        {Role.RANK}, allow_none=False,
    )
    rank_termination_signal: signal.Signals = _declare(signal.SIGKILL, FieldSpec(
        "Signal the monitor sends to a hung rank, after SIGCONT (to its process group when the "
        "rank leads one).",
        parse_termination_signal,
        "a signal name (SIGTERM or TERM) or number that can end a process (not SIGSTOP, SIGCONT, "
        "SIGCHLD, SIGTSTP, SIGTTIN, SIGTTOU, SIGURG or SIGWINCH)",
        frozenset({Role.MONITOR}),
        dump=lambda value: None if value is None else signal.Signals(value).name,
        metavar="SIGNAL",
    ))
    log_level: int = _declare(logging.INFO, FieldSpec(
        "Log level of the launcher, the rank monitors, and, in each rank, the client's and the "
        "front ends' loggers (ft_core, ptl_resiliency).",
        parse_log_level,
        f"DEBUG, INFO, WARNING, ERROR, CRITICAL or a number {logging.NOTSET}..{logging.CRITICAL}",
        frozenset({Role.LAUNCHER, Role.MONITOR, Role.RANK}),
        dump=dump_log_level,
        metavar="LEVEL",
    ))
    restart_policy: str = _declare(RestartPolicyName.ANY_FAILED.value, FieldSpec(
        RESTART_POLICY_HELP,
        lambda name, value: parse_choice(name, value, RESTART_POLICIES),
        " or ".join(RESTART_POLICIES),
        frozenset({Role.LAUNCHER}),
        metavar="POLICY",
    ))

    max_no_progress_cycles: int = _declare(2, FieldSpec(
        "Consecutive failed cycles that end with the same failure (its fingerprint: kind, cause, "
        "innermost user frame) without the failing rank's step passing the previous failure's by "
        "min_progress_iterations, after which the launcher stops restarting and exits "
        "no_restart_exit_code. 0: never (a crash loop is then bounded by --max-restarts alone).",
        lambda name, value: parse_count(name, value, minimum=0, maximum=MAX_NO_PROGRESS_CYCLES),
        f"a whole number from 0 (off) to {MAX_NO_PROGRESS_CYCLES}",
        frozenset({Role.LAUNCHER}),
        metavar="CYCLES",
    ))
    min_progress_iterations: int = _declare(1, FieldSpec(
        "Steps the failing rank's step must pass the step of the previous failure by for the "
        "cycle to count as progress (see max_no_progress_cycles).",
        lambda name, value: parse_count(name, value, minimum=1, maximum=MAX_PROGRESS_ITERATIONS),
        f"a whole number from 1 to {MAX_PROGRESS_ITERATIONS}",
        frozenset({Role.LAUNCHER}),
        metavar="STEPS",
    ))
    no_restart_exit_code: int = _declare(66, FieldSpec(
        "The launcher's exit code when it stops restarting a failure that repeats without "
        "progress (scripts/autoresume.sh does not requeue on it).",
        lambda name, value: parse_count(name, value, minimum=3, maximum=125, exclude=(64, 65)),
        "a whole number from 3 to 125, other than 64 and 65",
        frozenset({Role.LAUNCHER}),
        metavar="CODE",
    ))
    node_check_dirs: Optional[list[str]] = _declare(None, FieldSpec(
        "Directories checked before each rendezvous (free space, a 1 MiB write with fsync): a node "
        "that fails does not join (exit 65). null: the temp dir and /dev/shm; [] or \"\": none.",
        parse_directories,
        "absolute directory paths (a list, or separated by commas), [] for none, or null for the defaults",
        frozenset({Role.LAUNCHER}),
        metavar="DIRS",
    ))
    node_check_min_free_mb: float = _declare(50.0, FieldSpec(
        "Free space, in MiB, each of node_check_dirs must have.",
        lambda name, value: parse_number(name, value, minimum=0.0, maximum=1e9),
        f"a number {number_bounds(0.0, 1e9)}",
        frozenset({Role.LAUNCHER}),
        metavar="MIB",
    ))
    node_check_max_write_seconds: float = _seconds_field(
        10.0, "Longest time the node check's 1 MiB write with fsync may take in each of node_check_dirs.",
        {Role.LAUNCHER}, allow_none=False, maximum=600.0,
    )
    node_health_check_cmd: Optional[str] = _declare(None, FieldSpec(
        "Your own node check, run with /bin/sh -c before each rendezvous: a non-zero exit status keeps "
        "this node out of the job (exit 65; scripts/autoresume.sh excludes it at its next requeue), and "
        "its output goes into the node_check record.",
        parse_command,
        "one shell command line, or null",
        frozenset({Role.LAUNCHER}),
        metavar="COMMAND",
    ))
    node_health_check_timeout: float = _seconds_field(
        60.0, "Seconds node_health_check_cmd may run; longer fails the check.",
        {Role.LAUNCHER}, allow_none=False, maximum=3600.0,
    )
    rank_termination_grace: float = _seconds_field(
        5.0, "Seconds a hung rank has to exit after rank_termination_signal; a rank still alive "
        "then gets SIGKILL on its process group (and the launcher records it).",
        {Role.MONITOR}, allow_none=False, maximum=MAX_TERMINATION_GRACE,
    )
    stack_capture_budget: float = _declare(2.0, FieldSpec(
        "Seconds a monitor may spend capturing a hung rank's Python stacks (all threads, with "
        "py-spy when installed, else through the client's faulthandler signal) before it "
        "signals the rank; the launcher gets the same budget for the other ranks of the node. "
        "0 turns stack capture off.",
        lambda name, value: parse_seconds_or_off(name, value, maximum=MAX_STACK_CAPTURE_BUDGET),
        seconds_or_off_bounds(MAX_STACK_CAPTURE_BUDGET),
        frozenset({Role.MONITOR, Role.LAUNCHER}),
        metavar="SECONDS",
    ))
    jit_state: bool = _declare(True, FieldSpec(
        "Just-in-time state (docs/jit-state.md): when a rank fails, one surviving rank per node saves "
        "the full training state of its last completed step before the survivors are stopped, and the "
        "restarted workers resume from it instead of the last periodic checkpoint. Needs a replicated "
        "job (DDP); costs nothing until a failure. false turns it off.",
        parse_bool,
        "true or false",
        frozenset({Role.LAUNCHER}),
        metavar="BOOL",
    ))
    jit_state_timeout: Optional[float] = _seconds_field(
        None, "Longest wait for a just-in-time save after a failure before the survivors are stopped "
        "anyway (the periodic checkpoint is used then). null: 10 s plus 1 s per 100 MB of the state.",
        {Role.MONITOR, Role.LAUNCHER}, maximum=3600.0,
    )
    jit_heal_timeout: Optional[float] = _declare(None, FieldSpec(
        "Longest transfer of the newest just-in-time state to a node that lacks it, from a node "
        "that holds it, through the rendezvous store after a restart's rendezvous (docs/jit-state.md, "
        "healing). null: 10 s plus 1 s per 10 MB of the state; 0 turns healing off (every node then "
        "resumes from the newest state every node can read).",
        lambda name, value: None if value is None or (isinstance(value, str) and value.strip().lower() in
                                                        ("null", "none", "~")) else
        parse_seconds_or_off(name, value, maximum=MAX_JIT_HEAL_TIMEOUT),
        "null (sized from the state) or " + seconds_or_off_bounds(MAX_JIT_HEAL_TIMEOUT),
        frozenset({Role.LAUNCHER}),
        metavar="SECONDS",
    ))

    def __post_init__(self) -> None:
        for f in fields(self):
            setattr(self, f.name, _spec(f).parse(f.name, getattr(self, f.name)))

    # ------------------------------------------------------------------ field declarations

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """Names of all configuration fields, in declaration order."""
        return tuple(f.name for f in fields(FaultToleranceConfig))

    @staticmethod
    def field_spec(name: str) -> FieldSpec:
        """The declaration of field ``name`` (help, parser, accepted values, users).

        Raises:
            ConfigError: No such field (the message lists the valid ones).
        """
        for f in fields(FaultToleranceConfig):
            if f.name == name:
                return _spec(f)
        raise ConfigError(
            f"unknown fault tolerance config field {name!r}; valid fields are: "
            f"{', '.join(FaultToleranceConfig.field_names())}"
        )

    @staticmethod
    def field_help(name: str) -> str:
        """Help text of field ``name``: meaning, accepted values and default (for ``--help``).

        Raises:
            ConfigError: No such field.
        """
        spec = FaultToleranceConfig.field_spec(name)
        return f"{spec.help} Accepted: {spec.accepts}. Default: {_default_text(name)}."

    @classmethod
    def fields_sent_to(cls, role: Role | str) -> tuple[str, ...]:
        """Names of the fields a process in ``role`` receives: every field, for every role.

        A rank's config is the whole one the launcher runs with, not only what the rank acts on,
        so that it is a valid config (users save it with :meth:`to_yaml_file`, as they do the
        reference's); a monitor receives it all to hand it on. The cost is a few hundred bytes
        once per connection.
        """
        Role(role)  # an unknown role is an error, as before
        return cls.field_names()

    # ------------------------------------------------------------------ constructors

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
        # The reference's options for features we lack: judged (one warning, or an error when
        # the value asks for the feature) and dropped (ft_core.wire.reference_options).
        kwargs = reference_options.take_from(kwargs, "")
        known = set(cls.field_names())
        unknown = sorted(k for k in kwargs if k not in known)
        if unknown:
            if not ignore_not_recognized:
                raise ConfigError(unknown_keys_message(unknown))
            logger.warning("Ignoring %s", unknown_keys_message(unknown))
        return cls(**{key: value for key, value in kwargs.items() if key in known})

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
        except ValueError as err:
            # A value PyYAML cannot convert: an integer longer than Python's int() reads (whose
            # message suggests raising sys.set_int_max_str_digits), a date such as 2024-13-45.
            raise ConfigError(_unconvertible_value_message(str(cfg_path), err)) from None
        found, section = _find_section(data, "fault_tolerance")
        if found and section is None:
            return {}  # "fault_tolerance:" with every field commented out: the defaults
        if not found:
            raise MissingSectionError(
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

    @classmethod
    def from_args(cls, args: Any) -> FaultToleranceConfig:
        """Build the config from ``launcher.get_args_parser()``'s parsed arguments.

        Precedence: defaults < the YAML file (``--ft-cfg-path``, ``ft_cfg_path``) < the
        ``--ft-*`` options (``ft_param_<field>``; the reference's ``ft_<field>`` attribute names
        are read too, so a namespace built for the reference works). The file:

        - missing: an error, unless ``--ft-ignore-missing-cfg`` (``ft_ignore_missing_cfg``) is
          set; then the defaults and the options apply (one warning);
        - empty, or without a ``fault_tolerance`` section: the options apply (one warning);
          with no option either it is an error (nothing would configure the run), unless
          ``--ft-ignore-missing-cfg``;
        - reference-only keys (``enable_nic_monitor``, ...): see :mod:`ft_core.wire.reference_options`.

        Args:
            args: An ``argparse.Namespace`` (any object with those attributes).

        Raises:
            ConfigError: A missing or unusable file, or an invalid value; the message names the
                file or the option and echoes the value.
        """
        path = getattr(args, "ft_cfg_path", None)
        ignore_missing = bool(getattr(args, "ft_ignore_missing_cfg", False))
        options: dict[str, Any] = {}
        for name in cls.field_names():
            raw = getattr(args, f"ft_param_{name}", None)
            if raw is None:
                raw = getattr(args, f"ft_{name}", None)
            if raw is not None:
                try:
                    options[name] = parse_cli_value(name, raw)  # the field's own validator
                except ConfigError as err:
                    raise ConfigError(f"--ft-param-{name}={raw!r}: {err}") from None
        values: dict[str, Any] = {}
        if path is not None:
            values = cls._file_values(str(path), ignore_missing, given_options=bool(options))
        values.update(options)
        return cls.from_kwargs(**values)

    @classmethod
    def _file_values(cls, path: str, ignore_missing: bool, given_options: bool) -> dict[str, Any]:
        """The validated ``fault_tolerance`` values of ``path`` for :meth:`from_args`."""
        if not os.path.exists(path):
            if not ignore_missing:
                raise ConfigError(
                    f"cannot read fault tolerance config file {path!r}: No such file or directory "
                    "(--ft-cfg-path); fix the path, or pass --ft-ignore-missing-cfg to run with the "
                    "defaults and --ft-* options"
                )
            logger.warning("fault tolerance config file %r does not exist; --ft-ignore-missing-cfg: "
                           "using the defaults and --ft-* options", path)
            return {}
        try:
            section = cls.read_yaml_section(path)
        except MissingSectionError as err:
            if not (given_options or ignore_missing):
                raise ConfigError(f"{err}\n(or give the settings as --ft-* options)") from None
            logger.warning("fault tolerance config file %r is empty or has no 'fault_tolerance' "
                           "section; using the defaults and --ft-* options", path)
            return {}
        section = reference_options.take_from(section, f" in {path}")
        unknown = sorted(key for key in section if key not in cls.field_names())
        if unknown:  # a typo in a file must not run silently with the default
            raise ConfigError(unknown_keys_message(unknown, f" in the fault_tolerance section of {path}"))
        try:
            cls.from_kwargs(**section)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
        return section

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-safe dict: signals and log levels as names, sections as a dict."""
        return {f.name: _spec(f).dump(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultToleranceConfig:
        """Inverse of :meth:`to_dict`; strict about unknown keys.

        Raises:
            ConfigError: Unknown keys or invalid values.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
        return cls.from_kwargs(ignore_not_recognized=False, **dict(data))

    def sent_to(self, role: Role | str) -> dict[str, Any]:
        """The part of :meth:`to_dict` a process in ``role`` receives (see :meth:`fields_sent_to`)."""
        full = self.to_dict()
        return {name: full[name] for name in self.fields_sent_to(role)}

    @classmethod
    def as_received(cls, data: Mapping[str, Any], role: Role | str) -> FaultToleranceConfig:
        """Rebuild a config from :meth:`sent_to` output, as the process in ``role`` sees it.

        The result is the launcher's config, every field of it (see :meth:`fields_sent_to`).
        ``role`` is a :class:`Role` or its value (``"rank"``).

        Raises:
            ConfigError: ``data`` is not a mapping, lacks a field ``role`` receives, has a field
                it does not receive, or holds an invalid value.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
        expected = cls.fields_sent_to(role)
        missing = [name for name in expected if name not in data]
        extra = sorted(name for name in data if name not in expected and name in cls.field_names())
        if missing or extra:
            raise ConfigError(
                f"a {Role(role).value} receives exactly the fields {', '.join(expected)}; "
                f"missing: {', '.join(missing) or '-'}, not expected: {', '.join(extra) or '-'}"
            )
        return cls.from_dict(data)

    def to_yaml_file(self, cfg_path: str | os.PathLike[str]) -> None:
        """Write the config as a ``fault_tolerance:`` section, atomically.

        :meth:`from_yaml_file` reads the file back to an equal config.
        """
        import yaml

        from ft_core.wire.atomic import atomic_write_text

        text = yaml.safe_dump({"fault_tolerance": self.to_dict()}, sort_keys=False)
        atomic_write_text(cfg_path, text)


def closest_field(name: str) -> Optional[str]:
    """The configuration field whose name is most like ``name`` (a likely typo), or None."""
    matches = difflib.get_close_matches(name, FaultToleranceConfig.field_names(), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_keys_message(keys: list[str], where: str = "") -> str:
    """Name each unknown key and the closest valid one, e.g. for a typo in a YAML file.

    Args:
        keys: The unknown keys.
        where: Where they were found (``" in the fault_tolerance section of ft.yaml"``).
    """
    parts = []
    for key in keys:
        close = closest_field(key)
        parts.append(f"{key!r}" + (f" (did you mean {close!r}?)" if close else ""))
    return (f"unknown fault tolerance config key(s){where}: {', '.join(parts)}; valid keys are: "
            f"{', '.join(FaultToleranceConfig.field_names())}")


def parse_cli_value(field_name: str, text: Any) -> Any:
    """Parse a command-line string for one config field.

    ``"null"``/``"None"``/``""`` give ``None`` for timeouts; ``"setup:600,step:180"`` gives a
    section mapping; ``"SIGTERM"``/``"TERM"``/``"15"`` give a signal; ``"DEBUG"``/``"10"``
    give a log level. The value is fully validated (it is the field's own parser).

    Args:
        field_name: A :class:`FaultToleranceConfig` field name.
        text: The string to parse (non-strings are returned unchanged).

    Returns:
        The parsed value.

    Raises:
        ConfigError: Unknown field or invalid value.
    """
    spec = FaultToleranceConfig.field_spec(field_name)
    if not isinstance(text, str):
        return text
    return spec.parse(field_name, text)


def _default_text(name: str) -> str:
    f = next(f for f in fields(FaultToleranceConfig) if f.name == name)
    default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
    value = _spec(f).dump(default)
    if value is None:
        return "null (no limit)"
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "none"
    return str(value)


def _attributes_doc() -> str:
    lines = ["", "    Attributes:"]
    for f in fields(FaultToleranceConfig):
        lines.append(f"        {f.name}: {FaultToleranceConfig.field_help(f.name)}")
    return "\n".join(lines) + "\n"


FaultToleranceConfig.__doc__ = (FaultToleranceConfig.__doc__ or "") + _attributes_doc()


def _unconvertible_value_message(cfg_path: str, err: ValueError) -> str:
    """Why PyYAML could not convert a value of ``cfg_path``: the line of the first integer too
    long to read, else PyYAML's own reason."""
    import sys

    import yaml

    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # Python 3.10.7+; 0: no limit
    try:
        with open(cfg_path, encoding="utf-8") as stream:
            stack = [yaml.compose(stream)]  # nodes only: composing converts no value
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        stack = []
    seen: set[int] = set()  # aliases can make the node graph cyclic
    while stack and limit:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.tag.endswith(":int") and len(node.value) > limit:
                return (f"fault tolerance config file {cfg_path!r}, line {node.start_mark.line + 1}: an "
                        f"integer of {len(node.value)} characters (at most {limit} digits are read; a "
                        f"timeout is seconds <= {MAX_SECONDS:g}, or null for no limit)")
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
        elif isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in reversed(node.value) for item in reversed(pair))
    return f"fault tolerance config file {cfg_path!r} holds a value that cannot be read: {err}"


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
