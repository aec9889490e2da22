"""Coordinated graceful stop: a stop signal becomes a flag, and all ranks agree on the step to stop.

SLURM warns a job before its time limit or a preemption with a signal (``--signal=B:USR1@300``,
forwarded to every rank by ``scripts/autoresume.sh`` and ``ft_launcher``) and ends it with SIGTERM
(SIGKILL after ``KillWait``). The reference recommends handling such signals, "synchronized across all
ranks": a rank that stops on its own leaves the others waiting in the next
collective, and a checkpoint written from inside a signal handler can deadlock or be torn.

:class:`GracefulStop` does it in three parts:

1. **A flag.** :meth:`~GracefulStop.install` (main thread only, like any Python signal handler)
   sets a handler for each of ``signals`` (default SIGTERM and SIGUSR1) that only records the
   signal. It is idempotent: the same stop delivered two or three times (a job-wide SLURM signal
   reaches every process, and the launcher forwards it too) records one stop. The handler that
   was installed before is called after it (the user's own handler keeps working), unless that
   was a default disposition: ``SIG_DFL``, ``SIG_IGN`` or Python's ``KeyboardInterrupt`` handler.
   In a forked child (a DataLoader worker, which inherits the handler) the stop is not the
   child's to take: the handler records nothing and never ends the child; it only calls a
   user's own handler that was there before. A stop signal reaches loader workers whichever way
   it comes (SLURM signals every process of the job; ``ft_launcher`` signals each rank's process
   group), and a loader worker that died of it (SIGUSR1's default action) would fail the rank's
   next batch ("DataLoader worker ... is killed by signal") before the stop step. The rank ends
   its children itself when it stops. A child forked while a :class:`GracefulStop` exists but
   before its :meth:`~GracefulStop.install` (Lightning starts the loader workers of the first
   epoch before ``on_train_start``, where the callbacks install) gets the same child handler for
   the stop signals that had their default action (``os.register_at_fork``); a Python handler
   does not survive ``exec``, so programs a child runs are not affected. Children started with
   ``spawn`` or ``forkserver`` (or any ``exec``) are fresh interpreters without this handler;
   docs/lightning.md shows a ``worker_init_fn`` that makes their loader workers ignore the stop.
2. **An agreement, cheaply.** The front end calls :meth:`~GracefulStop.step_ended` after every
   training step; it counts steps. At steps every rank knows in advance it runs one small
   collective, an all-ranks MAX of ``[signal received, -proposed interval]``: whether any rank got
   a stop signal, and how many steps until the next check. Each rank proposes ``check_interval``
   seconds divided by its mean step time since the last check; the smallest proposal wins. So a
   check costs one all-reduce of two numbers (about 0.1 ms with gloo on CPU) about once per
   ``check_interval`` (1 s by default), and a step between checks costs an increment and a
   comparison: well under a microsecond on average.
3. **The stop step.** The check that sees a flag returns True on every rank after the same step:
   the stop step. The front end saves a checkpoint there, outside the signal handler, and ends
   the run; the run exits 0 without the finished flag, so an auto-resume loop continues it from
   that checkpoint. The stop comes at most about ``check_interval`` seconds plus one step after
   the signal (plus an evaluation run that lies in between).

:meth:`~GracefulStop.uninstall` puts back the handlers it replaced, unless someone else has
installed another one since. After a clean end (``absorb=True``, what the front ends pass when
training completed or stopped gracefully), a stop signal that had its default action before (SIG_DFL, or
Python's ``KeyboardInterrupt`` handler) does not get it back, though: from then on it is absorbed
(a handler that does nothing) for the rest of the process. The run has ended by then; a stop or a
warning that comes after it (SLURM's ``USR1`` relayed a moment late, a time limit reached while the
rank writes its last files) must not kill a rank that finished (-10 would count as a failure and
restart a completed job). The launcher stops such a rank anyway when it stops the job (SIGKILL after
``--term-timeout``). A handler of the user's comes back as it was. Absorbed signals are ignored
(``SIG_IGN``) from the start of the interpreter's exit on: CPython puts the default action back for
every Python handler while it finalizes.

Standard library only; collectives go through :class:`~ft_core.client.collectives.Collectives`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from ft_core.client.collectives import Collectives
from ft_core.wire.config_values import ConfigError, parse_seconds, parse_signal
from ft_core.wire.errors import GracefulStopExit
from ft_core.wire.osutil import in_main_thread

__all__ = [
    "DEFAULT_CHECK_INTERVAL", "DEFAULT_SIGNALS", "STOP_SIGNALS", "GracefulStop", "GracefulStopConfig",
    "GracefulStopExit",
]

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""SLURM's termination signal and the usual warning signal (``--signal=B:USR1@N``)."""

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                          signal.SIGUSR2, signal.SIGXCPU})
"""The signals that may ask for a graceful stop: ones a scheduler or a user sends to end or warn a
job. Others cannot be caught (KILL, STOP) or mean something else (CHLD, CONT, WINCH, faults)."""

