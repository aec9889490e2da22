"""Signals received by ``ft_launcher``.

- SIGTERM, SIGINT, SIGHUP, SIGQUIT stop the run gracefully: the handler raises torch's
  ``SignalException`` in the main thread; the agent then stops the workers (the same signal,
  then SIGKILL after ``--term-timeout``), the launcher stops the monitors and exits 128+N.
- SIGUSR1 and SIGUSR2 are forwarded to every worker's process group (SLURM sends them as a
  walltime or preemption warning); the launcher itself keeps running.

A watchdog thread, woken through ``signal.set_wakeup_fd`` even while the main thread is stuck
in C code (e.g. inside a rendezvous), ends the process if the graceful path has not finished
within the grace period: workers get SIGKILL, monitors are killed, the run directory removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.api import SignalException

logger = logging.getLogger(__name__)

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class SignalHandling:
    """Installs the launcher's handlers; see the module docstring.

    Args:
        forward: Called with SIGUSR1/SIGUSR2 to pass them to the workers.
        emergency_stop: Called on the watchdog thread if a termination signal was not handled
            within ``grace_seconds``; must not return (it exits the process).
        grace_seconds: Time the graceful stop may take.
    """

    def __init__(self, forward: Callable[[signal.Signals], None],
                 emergency_stop: Callable[[signal.Signals], None], grace_seconds: float) -> None:
        self._forward = forward
        self._emergency_stop = emergency_stop
        self._grace = grace_seconds
        self.received: signal.Signals | None = None
        self._rsock, self._wsock = socket.socketpair()
        self._rsock.setblocking(True)
        self._wsock.setblocking(False)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ft-signal-watchdog", daemon=True)

    def install(self) -> None:
        """Install handlers (main thread only) and start the watchdog."""
        signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        self.reinstall()
        self._thread.start()

    def reinstall(self) -> None:
        """Re-assert our handlers (torch installs its own whenever it starts workers)."""
        for sig in TERMINATION_SIGNALS:
            signal.signal(sig, self._on_termination)
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self._on_forwarded)

    def close(self) -> None:
        """Stop the watchdog and restore default handlers."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wsock.send(b"\0")
        self._thread.join(2)
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        for sig in TERMINATION_SIGNALS + FORWARDED_SIGNALS:
            with contextlib.suppress(ValueError):
                signal.signal(sig, signal.SIG_DFL)
        self._rsock.close()
        self._wsock.close()

    def _on_termination(self, signum: int, _frame: object) -> None:
        sig = signal.Signals(signum)
        if self.received is None:
            self.received = sig
            logger.warning("received %s: stopping workers, then monitors", sig.name)
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=sig)

    def _on_forwarded(self, signum: int, _frame: object) -> None:
        sig = signal.Signals(signum)
        logger.info("received %s: forwarding it to the workers", sig.name)
        self._forward(sig)

    def _watch(self) -> None:
        termination_seen: signal.Signals | None = None
        while not self._closed.is_set():
            timeout = self._grace if termination_seen is not None else None
            self._rsock.settimeout(timeout)
            try:
                data = self._rsock.recv(64)
            except TimeoutError:
                if not self._closed.is_set() and termination_seen is not None:
                    logger.error("graceful stop did not finish within %.0f s; forcing it", self._grace)
                    self._emergency_stop(termination_seen)
                return
            except OSError:
                return
            for value in data:
                with contextlib.suppress(ValueError):
                    sig = signal.Signals(value)
                    if sig in TERMINATION_SIGNALS and termination_seen is None:
                        termination_seen = sig
