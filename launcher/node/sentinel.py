"""The launcher's sentinel: tells job-wide signals apart and cleans up after a launcher that died.

A small standard-library process the launcher starts first, in a session of its own (like the
workers) and with every signal of :data:`ft_core.wire.osutil.STEP_SIGNALS` blocked from birth. It has
three jobs:

1. **Witness of job-wide signals.** SLURM's step daemon signals every process of a step; a
   terminal, ``kill PID`` or ``scripts/autoresume.sh`` signal only the launcher. The sentinel
   sits where the workers sit (a descendant of the launcher, in its own session), so it is
   signalled exactly when they are. It takes each signal with ``sigwaitinfo`` and reports it to
   the launcher (one line on its stdout: number, sender pid, ``si_code``, monotonic time). When
   the launcher receives a signal it asks :meth:`Sentinel.saw`: seen by the sentinel too (a
   report, or the signal still pending in its ``/proc`` status) means the workers have it
   already, and the launcher must not pass it on a second time.
2. **Last line of clean-up.** The launcher sets a run token in its environment
   (:data:`ft_core.wire.env.FT_LAUNCHER_RUN_ENV_VAR`) before it starts anything, so every process of
   the run inherits it: monitors, warm template, trampolines, workers, and whatever the workers
   start, even in a new session or double-forked. When the launcher is gone (its end of the
   sentinel's stdin closes, even after SIGKILL), the sentinel SIGKILLs every process that carries
   the token (through a pidfd, after checking the token again: never a reused pid) and removes
   the launcher's run directory.
3. **Lock holder.** File descriptors passed to it (``--keep-fd``: ``scripts/autoresume.sh``'s
   run-directory lock) stay open until that clean-up is done, so a second loop cannot take the
   run directory while anything of the first run lives.

If the sentinel dies before the launcher is done, the launcher notices (the sentinel is its
child: :class:`Sentinel` watches its pidfd) and starts another one.

Processes that scrub their environment (``env -i``) or leave the user's reach (``setuid``
programs, ``systemd-run``, ``ssh``) cannot be found this way (docs/launcher.md says so).

Run: ``python -I -S sentinel.py --launcher-pid PID --token TOKEN --token-var NAME --run-dir DIR
--signals N,N,... [--keep-fd N]...`` (the launcher does it, see :class:`Sentinel`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

SCRIPT = os.path.abspath(__file__)
SWEEP_TIMEOUT = 5.0
BYE = b"bye\n"
RESTART_INTERVAL = 1.0
"""Seconds between two starts of the sentinel at least (when it dies, it is started again)."""

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the launcher's handle


class Sentinel:
    """The launcher's handle on its sentinel process, which it starts again when it dies.

    A sentinel that dies before the launcher is done (SIGKILLed by a user or the OOM killer)
    would take its duties with it: job-wide signals would look like the launcher's own (and
    reach each worker twice), and a later SIGKILL of the launcher would leave the workers'
    double-forked daemons running. A watcher thread waits on the sentinel's pidfd and starts a
    new one at once (at most one per :data:`RESTART_INTERVAL`), with the same arguments; it
    tells ``on_start`` each new pid (the launcher keeps its leftover clean-up off it).

    Args:
        run_dir: The launcher's run directory (removed by the sentinel if the launcher dies).
        token_var: Name of the environment variable that marks the run's processes.
        token: Its value for this run (the launcher's environment must carry it already).
        signals: The signals to witness.
        keep_fds: Inherited descriptors the sentinel holds until the run is cleaned up.
        on_start: Called with the pid of each sentinel started (the first one included).
    """

    def __init__(self, run_dir: str, token_var: str, token: str, signals: Iterable[int],
                 keep_fds: Iterable[int] = (), on_start: Callable[[int], None] | None = None) -> None:
        self._args = [
            sys.executable, "-I", "-S", SCRIPT, "--launcher-pid", str(os.getpid()), "--token", token,
            "--token-var", token_var, "--run-dir", run_dir,
            "--signals", ",".join(str(int(s)) for s in signals),
        ]
        self._keep_fds = tuple(keep_fds)
        for fd in self._keep_fds:
            self._args += ["--keep-fd", str(fd)]
        self._signals = tuple(int(s) for s in signals)
        self._on_start = on_start
        self._lock = threading.RLock()  # the process and its reports: the watcher replaces them
        self._process: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._started_at = 0.0
        self._finishing = False
        self._wake_r, self._wake_w = -1, -1
        self._watcher: threading.Thread | None = None
        self._buffer = b""
        self._reports: list[tuple[int, int, int, float]] = []  # (signo, sender, si_code, when)

    @property
    def pid(self) -> int | None:
        """The current sentinel's pid (a new one after a restart)."""
        process = self._process
        return process.pid if process is not None else None

    def start(self) -> None:
        """Start the sentinel with the witnessed signals blocked from its first instruction, and
        the watcher that starts it again if it dies."""
        with self._lock:
            self._spawn()
        self._wake_r, self._wake_w = os.pipe()
        self._watcher = threading.Thread(target=self._watch, name="ft-sentinel-watch", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        """Start a sentinel process (the caller holds ``_lock``)."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals)
        try:
            process = subprocess.Popen(
                self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=self._keep_fds,
                start_new_session=True,  # where the workers are: not in the launcher's group
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        self._process, self._buffer, self._started_at = process, b"", time.monotonic()
        try:
            self._pidfd = os.pidfd_open(process.pid)
        except OSError:  # no pidfds (Linux < 5.3): its death goes unnoticed, as before
            self._pidfd = None
        if self._on_start is not None:
            self._on_start(process.pid)

    def _watch(self) -> None:
        """Watcher thread: start a new sentinel whenever the current one dies, until :meth:`finish`."""
        while True:
            pidfd = self._pidfd
            if pidfd is None:
                return
            with selectors.DefaultSelector() as selector:
                selector.register(pidfd, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                ready = {key.fd for key, _ in selector.select()}
            if self._wake_r in ready or self._finishing:
                return
            # Do not spin if sentinels die as soon as they start.
            wait = RESTART_INTERVAL - (time.monotonic() - self._started_at)
            if wait > 0 and select.select([self._wake_r], [], [], wait)[0]:
                return
            with self._lock:
                if self._finishing:
                    return
                self._replace()

    def _replace(self) -> None:
        """The sentinel died: keep its last reports, start another (the caller holds ``_lock``)."""
        process = self._process
        assert process is not None
        status = process.wait()  # it has exited (its pidfd is readable): reaps at once
        self._read_reports()
        if process.stdout is not None:
            process.stdout.close()
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit code {status}"
        try:
            self._spawn()
        except OSError:
            logger.exception("the sentinel (pid %s) died (%s) and cannot be started again: job-wide signals "
                             "count as the launcher's own and a SIGKILL of the launcher leaves its run behind",
                             process.pid, how)
            return
        logger.warning("the sentinel (pid %s) died (%s); started a new one (pid %s)", process.pid, how,
                       self.pid)

    def saw(self, sig: int, received_at: float, window: float) -> bool:
        """Whether the sentinel got ``sig`` too, around ``received_at`` (monotonic seconds).

        Waits until ``received_at + window`` at most: a step daemon signals the processes of a
        step one after the other. A report from within ``window`` before ``received_at`` counts
        too (the sentinel may have been signalled first). A matching report is used up.
        Called from one thread only.
        """
        if self._process is None:
            return False
        deadline = received_at + window
        pending_seen = False
        while True:
            with self._lock:
                self._read_reports()
                for index, (signo, _sender, _code, when) in enumerate(self._reports):
                    if signo == sig and received_at - window <= when <= deadline:
                        del self._reports[index]
                        return True
                pending_seen = pending_seen or self._pending(sig)
                stdout = self._process.stdout
            now = time.monotonic()
            if now >= deadline:
                return pending_seen
            # The watcher may close this pipe meanwhile (a new sentinel): then just look again.
            with contextlib.suppress(OSError, ValueError), selectors.DefaultSelector() as selector:
                assert stdout is not None
                selector.register(stdout, selectors.EVENT_READ)
                selector.select(min(deadline - now, 0.05))

    def finish(self, timeout: float = SWEEP_TIMEOUT + 2.0) -> None:
        """Tell the sentinel the launcher is done (it sweeps once more and exits) and wait."""
        with self._lock:
            self._finishing = True  # no new sentinel from here on
            process = self._process
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        if self._watcher is not None:
            self._watcher.join(timeout)
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(OSError, ValueError):  # ValueError: closed already
            process.stdin.write(BYE)
            process.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            process.stdin.close()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
        if process.stdout is not None:
            process.stdout.close()
        for fd in (self._pidfd, self._wake_r, self._wake_w):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pidfd, self._wake_r, self._wake_w = None, -1, -1

    def _read_reports(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        with contextlib.suppress(BlockingIOError, OSError, ValueError):
            while chunk := os.read(self._process.stdout.fileno(), 4096):
                self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        now = time.monotonic()
        for line in lines:
            with contextlib.suppress(ValueError):
                signo, sender, code, when = line.split()
                self._reports.append((int(signo), int(sender), int(code), float(when)))
        # Reports nobody asked about (a signal sent to the sentinel alone) expire.
        self._reports = [r for r in self._reports if now - r[3] < 60.0]

    def _pending(self, sig: int) -> bool:
        """``sig`` is pending in the sentinel (delivered, not yet taken by its thread)."""
        assert self._process is not None
        try:
            with open(f"/proc/{self._process.pid}/status", encoding="ascii") as stream:
                for line in stream:
                    if line.startswith("ShdPnd:"):
                        return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
        except (OSError, ValueError):
            pass
        return False


# ---------------------------------------------------------------------------- the process


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            return needle in stream.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def sweep(needle: bytes, timeout: float = SWEEP_TIMEOUT) -> list[int]:
    """SIGKILL every process (but this one) whose environment holds ``needle``; repeat until
    none is left (a process may fork while we look) or ``timeout`` passed. Returns the pids."""
    me = os.getpid()
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        found = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me and _carries(int(e), needle)]
        if not found or time.monotonic() > deadline:
            return killed
        for pid in found:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                # The pidfd pins this process: checked again, the kill cannot hit a reused pid.
                if _carries(pid, needle):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    killed.append(pid)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        time.sleep(0.02)


def _report_signals(signals: set[int]) -> None:
    while True:
        info = signal.sigwaitinfo(signals)
        line = f"{info.si_signo} {info.si_pid} {info.si_code} {time.monotonic():.6f}\n".encode()
        with contextlib.suppress(OSError):
            os.write(1, line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ft_launcher's sentinel (internal)")
    parser.add_argument("--launcher-pid", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--token-var", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--signals", required=True)
    parser.add_argument("--keep-fd", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    signals = {int(s) for s in args.signals.split(",") if s}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # already blocked by the launcher; for tests
    threading.Thread(target=_report_signals, args=(signals,), name="ft-sentinel-signals", daemon=True).start()
    said_bye = False
    data = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        data = (data + chunk)[-len(BYE):]
        said_bye = data == BYE
    killed = sweep(f"{args.token_var}={args.token}".encode())
    if killed or not said_bye:
        what = "finished" if said_bye else "exited without cleaning up"
        print(f"[ft_launcher sentinel] launcher pid {args.launcher_pid} {what}; killed {len(killed)} "
              f"process(es) of its run: {sorted(killed)}", file=sys.stderr, flush=True)
    shutil.rmtree(args.run_dir, ignore_errors=True)
    return 0  # the kept descriptors close with the process, after the sweep


if __name__ == "__main__":
    os._exit(main())  # not sys.exit: the reporting thread waits in sigwaitinfo for good


class HelperPids:
    """The current pids of one run's launcher helpers that are started again when they die (the
    sentinel), by name; iterating gives the pids of now.

    The run owns it and hands it to whoever kills leftovers (as ``keep_alone`` of
    :func:`launcher.node.processes.kill_leftovers`), so that a helper started again is spared too, also by callers that
    were told the first pid only. Thread-safe: the sentinel's watcher thread sets a pid.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids: dict[str, int] = {}

    def set(self, name: str, pid: int) -> None:
        """``pid`` is now the helper ``name``'s (it replaces the one before)."""
        with self._lock:
            self._pids[name] = pid

    def pids(self) -> set[int]:
        """The helpers' current pids."""
        with self._lock:
            return set(self._pids.values())

    def __iter__(self) -> Iterator[int]:
        return iter(self.pids())

    def __len__(self) -> int:
        return len(self.pids())

    def __contains__(self, pid: object) -> bool:
        return pid in self.pids()