DEFAULT_CHECK_INTERVAL = 1.0
"""Seconds between two agreement checks (about; a check happens after a step)."""

MAX_CHECK_INTERVAL = 3600.0
MAX_INTERVAL_STEPS = 1_000_000
"""At most this many steps between two checks, whatever the step time."""



def _absorb_after_end(signum: int, frame: Any) -> None:
    """A stop signal after the run ended: nothing to do (see the module docstring)."""


_DEFAULT_DISPOSITIONS = (signal.SIG_DFL, signal.SIG_IGN, None, signal.default_int_handler, _absorb_after_end)
_DEFAULT_ACTIONS = (signal.SIG_DFL, None, signal.default_int_handler, _absorb_after_end)
"""What a signal had before :meth:`GracefulStop.install` for it to be absorbed after the run."""
Handler = Any  # what signal.getsignal returns

_ARMED: weakref.WeakSet[GracefulStop] = weakref.WeakSet()
"""The stops that protect the children forked now (created, not uninstalled)."""
_AT_FORK_REGISTERED = False
_AT_EXIT_REGISTERED = False


def _ignore_absorbed_at_exit() -> None:
    # atexit, main thread: CPython resets every Python handler to SIG_DFL later in its
    # finalization, which would reopen the window this module closes; SIG_IGN stays.
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is _absorb_after_end:
                signal.signal(sig, signal.SIG_IGN)


def _absorb(sig: signal.Signals) -> None:
    global _AT_EXIT_REGISTERED
    if not _AT_EXIT_REGISTERED:
        atexit.register(_ignore_absorbed_at_exit)
        _AT_EXIT_REGISTERED = True
    signal.signal(sig, _absorb_after_end)


def _protect_forked_child() -> None:
    # os.register_at_fork's after_in_child: runs in every child forked by os.fork().
    for stop in list(_ARMED):
        stop._protect_child()


def _arm(stop: GracefulStop) -> None:
    global _AT_FORK_REGISTERED
    if not _AT_FORK_REGISTERED:
        os.register_at_fork(after_in_child=_protect_forked_child)  # cannot be undone: registered once
        _AT_FORK_REGISTERED = True
    _ARMED.add(stop)


