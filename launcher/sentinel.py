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

Processes that scrub their environment (``env -i``) or leave the user's reach (``setuid``
programs, ``systemd-run``, ``ssh``) cannot be found this way (docs/launcher.md says so).

Run: ``python -I -S sentinel.py --launcher-pid PID --token TOKEN --token-var NAME --run-dir DIR
--signals N,N,... [--keep-fd N]...`` (the launcher does it, see :class:`Sentinel`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

SCRIPT = os.path.abspath(__file__)
SWEEP_TIMEOUT = 5.0
BYE = b"bye\n"


# ---------------------------------------------------------------------------- the launcher's handle


class Sentinel:
    """The launcher's handle on its sentinel process.

    Args:
        run_dir: The launcher's run directory (removed by the sentinel if the launcher dies).
        token_var: Name of the environment variable that marks the run's processes.
        token: Its value for this run (the launcher's environment must carry it already).
        signals: The signals to witness.
        keep_fds: Inherited descriptors the sentinel holds until the run is cleaned up.
    """

    def __init__(self, run_dir: str, token_var: str, token: str, signals: Iterable[int],
                 keep_fds: Iterable[int] = ()) -> None:
        self._args = [
            sys.executable, "-I", "-S", SCRIPT, "--launcher-pid", str(os.getpid()), "--token", token,
            "--token-var", token_var, "--run-dir", run_dir,
            "--signals", ",".join(str(int(s)) for s in signals),
        ]
        self._keep_fds = tuple(keep_fds)
        for fd in self._keep_fds:
            self._args += ["--keep-fd", str(fd)]
        self._signals = tuple(int(s) for s in signals)
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._reports: list[tuple[int, int, int, float]] = []  # (signo, sender, si_code, when)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the sentinel with the witnessed signals blocked from its first instruction."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals)
        try:
            self._process = subprocess.Popen(
                self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=self._keep_fds,
                start_new_session=True,  # where the workers are: not in the launcher's group
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        assert self._process.stdout is not None
        os.set_blocking(self._process.stdout.fileno(), False)

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
            self._read_reports()
            for index, (signo, _sender, _code, when) in enumerate(self._reports):
                if signo == sig and received_at - window <= when <= deadline:
                    del self._reports[index]
                    return True
            pending_seen = pending_seen or self._pending(sig)
            now = time.monotonic()
            if now >= deadline:
                return pending_seen
            with selectors.DefaultSelector() as selector:
                assert self._process.stdout is not None
                selector.register(self._process.stdout, selectors.EVENT_READ)
                selector.select(min(deadline - now, 0.05))

    def finish(self, timeout: float = SWEEP_TIMEOUT + 2.0) -> None:
        """Tell the sentinel the launcher is done (it sweeps once more and exits) and wait."""
        if self._process is None:
            return
        assert self._process.stdin is not None
        with contextlib.suppress(OSError, ValueError):  # ValueError: closed already
            self._process.stdin.write(BYE)
            self._process.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            self._process.stdin.close()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def _read_reports(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        with contextlib.suppress(BlockingIOError, OSError):
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
