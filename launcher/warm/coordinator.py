"""Warm restarts: the launcher's handle on the node's warm template (see :mod:`launcher.warm.zygote`).

With warm restarts on (the default for Python entry points), every worker is started through
:mod:`launcher.warm.trampoline`, which has the template fork the real worker with torch already
imported; a restart then costs a fork instead of an interpreter start and ``import torch``.

The template's own imports take seconds of CPU. Started together with a cycle's workers, it would
compete with their imports on a small machine (measured on 2 cores: first step 4 s later), so
:class:`WarmCoordinator` starts it only once the cycle's workers are up (all connected to their
monitors) or :data:`START_DELAY` seconds after they started, whichever comes first. Until it is
ready, and whenever it is gone, trampolines fall back to the plain cold start. A template that
dies is replaced the same way in the next cycle.

A node that waits in a rendezvous with no template yet (a spare waiting for a place, or a node
early for the job) has idle CPUs: after :data:`IDLE_START_AFTER` seconds of waiting the template
starts meanwhile (:meth:`WarmCoordinator.rendezvous_wait`), so that the workers of the round that
admits the node are forked warm. A spare that replaces a node then starts its workers in a fork,
not in a fresh interpreter that imports torch.

:class:`WarmTemplate` is the process handle; :class:`WarmCoordinator` is what the agent calls
at its hooks (when to start, whether the template is ready, replacement, and the event records),
with the interface of :class:`launcher.warm.cold.StartCoordinator` (``ColdStart`` is the cold one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ft_core.wire.env import FT_LAUNCHER_WARM_START_DELAY_ENV_VAR, FT_WARM_TEMPLATE_SOCKET_ENV_VAR
from ft_core.wire.osutil import signals_blocked
from launcher.events.log import EventLog
from launcher.events.records import WarmTemplateReady, WarmTemplateReplaced, WarmTemplateStarted
from launcher.warm.zygote import PRELOAD_NICENESS

logger = logging.getLogger(__name__)

WARM_DIR = os.path.dirname(os.path.abspath(__file__))
TRAMPOLINE = os.path.join(WARM_DIR, "trampoline.py")
ZYGOTE = os.path.join(WARM_DIR, "zygote.py")
STOP_TIMEOUT = 5.0
DEFAULT_PRELOAD = ("torch", "torch.distributed")
"""What the template imports unless ``--warm-preload`` says otherwise."""
START_DELAY = 20.0
"""Start the template at the latest this long after a cycle's workers started (the default of
``LauncherOptions.warm_start_delay``)."""
IDLE_START_AFTER = 10.0
"""A rendezvous that has waited this long with no template started yet starts it meanwhile."""
IDLE_READY_WAIT = 30.0
"""How long (from its start) the workers of the round wait for a template started during the
rendezvous wait, if it is still importing: a cold worker would import the same modules, so
waiting for the rest of the template's imports is the faster start; past this, they start cold."""
RESOLVE_TIMEOUT = 10.0
"""How long the launcher waits for a cycle's stand-ins to say which worker they stand in for."""
MAX_TITLE_SPACE = 128 * 1024 - 1
"""Linux's limit on one argument string (MAX_ARG_STRLEN - 1)."""


def _stand_in_pending(pid: int) -> bool:
    """True while ``pid`` has not decided yet: it still runs the trampoline as started, or has
    not ``exec``\\ ed it yet (a fresh child shows the launcher's own command line, and none at
    all in the middle of its ``exec``). False once it renamed itself (warm), ``exec``\\ ed the
    cold command, or exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            raw = stream.read()
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            shown = stream.read()
        with open("/proc/self/cmdline", "rb") as stream:
            own = stream.read()
    except OSError:  # gone
        return False
    if raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] in (b"Z", b"X"):
        return False
    argv = shown.split(b"\0")
    return not shown or shown == own or (len(argv) > 3 and os.fsdecode(argv[3]) == TRAMPOLINE)


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
        self.title_space = 256
        """Bytes the template reserves in its command line for the workers' (see zygote.py)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._ready_fd: int | None = None
        self._buffer = b""
        self.status: dict | None = None
        self.started_at: float | None = None
        """When it was started (monotonic), None before."""
        self.spawned: dict[int, int] = {}
        """Stand-in (trampoline) pid -> the worker the template forked for it, as reported."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self, preload_niceness: int = PRELOAD_NICENESS) -> None:
        """Start the template; it becomes usable once its imports are done.

        It starts with the step signals blocked (it takes them itself, see zygote.py), and with
        ``title_space`` bytes of padding in its command line: a forked worker writes its own
        command line over the template's, which must be long enough for it. It imports at
        ``preload_niceness`` (19: only idle CPU, beside training workers; 0: as fast as the
        launcher, when workers will wait for it).
        """
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env.pop(FT_WARM_TEMPLATE_SOCKET_ENV_VAR, None)
        try:
            with signals_blocked():
                self._process = subprocess.Popen(
                    [sys.executable, ZYGOTE, "--socket", self.socket_path, "--parent-pid", str(os.getpid()),
                     "--preload", ",".join(self.preload), "--ready-fd", str(write_fd),
                     "--title-space", "." * min(self.title_space, MAX_TITLE_SPACE),
                     "--preload-niceness", str(preload_niceness)],
                    env=env, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, start_new_session=True,
                )
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        self.started_at = time.monotonic()
        self._ready_fd = read_fd
        self._buffer = b""
        self.status = None
        self.spawned.clear()

    def poll_ready(self, timeout: float = 0.0) -> dict | None:
        """The template's ready report (failed preloads, CUDA state) once it is ready."""
        if self.status is None:
            self.poll_reports(timeout)
        return self.status

    def poll_reports(self, timeout: float = 0.0) -> None:
        """Read what the template reported: its ready line, then one line per forked worker."""
        if self._ready_fd is None:
            return
        with selectors.DefaultSelector() as sel:
            sel.register(self._ready_fd, selectors.EVENT_READ)
            if not sel.select(timeout):
                return
        try:
            while chunk := os.read(self._ready_fd, 65536):
                self._buffer += chunk
        except BlockingIOError:
            chunk = None
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if "spawned" in report:
                self.spawned[int(report["stand_in"])] = int(report["spawned"])
            elif self.status is None and report.get("ready"):
                self.status = report
                for failure in report.get("failed_preloads", []):
                    logger.warning("warm template could not preload %s", failure)
        if chunk == b"":  # the template is gone
            self._close_ready_fd()

    def report_fileno(self) -> int | None:
        """Readable when the template reports something (None when there is no template)."""
        return self._ready_fd

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
        """Stop the template (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`) and remove its socket."""
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


