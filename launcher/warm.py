"""Warm restarts: the launcher's handle on the node's warm template (see :mod:`launcher.zygote`).

With warm restarts on (the default for Python entry points), every worker is started through
:mod:`launcher.trampoline`, which has the template fork the real worker with torch already
imported; a restart then costs a fork instead of an interpreter start and ``import torch``.

The template's own imports take seconds of CPU. Started together with a cycle's workers, it would
compete with their imports on a small machine (measured on 2 cores: first step 4 s later), so the
agent starts it only once the cycle's workers are up (all connected to their monitors) or
:data:`START_DELAY` seconds after they started, whichever comes first. Until it is ready, and
whenever it is gone, trampolines fall back to the plain cold start. A template that dies is
replaced the same way in the next cycle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import subprocess
import sys

logger = logging.getLogger(__name__)

LAUNCHER_DIR = os.path.dirname(os.path.abspath(__file__))
TRAMPOLINE = os.path.join(LAUNCHER_DIR, "trampoline.py")
ZYGOTE = os.path.join(LAUNCHER_DIR, "zygote.py")
ZYGOTE_SOCKET_ENV = "FT_WARM_TEMPLATE_SOCKET"
STOP_TIMEOUT = 5.0
START_DELAY = 20.0
"""Start the template at the latest this long after a cycle's workers started."""


def warm_start_delay() -> float:
    """:data:`START_DELAY`, or ``FT_LAUNCHER_WARM_START_DELAY`` seconds when set."""
    try:
        return float(os.environ.get("FT_LAUNCHER_WARM_START_DELAY", START_DELAY))
    except ValueError:
        return START_DELAY


def warm_entrypoint(entrypoint: object, args: tuple) -> tuple[str, tuple] | None:
    """The trampoline command replacing a ``python -u ...`` worker command, or None.

    Only a worker started with this launcher's own interpreter can be forked from the template
    (``--no-python``, ``--run-path`` and ``PYTHON_EXEC`` pointing elsewhere start cold).
    """
    if entrypoint != sys.executable or not args or args[0] != "-u":
        return None
    return sys.executable, ("-I", "-S", TRAMPOLINE, *args)


class WarmTemplate:
    """Starts, watches and stops the template process.

    Args:
        socket_path: Where the template listens (inside the launcher's private run directory).
        preload: Modules the template imports before it serves.
    """

    def __init__(self, socket_path: str, preload: list[str]) -> None:
        self.socket_path = socket_path
        self.preload = preload
        self._process: subprocess.Popen[bytes] | None = None
        self._ready_fd: int | None = None
        self.status: dict | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the template; it becomes usable once its imports are done."""
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env.pop(ZYGOTE_SOCKET_ENV, None)
        try:
            self._process = subprocess.Popen(
                [sys.executable, ZYGOTE, "--socket", self.socket_path, "--parent-pid", str(os.getpid()),
                 "--preload", ",".join(self.preload), "--ready-fd", str(write_fd)],
                env=env, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            os.close(write_fd)
        self._ready_fd = read_fd
        self.status = None

    def poll_ready(self, timeout: float = 0.0) -> dict | None:
        """The template's ready report (failed preloads, CUDA state) once it is ready."""
        if self.status is None and self._ready_fd is not None:
            with selectors.DefaultSelector() as sel:
                sel.register(self._ready_fd, selectors.EVENT_READ)
                if sel.select(timeout):
                    data = os.read(self._ready_fd, 65536)
                    os.close(self._ready_fd)
                    self._ready_fd = None
                    if data:
                        self.status = json.loads(data)
                        for failure in self.status.get("failed_preloads", []):
                            logger.warning("warm template could not preload %s", failure)
        return self.status

    @property
    def started(self) -> bool:
        return self._process is not None

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def forget_if_dead(self) -> int | None:
        """Drop a template that exited, so that it is started again; return its exit code."""
        if self._process is None or self.alive():
            return None
        code = self._process.returncode
        logger.warning("the warm template exited (code %s); workers start cold until a new one is ready", code)
        self._close_ready_fd()
        self._process = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        return code

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(STOP_TIMEOUT)
        self._close_ready_fd()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _close_ready_fd(self) -> None:
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None