@dataclass(frozen=True)
class GracefulStopConfig:
    """What a front end's ``graceful_stop`` option holds.

    Attributes:
        signals: Signals that ask for a stop (default SIGTERM and SIGUSR1); names, numbers or
            ``signal.Signals``, each in :data:`STOP_SIGNALS`.
        check_interval: About how many seconds apart the ranks check for a stop (> 0, <= 3600).
        checkpoint_path: Lightning callbacks only: where the stop checkpoint goes (default
            ``last.ckpt`` in the ``ModelCheckpoint``'s directory, which ``fit(ckpt_path="last")``
            resumes from). A hand-written loop saves its own checkpoint.
    """

    signals: tuple[signal.Signals, ...] = DEFAULT_SIGNALS
    check_interval: float = DEFAULT_CHECK_INTERVAL
    checkpoint_path: Optional[str] = None

    def __post_init__(self) -> None:
        owner = "graceful_stop"
        raw = self.signals
        if isinstance(raw, (str, int, signal.Signals)):
            raw = (raw,)
        if not isinstance(raw, Iterable):
            raise ConfigError(f"{owner}.signals must be a list of signals, got {raw!r}")
        parsed: list[signal.Signals] = []
        for value in raw:
            sig = parse_signal(f"{owner}.signals", value)
            if sig not in STOP_SIGNALS:
                allowed = ", ".join(sorted(s.name for s in STOP_SIGNALS))
                raise ConfigError(f"{owner}.signals: {sig.name} cannot ask for a graceful stop; use some of {allowed}")
            if sig not in parsed:
                parsed.append(sig)
        if not parsed:
            raise ConfigError(f"{owner}.signals is empty; give at least one signal, e.g. SIGTERM")
        object.__setattr__(self, "signals", tuple(parsed))
        interval = parse_seconds(f"{owner}.check_interval", self.check_interval, allow_none=False,
                                 maximum=MAX_CHECK_INTERVAL)
        object.__setattr__(self, "check_interval", interval)
        path = self.checkpoint_path
        if path is not None and not (isinstance(path, (str, os.PathLike)) and os.fspath(path)):
            raise ConfigError(f"{owner}.checkpoint_path must be a path or None, got {path!r}")
        object.__setattr__(self, "checkpoint_path", None if path is None else os.fspath(path))

    @classmethod
    def from_value(cls, value: Union[None, bool, GracefulStopConfig, Mapping[str, Any]]
                   ) -> Optional[GracefulStopConfig]:
        """The config for a front end's ``graceful_stop`` argument: None or False (off), True
        (defaults), a :class:`GracefulStopConfig`, or a dict of its fields.

        Raises:
            ConfigError: Anything else, or invalid fields (the message names them).
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, GracefulStopConfig):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"signals", "check_interval", "checkpoint_path"})
            if unknown:
                raise ConfigError(f"graceful_stop: unknown key(s) {', '.join(map(str, unknown))}; valid keys "
                                  "are signals, check_interval, checkpoint_path")
            return cls(**dict(value))
        raise ConfigError(f"graceful_stop must be True, False, None, a GracefulStopConfig or a dict, got {value!r}")


class GracefulStop:
    """One run's graceful stop; see the module docstring.

    Args:
        config: The signals and the check interval.
        clock: ``time.monotonic`` (tests may pass another monotonic clock).
    """

    def __init__(self, config: GracefulStopConfig, clock: Any = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self.received: Optional[signal.Signals] = None
        """The first stop signal this process received (None: none)."""
        self.deliveries = 0
        """How many times a stop signal reached this process (a job-wide signal may come twice)."""
        self.steps = 0
        """Training steps ended in this run (counted by :meth:`step_ended`)."""
        self.checks = 0
        """Agreement checks (collectives) run so far."""
        self.stop_step: Optional[int] = None
        """The agreed stop step (a value of :attr:`steps`), the same on every rank; None before."""
        self.stop_signal: Optional[signal.Signals] = None
        """The signal the agreement saw (the largest number, when ranks got different ones)."""
        self.counted_step: Optional[int] = None
        """The stop step as the user counts it (Lightning's global step, the step a loop passes to
        ``on_training_step_start``), set by the front end at the stop; None: unknown."""
        self._next_check = 1  # the first check after the first step: the interval is then measured
        self._last_check_at = clock()
        self._last_check_step = 0
        self._pid = os.getpid()
        self._chain: dict[signal.Signals, Handler] = {}  # called after ours: what was there first
        self._replaced: dict[signal.Signals, Handler] = {}  # restored by uninstall
        _arm(self)  # children forked from now on survive the stop signals (module docstring)

    # ------------------------------------------------------------------ signals

    @property
    def installed(self) -> bool:
        """True while one of our handlers is the current one for a signal."""
        return any(signal.getsignal(sig) == self._handle for sig in self._replaced)

    def chain_to_current_handlers(self) -> None:
        """Make the handlers installed now the ones ours will call, whatever is installed later.

        For a front end that installs its handlers after a framework registered its own (Lightning
        does at the start of ``fit``): the user's handlers are called, the framework's are not.
        """
        for sig in self.config.signals:
            current = signal.getsignal(sig)
            if current != self._handle:
                self._chain[sig] = current

    def install(self) -> bool:
        """Install the handlers (again, where another handler took a signal over since).

        The first handler found for a signal is the one ours calls after recording the stop;
        the current one is what :meth:`uninstall` restores.

        Returns:
            False (and nothing is installed) off the main thread, where Python cannot set
            signal handlers.
        """
        if not in_main_thread():
            return False
        self._pid = os.getpid()
        _arm(self)  # again after an uninstall
        for sig in self.config.signals:
            current = signal.getsignal(sig)
            if current == self._handle:
                continue
            self._chain.setdefault(sig, current)
            self._replaced[sig] = current
            signal.signal(sig, self._handle)
        return True

    def uninstall(self, absorb: bool = False) -> None:
        """Restore what :meth:`install` replaced, for each signal still handled by us. A handler
        installed by someone else since stays. Main thread only (elsewhere nothing happens); safe
        to call more than once.

        Args:
            absorb: The run ended cleanly (or stopped gracefully): a signal that had its default
                action before install is absorbed instead, from now on (also when a framework put
                the default action back before this call: Lightning does at the end of ``fit``).
                After a failure the default actions come back, so the rank still ends at once.
        """
        _ARMED.discard(self)
        if not in_main_thread():
            return
        for sig, previous in self._replaced.items():
            current = signal.getsignal(sig)
            if absorb and self._chain.get(sig, previous) in _DEFAULT_ACTIONS and (
                    current == self._handle or current in _DEFAULT_ACTIONS):
                _absorb(sig)
            elif current == self._handle:
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._replaced = {}

    def _handle(self, signum: int, frame: Any) -> None:
        # Runs in the main thread between two bytecodes: record, call the previous handler, and
        # nothing else (no logging, no I/O: the interrupted code may hold their locks).
        sig = signal.Signals(signum)
        if os.getpid() != self._pid:  # a forked child (see the module docstring)
            self._in_child(sig, frame)
            return
        self.deliveries += 1
        if self.received is None:
            self.received = sig
        previous = self._chain.get(sig)
        if previous not in _DEFAULT_DISPOSITIONS and callable(previous):
            previous(signum, frame)

    def _protect_child(self) -> None:
        """In a child forked before :meth:`install`: the child handler for the stop signals that
        have their default action (a handler of the user's or a framework's stays)."""
        if os.getpid() == self._pid or not in_main_thread():
            return
        for sig in self.config.signals:
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, self._handle)

    def _in_child(self, sig: signal.Signals, frame: Any) -> None:
        # The default action would end a DataLoader worker in the middle of the rank's run (the
        # rank then fails instead of stopping gracefully): a default disposition is ignored here.
        # A user's own handler still runs, as it would have without ours.
        previous = self._chain.get(sig)
        if previous not in _DEFAULT_DISPOSITIONS and callable(previous):
            previous(int(sig), frame)

    # ------------------------------------------------------------------ agreement

    def step_ended(self, collectives: Collectives) -> bool:
        """A training step ended on this rank: True once every rank agreed to stop after it.

        A collective at the agreed check steps (every rank must call this after every training
        step, as it calls its other per-step hooks); between them it only counts.

        Returns:
            True from the stop step on (the same step on every rank).
        """
        self.steps += 1
        if self.steps < self._next_check:
            return False
        return self._check(collectives)

    def _check(self, collectives: Collectives) -> bool:
        if self.stop_step is not None:
            return True
        now = self._clock()
        steps = self.steps - self._last_check_step
        elapsed = now - self._last_check_at
        per_step = elapsed / steps if steps > 0 else 0.0
        proposal = MAX_INTERVAL_STEPS if per_step <= 0 else round(min(self.config.check_interval / per_step,
                                                                      MAX_INTERVAL_STEPS))
        proposal = min(max(proposal, 1), MAX_INTERVAL_STEPS)
        flag, negative_interval = collectives.all_max([float(self.received or 0), float(-proposal)])  # collective
        self.checks += 1
        self._last_check_at = now
        self._last_check_step = self.steps
        self._next_check = self.steps + max(1, int(-negative_interval))
        if flag > 0:
            self.stop_step = self.steps
            self.stop_signal = signal.Signals(int(flag))
            self._next_check = 0  # every later call reaches _check, which answers True at once
            return True
        return False

    @property
    def interval_steps(self) -> int:
        """Steps from the last check to the next one (as agreed)."""
        return self._next_check - self._last_check_step

    @property
    def named_step(self) -> Optional[int]:
        """The stop step to show a user: :attr:`counted_step` when the front end knows it, else
        :attr:`stop_step` (training steps of this run); None before the stop."""
        if self.stop_step is None:
            return None
        return self.counted_step if self.counted_step is not None else self.stop_step

    def describe_step(self) -> str:
        """``"training step 447 (step 194 of this run)"``, or ``"training step 194 of this run"``
        when the user's own step number is unknown; "" before the stop."""
        if self.stop_step is None:
            return ""
        if self.counted_step is None:
            return f"training step {self.stop_step} of this run"
        return f"training step {self.counted_step} (step {self.stop_step} of this run)"

    def describe_stop(self) -> str:
        """``"SIGUSR1 (received by this rank)"`` or ``"SIGTERM (received by another rank)"``."""
        name = self.stop_signal.name if self.stop_signal is not None else "a stop signal"
        whose = "this rank" if self.received is not None else "another rank"
        return f"{name} (received by {whose})"
