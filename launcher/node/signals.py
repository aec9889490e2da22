"""Signals received by ``ft_launcher``: what it does with each, and how often the workers see it.

docs/launcher.md ("Signals") has the table for every signal and every way it can arrive. In short:

- SIGTERM, SIGINT, SIGHUP, SIGQUIT (:data:`STOP_SIGNALS`) stop the run: the first (by arrival,
  even when Python runs a later one's handler first: it runs pending handlers in signal-number
  order; two that reach the process while none of its threads runs are pending together in the
  kernel, which keeps no order for them) raises torch's ``SignalException`` in the main thread,
  the agent stops the workers (SIGKILL after ``--term-timeout``), the launcher cleans up and exits
  0 if every worker exited 0 within the timeout, else 1. A second one while stopping is logged and
  changes nothing; a third forces the stop at once (SIGKILL to every process of the run, run
  directory removed, result recorded, exit 128+N). A watchdog forces it too if the stop takes
  longer than ``--term-timeout`` + 30 s.
- Every other signal of :data:`ft_core.wire.osutil.STEP_SIGNALS` (:data:`RELAYED_SIGNALS`: SIGUSR1,
  SIGUSR2, SIGALRM, ...) is for the workers; the launcher keeps running.

Each worker must see each signal once. SLURM's step daemon signals every process of a step
itself (``scancel -s``, ``--signal`` without ``B:``, the time limit); a terminal, ``kill PID`` or
``scripts/autoresume.sh`` signal the launcher alone. The launcher tells the two apart through its
sentinel (:mod:`launcher.node.sentinel`), a process that sits where the workers sit: if the sentinel
got the signal too (within :data:`JOB_WIDE_WINDOW`), so did the workers, and the launcher passes
nothing on; otherwise it sends the signal to each worker's process group itself (for a stop
signal, as the first step of stopping them). Signals for workers that are not there to take them
(a restart in progress) are queued (:class:`launcher.node.processes.WorkerProcesses`).

The process group, not the worker's main process alone, on purpose (graceful-stop signals
included): a job-wide signal reaches every process of a worker anyway, so both deliveries hit the
same processes, and a rank behind a wrapper (a shell script that starts python) gets it too. A
rank's children must survive a stop signal in either case; the graceful stop's handler sees to
its forked children (DataLoader workers, :mod:`ft_core.client.graceful_stop`).

Mechanics: Python handlers (``SIG_DFL`` would end the launcher) plus ``signal.set_wakeup_fd``,
whose bytes wake a dispatcher thread even while the main thread is stuck in C code (inside a
rendezvous, say). The dispatcher decides, counts stop signals, relays, and forces the stop when
needed. The launcher itself never blocks signals: a blocked mask would be inherited by every
process it starts, torch's workers included. Its helpers are started with the step signals
blocked instead (:func:`ft_core.wire.osutil.signals_blocked`) and never die of one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.api import SignalException

from ft_core.wire.osutil import STEP_SIGNALS

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
RELAYED_SIGNALS = tuple(sig for sig in STEP_SIGNALS if sig not in STOP_SIGNALS)
JOB_WIDE_WINDOW = 0.5
"""Seconds within which the sentinel must have got a signal too for it to count as sent to the
whole job: a step daemon signals the processes of a step one after the other. A signal for the
launcher alone reaches the workers this much later."""
FORCE_AFTER = 3
"""The stop signal that forces the stop (like torchrun: the third)."""
ARRIVAL_WAIT = JOB_WIDE_WINDOW + 1.0
"""Seconds the main thread's stop handler waits for the dispatcher to learn which stop signal
arrived first (it reads the wakeup bytes at once, unless it is still deciding on a relayed signal:
up to :data:`JOB_WIDE_WINDOW`)."""


class SignalHandling:
    """Installs the launcher's handlers and runs the dispatcher thread; see the module docstring.

    Args:
        route: Called (on the dispatcher thread) with a relayed signal, whether the workers
            got it themselves and when it was received (``time.monotonic()``); passes it on or
            queues it (the agent's ``forward_signal``). The decision may take up to
            :data:`JOB_WIDE_WINDOW`, time enough for a restart to start new workers: the time
            tells them from the workers that were there when the signal came.
        force: Called on the dispatcher thread to force the stop (third stop signal, or the
            graceful stop not finished within ``grace_seconds``); must not return.
        job_wide: ``job_wide(sig, received_at)``: whether the workers got ``sig`` themselves
            (the sentinel's :meth:`~launcher.node.sentinel.Sentinel.saw`); may wait up to
            :data:`JOB_WIDE_WINDOW`.
        grace_seconds: Time the graceful stop may take.
    """

    def __init__(self, *, route: Callable[[signal.Signals, bool, float], None],
                 force: Callable[[signal.Signals], None],
                 job_wide: Callable[[signal.Signals, float], bool], grace_seconds: float) -> None:
        self._route = route
        self._force = force
        self._job_wide = job_wide
        self._grace = grace_seconds
        self._may_raise = True
        self._raised = False
        self._stop: tuple[signal.Signals, bool] | None = None
        self._stop_decided = threading.Event()
        self._first_arrived: signal.Signals | None = None  # the first stop signal, by arrival
        self._stop_arrived = threading.Event()
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(True)
        self._wsock.setblocking(False)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._dispatch, name="ft-signals", daemon=True)

    def install(self) -> None:
        """Install the handlers (main thread only) and start the dispatcher."""
        signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        self.reinstall()
        self._thread.start()

    def reinstall(self) -> None:
        """Re-assert our handlers (torch installs its own whenever it starts workers)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_stop)
        for sig in RELAYED_SIGNALS:
            signal.signal(sig, self._on_relayed)

    def begin_cleanup(self) -> None:
        """From now on a stop signal no longer raises: the clean-up must run to its end. A
        third stop signal still forces it (the dispatcher does that)."""
        self._may_raise = False

    @property
    def first_stop(self) -> signal.Signals | None:
        """The first stop signal that arrived, as soon as it arrived (None before one); unlike
        :attr:`stop_signal`, known before the job-wide decision."""
        return self._first_arrived

    @property
    def stop_signal(self) -> signal.Signals | None:
        """The first stop signal received (None before one arrived)."""
        return self._stop[0] if self._stop is not None else None

    def stop_delivered(self, sig: signal.Signals) -> bool:
        """True if the launcher is stopping because of ``sig`` and the workers got it themselves
        (sent to the whole job): the stop then only waits for them, it does not send it again."""
        if not self._raised and self._stop is None:
            return False
        self._stop_decided.wait(JOB_WIDE_WINDOW + 5.0)
        return self._stop is not None and self._stop[0] == sig and self._stop[1]

    def close(self) -> None:
        """Stop the dispatcher; signals arriving from now on are ignored (the launcher exits)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wsock.send(b"\0")
        if self._thread.is_alive():
            self._thread.join(JOB_WIDE_WINDOW + 2)
        for sig in STOP_SIGNALS + RELAYED_SIGNALS:
            with contextlib.suppress(ValueError):
                signal.signal(sig, signal.SIG_IGN)
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        self._rsock.close()
        self._wsock.close()

    # ------------------------------------------------------------------ main thread

    def _on_stop(self, signum: int, _frame: object) -> None:
        # Python runs the handlers of signals pending together in signal-number order (SIGINT
        # before SIGTERM, whichever came first), so ``signum`` need not be the first stop signal.
        # The wakeup fd has the bytes in arrival order: the stop is the dispatcher's first one,
        # the one it logs, decides job-wide for, and stop_delivered() answers about.
        if self._may_raise and not self._raised:
            self._raised = True
            sig = signal.Signals(signum)
            if self._stop_arrived.wait(ARRIVAL_WAIT) and self._first_arrived is not None:
                sig = self._first_arrived
            raise SignalException(f"Process {os.getpid()} got signal: {int(sig)}", sigval=sig)

    def _on_relayed(self, signum: int, _frame: object) -> None:
        """Nothing here: the dispatcher thread acts (it learns of the signal through the wakeup fd)."""

    # ------------------------------------------------------------------ dispatcher thread

    def _dispatch(self) -> None:
        stops = 0
        force_at: float | None = None
        while not self._closed.is_set():
            timeout = None if force_at is None else max(0.0, force_at - time.monotonic())
            self._rsock.settimeout(timeout)
            try:
                data = self._rsock.recv(64)
            except TimeoutError:
                if not self._closed.is_set() and self._stop is not None:
                    logger.error("the stop did not finish within %.0f s; forcing it", self._grace)
                    self._force(self._stop[0])
                return
            except OSError:
                return
            received_at = time.monotonic()
            arrived = [sig for sig in map(_signal_or_none, data) if sig is not None]
            if self._first_arrived is None:
                # Before deciding anything (which may take JOB_WIDE_WINDOW): the main thread's
                # handler waits for this to name the stop (see _on_stop).
                self._first_arrived = next((sig for sig in arrived if sig in STOP_SIGNALS), None)
                if self._first_arrived is not None:
                    self._stop_arrived.set()
            for sig in arrived:
                if self._closed.is_set():
                    return
                if sig in STOP_SIGNALS:
                    stops += 1
                    if stops == 1:
                        self._first_stop(sig, received_at)
                        force_at = received_at + self._grace
                    elif stops < FORCE_AFTER:
                        logger.warning("received %s again while stopping; the stop goes on "
                                       "(a third stop signal forces it)", sig.name)
                    else:
                        logger.error("received %s a third time: forcing the stop", sig.name)
                        self._force(sig)
                        return
                elif sig in RELAYED_SIGNALS:
                    self._relay(sig, received_at)

    def _first_stop(self, sig: signal.Signals, received_at: float) -> None:
        job_wide = self._decide(sig, received_at)
        self._stop = (sig, job_wide)
        self._stop_decided.set()
        logger.warning("received %s (%s): stopping the workers, then the monitors", sig.name,
                       "sent to the whole job: the workers have it" if job_wide
                       else "sent to the launcher: passing it to the workers")

    def _relay(self, sig: signal.Signals, received_at: float) -> None:
        job_wide = self._decide(sig, received_at)
        logger.info("received %s (%s)", sig.name, "sent to the whole job: the workers have it"
                    if job_wide else "sent to the launcher: passing it to the workers")
        try:
            self._route(sig, job_wide, received_at)
        except Exception:  # the dispatcher must survive anything the agent raises
            logger.exception("could not pass %s on to the workers", sig.name)

    def _decide(self, sig: signal.Signals, received_at: float) -> bool:
        try:
            return self._job_wide(sig, received_at)
        except Exception:  # without the sentinel's word, treat it as ours alone
            logger.exception("cannot tell whether %s was sent to the whole job", sig.name)
            return False


def _signal_or_none(value: int) -> signal.Signals | None:
    """The signal a wakeup byte names (None: not a signal number)."""
    try:
        return signal.Signals(value)
    except ValueError:
        return None