class WarmCoordinator:
    """The agent's side of warm restarts: when to start the template, readiness, replacement.

    Args:
        template: The node's template (not started yet).
        events: Where ``warm_template_*`` records go.
        start_delay: Start the template at the latest this long after a cycle's workers
            started, even if not all of them are up yet.
    """

    uses_stand_ins = True
    """torch starts trampolines (stand-ins); the template forks the workers (see resolve_workers)."""
    cold_reason: str | None = None
    """Why the latest cycle (after :meth:`before_cycle`) starts cold, for its ``cycle_start`` record;
    None if it starts warm."""

    def __init__(self, template: WarmTemplate, events: EventLog, start_delay: float = START_DELAY,
                 idle_start_after: float = IDLE_START_AFTER) -> None:
        self.template = template
        self._events = events
        self._start_delay = start_delay
        self._idle_start_after = idle_start_after
        self._started_while_waiting = False
        self._cycle_started_at = 0.0

    def adopt(self, spec: Any) -> bool:
        """Rewrite ``spec``'s command (a torch ``WorkerSpec``) to start workers through the trampoline.

        Returns:
            False (and ``spec`` unchanged) when the entry point cannot be warm-started; then
            every worker starts cold.
        """
        command = warm_entrypoint(spec.entrypoint, spec.args)
        if command is None:
            logger.info("warm restarts need a Python entry point run by this interpreter; starting cold")
            return False
        # Room for a worker's "python -u script.py ARGS" (macros such as ${local_rank} grow a little).
        self.template.title_space = len(" ".join(map(str, (sys.executable, *spec.args)))) + 256
        spec.entrypoint, spec.args = command
        return True

    def before_cycle(self, cycle: int) -> bool:
        """Before a cycle's workers start: forget a dead template, note a newly ready one.

        Returns:
            True if this cycle's workers will be forked from a ready template.
        """
        exit_code = self.template.forget_if_dead()
        if exit_code is not None:
            self._events.record_event(WarmTemplateReplaced(cycle=cycle, exit_code=exit_code))
        was_ready = self.template.status is not None
        if self._started_while_waiting:
            self._started_while_waiting = False
            self._await_template_started_while_waiting()
        status = self.template.poll_ready()
        if status is not None and not was_ready:
            # The template's ready line (launcher.warm.zygote): ready, failed_preloads, cuda_initialized.
            self._events.record_event(WarmTemplateReady(
                cycle=cycle, pid=self.template.pid, ready=bool(status.get("ready")),
                failed_preloads=list(status.get("failed_preloads") or []),
                cuda_initialized=status.get("cuda_initialized"),
            ))
        warm = status is not None and self.template.alive()
        self.cold_reason = None if warm else self._why_cold(cycle, exit_code)
        if not warm and cycle > 0 and not self.template.started:
            # A restart happened before the template was started (the workers failed before they
            # were all up and before the start delay, as on a crowded node): restarts happen in
            # this run, so start it now rather than after this cycle's workers are up, so that
            # the next restart can be warm.
            self.template.start()
            self._events.record_event(WarmTemplateStarted(cycle=cycle, pid=self.template.pid))
        return warm

    @contextlib.contextmanager
    def rendezvous_wait(self, cycle: int) -> Iterator[None]:
        """Around the rendezvous before ``cycle``: if it waits :data:`IDLE_START_AFTER` seconds and
        no template was started yet, start one (from a helper thread; the rendezvous blocks the
        main thread), so that this node's next workers can be forked from it.

        On leaving, the helper thread is done: the template is either started, with its
        ``warm_template_started`` record, or not started at all.
        """
        if self.template.started:
            yield
            return
        over = threading.Event()

        def start_when_idle() -> None:
            if over.wait(self._idle_start_after):
                return
            logger.info("waited %.0f s in the rendezvous: starting the warm template meanwhile, so that this "
                        "node's workers start warm when it gets a place", self._idle_start_after)
            self.template.start(preload_niceness=0)  # no training here to yield to; workers will wait for it
            self._started_while_waiting = True
            self._events.record_event(WarmTemplateStarted(cycle=cycle, pid=self.template.pid))

        helper = threading.Thread(target=start_when_idle, name="ft-warm-idle-start", daemon=True)
        helper.start()
        try:
            yield
        finally:
            over.set()
            helper.join()

    def _await_template_started_while_waiting(self) -> None:
        """Wait for the rest of the imports of a template started during the rendezvous wait, up to
        :data:`IDLE_READY_WAIT` after its start (see there); return at once if it is ready or gone."""
        if self.template.started_at is None or self.template.poll_ready() is not None:
            return
        deadline = self.template.started_at + IDLE_READY_WAIT
        waited_from = time.monotonic()
        while self.template.status is None and self.template.report_fileno() is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.template.poll_ready(min(left, 0.5))
        logger.info("waited %.1f s for the warm template started during the rendezvous: %s",
                    time.monotonic() - waited_from, "ready" if self.template.status is not None else "not ready")

    def _why_cold(self, cycle: int, exit_code: int | None) -> str:
        if exit_code is not None:
            return f"the warm template had exited (code {exit_code}); a new one is started"
        if not self.template.started:
            if cycle == 0:
                return "first cycle: the warm template starts once the workers are up"
            return ("the warm template had not been started yet: the previous cycle failed before its workers "
                    f"were all up and before {FT_LAUNCHER_WARM_START_DELAY_ENV_VAR} ({self._start_delay:g} s); "
                    "it is started now")
        age = time.monotonic() - (self.template.started_at or time.monotonic())
        return (f"the warm template was started {age:.1f} s ago and was not ready yet (importing "
                f"{', '.join(self.template.preload) or 'nothing'})")

    def workers_started(self, now: float | None = None) -> None:
        """The cycle's workers were started at ``now`` (monotonic; default: now)."""
        self._cycle_started_at = time.monotonic() if now is None else now

    def maybe_start(self, cycle: int, workers_up: bool, now: float | None = None) -> bool:
        """Start the template if it is not running and the cycle's workers are up (or the start
        delay has passed). Returns True if it was started now."""
        if self.template.started:
            return False
        now = time.monotonic() if now is None else now
        if not workers_up and now < self._cycle_started_at + self._start_delay:
            return False
        self.template.start()
        self._events.record_event(WarmTemplateStarted(cycle=cycle, pid=self.template.pid))
        return True

    def resolve_workers(self, stand_ins: dict[int, int], timeout: float = RESOLVE_TIMEOUT) -> dict[int, int]:
        """The pid of each warm-forked worker (local rank -> pid) for the stand-ins torch started.

        A stand-in is resolved once the template reported the worker it forked for it, or once
        it no longer runs the trampoline: it ``exec``\\ ed the cold command (the same pid is
        then the worker) or exited. The template reports a fork before the stand-in learns of
        it (and renames itself), so a stand-in seen renamed has its report readable already.
        Stand-ins not resolved within ``timeout`` are kept as they are (with a warning).
        """
        real: dict[int, int] = {}
        pending = dict(stand_ins)
        deadline = time.monotonic() + timeout
        while pending:
            self.template.poll_reports()
            for local_rank, pid in list(pending.items()):
                if pid in self.template.spawned or not _stand_in_pending(pid):
                    self.template.poll_reports()
                    real[local_rank] = self.template.spawned.pop(pid, pid)
                    del pending[local_rank]
            if not pending:
                break
            if time.monotonic() > deadline:
                logger.warning("warm start: stand-ins %s did not report their workers within %.0f s; "
                               "logging the stand-ins' pids", sorted(pending.values()), timeout)
                real.update(pending)
                break
            self.template.poll_reports(0.01)
            if self.template.report_fileno() is None:
                time.sleep(0.01)
        return real

    def worker_env(self) -> dict[str, str]:
        """What each worker's environment needs: the template's socket, for the trampoline."""
        return {FT_WARM_TEMPLATE_SOCKET_ENV_VAR: self.template.socket_path}

    @property
    def pid(self) -> int | None:
        """The template's pid while it runs (its children are workers, not leftovers)."""
        return self.template.pid

    def stop(self) -> None:
        """Stop the template (at the launcher's exit)."""
        self.template.stop()
