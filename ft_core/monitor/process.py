"""Starting rank monitors as processes, and the handle the launcher keeps for each.

:class:`MonitorProcess` starts ``python -m ft_core.monitor.cli`` (a fresh interpreter that
imports nothing heavy) and waits, through a pipe, until it listens. It offers the
``multiprocessing.Process`` interface (``pid``, ``is_alive``, ``join``, ``terminate``, ``kill``,
``exitcode``), as does the ``multiprocessing`` shim
:func:`ft_core.monitor.server.start_with_multiprocessing`. Both are reached through
:meth:`RankMonitorServer.run_in_subprocess`; the launcher uses :class:`MonitorProcess` directly
to start several monitors at once. This module does not import the server: the server starts
through it.

A monitor process receives ``cfg.sent_to(Role.MONITOR)``: the fields it uses and those it hands
to its rank, never the launcher's own (``restart_policy``).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys

from ft_core.wire.config import FaultToleranceConfig, Role

CLI_MODULE = "ft_core.monitor.cli"
MONITOR_READY_TIMEOUT = 30.0
"""Seconds a started monitor has to listen on its socket (``RankMonitorServer.RANK_MONITOR_INIT_TIMEOUT``)."""


class MonitorProcess:
    """A monitor running as ``python -m ft_core.monitor.cli``, with the ``Process`` interface."""

    def __init__(self, popen: subprocess.Popen[bytes], socket_path: str) -> None:
        self._popen = popen
        self.socket_path = socket_path
        self._ready_fd: int | None = None

    @classmethod
    def start(
        cls, cfg: FaultToleranceConfig, socket_path: str, is_restarter_logger: bool = False,
        extra_args: list[str] | None = None,
    ) -> MonitorProcess:
        """Start a monitor and wait until it listens (see ``run_in_subprocess``)."""
        handle = cls.spawn(cfg, socket_path, is_restarter_logger, extra_args)
        handle.wait_ready(MONITOR_READY_TIMEOUT)
        return handle

    @classmethod
    def spawn(
        cls, cfg: FaultToleranceConfig, socket_path: str, is_restarter_logger: bool = False,
        extra_args: list[str] | None = None,
    ) -> MonitorProcess:
        """Start a monitor process without waiting; call :meth:`wait_ready` before using it.

        Starting several monitors with ``spawn`` and then waiting for each overlaps their
        interpreter start-up.

        Args:
            cfg: Configuration; the process receives ``cfg.sent_to(Role.MONITOR)``.
            socket_path: Where the monitor listens.
            is_restarter_logger: See :class:`RankMonitorServer`.
            extra_args: More ``ft_core.monitor.cli`` options (``--name``, ``--cleanup-dir``).
        """
        read_fd, write_fd = os.pipe()
        args = [
            sys.executable, "-m", CLI_MODULE,
            "--socket", socket_path,
            "--config-json", json.dumps(cfg.sent_to(Role.MONITOR)),
            "--parent-pid", str(os.getpid()),
            "--ready-fd", str(write_fd),
        ]
        if is_restarter_logger:
            args.append("--restarter-logger")
        args += extra_args or []
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            popen = subprocess.Popen(
                args, env=env, pass_fds=(write_fd,), stdin=subprocess.DEVNULL,
                start_new_session=True,  # terminal Ctrl-C goes to the launcher, which stops us
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        handle = cls(popen, socket_path)
        handle._ready_fd = read_fd
        return handle

    def wait_ready(self, timeout: float) -> None:
        """Block until the monitor listens.

        Raises:
            RuntimeError: It exited or did not get ready in time (it is then killed).
        """
        read_fd, self._ready_fd = self._ready_fd, None
        if read_fd is None:
            return
        try:
            self._wait_ready(read_fd, timeout)
        except BaseException:
            self.kill()
            self.join(5)
            raise
        finally:
            os.close(read_fd)

    def _wait_ready(self, read_fd: int, timeout: float) -> None:
        selector = selectors.DefaultSelector()
        selector.register(read_fd, selectors.EVENT_READ)
        try:
            if not selector.select(timeout):
                raise RuntimeError(
                    f"rank monitor for {self.socket_path} did not start within {timeout:.0f} s"
                )
        finally:
            selector.close()
        if os.read(read_fd, 64) != b"ready\n":
            code = self._popen.wait(timeout=5)
            raise RuntimeError(
                f"rank monitor for {self.socket_path} failed to start (exit code {code}); "
                "its error is logged above"
            )

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """Exit code, negative signal number if killed by a signal, None while running."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=timeout)

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._popen.terminate()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._popen.kill()
