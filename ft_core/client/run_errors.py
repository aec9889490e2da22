"""What a front end tells ``ft_launcher`` when the run fails in a rank.

* A setup error that no restart can fix (our :class:`~ft_core.wire.config.ConfigError`: a missing
  ``FAULT_TOL_FINISHED_FLAG_FILE``, a config the front end cannot work with, two callbacks)
  becomes a ``ShutdownWorkload`` request: the launcher stops every node without restarting and
  exits 64, so ``scripts/autoresume.sh`` stops too instead of burning the allocation on attempts
  that fail the same way. The error's message is the request's description.
* Any exception that ends the run is written to torch's per-worker error file
  (``TORCHELASTIC_ERROR_FILE``, torch's format, as torch's ``@record`` would), unless the file
  exists already; the launcher's failure line then carries the exception's summary line
  (``ValueError: ...``) even when the training script has no ``@record``. The Lightning
  callbacks record the exception Lightning hands them; for a hand-written loop,
  :func:`install_error_recording` (called by ``RankMonitorClient.init_workload_monitoring``, so by
  every front end) chains a ``sys.excepthook`` that records the exception which ends the rank.

Both are used by the Lightning callbacks (``ptl_resiliency``) and :mod:`ft_core.client.integration`;
neither ever raises (the user's exception comes first).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import traceback
from types import TracebackType
from typing import Optional, Union

from ft_core.wire.config import ConfigError
from ft_core.wire.data import WorkloadAction, WorkloadControlRequest
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import RankMonitorClientError

Logger = Union[logging.Logger, logging.LoggerAdapter]

TORCH_ERROR_FILE_ENV_VAR = "TORCHELASTIC_ERROR_FILE"
"""torch's variable (set by its agent for each worker): where ``@record`` writes the error."""
MAX_DESCRIPTION_CHARS = 2000


def is_unfixable_setup_error(exception: BaseException) -> bool:
    """True for an error that every restart would hit again (our ``ConfigError``)."""
    return isinstance(exception, ConfigError)


def summary_line(exception: BaseException) -> str:
    """``"ExceptionType: first line of its message"``, as a traceback's last line starts."""
    text = str(exception).strip().splitlines()
    return f"{type(exception).__name__}: {text[0]}" if text else type(exception).__name__


def stop_job_for_setup_error(exception: BaseException, log: Logger) -> bool:
    """Ask ``ft_launcher`` for ``ShutdownWorkload`` when ``exception`` is an unfixable setup error.

    Returns:
        True if the launcher acknowledged the request. False when the exception is not such an
        error, or there is no launcher (then it is logged); never raises.
    """
    if not is_unfixable_setup_error(exception) or not os.environ.get(FT_LAUNCHER_IPC_SOCKET_ENV_VAR):
        return False
    from ft_core.client.rank_monitor_client import RankMonitorClient

    description = f"{type(exception).__name__}: {exception}"[:MAX_DESCRIPTION_CHARS]
    request = WorkloadControlRequest(WorkloadAction.ShutdownWorkload, description)
    try:
        RankMonitorClient().send_workload_control_request(request)
    except RankMonitorClientError as err:
        log.error("fault tolerance: could not ask ft_launcher to stop the job after %s: %s",
                  type(exception).__name__, err)
        return False
    log.error("fault tolerance: %s cannot be fixed by a restart; asked ft_launcher to stop the job "
              "(ShutdownWorkload)", type(exception).__name__)
    return True


def record_error_for_launcher(exception: BaseException, log: Logger) -> bool:
    """Write ``exception`` to torch's error file for this worker, if there is one and it is empty.

    Writes the format torch's agent reads back into the failure's message (the one ``@record``
    writes: the summary ``Type: message`` and the traceback as ``py_callstack``), the traceback
    taken from the exception itself, so that it is right also outside its ``except`` block (in
    ``sys.excepthook``). Written whole or not at all (a temporary file renamed into place).
    Returns True if written; never raises.
    """
    path = os.environ.get(TORCH_ERROR_FILE_ENV_VAR)
    if not path or os.path.exists(path) or not isinstance(exception, Exception):
        return False
    try:
        _write_error_file(path, exception)
    except OSError as err:  # the file system; the user's exception comes first
        log.warning("fault tolerance: could not record %s for the launcher: %s", type(exception).__name__, err)
        return False
    except Exception as err:
        # Raised inside the recording by a signal handler: the launcher SIGTERMs the survivors of
        # a dead peer, and Lightning's handler runs a collective to that peer. The rank is being
        # stopped; the launcher judges it by its exit. One quiet line.
        log.debug("fault tolerance: recording %s for the launcher was interrupted: %s: %s",
                  type(exception).__name__, type(err).__name__, str(err).partition("\n")[0][:200])
        return False
    return os.path.exists(path)


def _write_error_file(path: str, exception: BaseException) -> None:
    callstack = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
    data = {"message": {"message": f"{type(exception).__name__}: {exception}",
                        "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))}}}
    text = json.dumps(data)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


class _RecordingExceptHook:
    """``sys.excepthook`` that writes the exception ending the rank to torch's error file, then
    hands it to the hook it replaced (which prints the traceback as before)."""

    def __init__(self, previous: object, log: Logger) -> None:
        self.previous = previous
        self._log = log

    def __call__(self, kind: type[BaseException], value: BaseException,
                 traceback: Optional[TracebackType]) -> None:
        try:
            # A script with @record has written the file already: record_error_for_launcher
            # leaves it as it is (torch's handler also skips a file that exists).
            if isinstance(value, Exception):
                if value.__traceback__ is None and traceback is not None:
                    value = value.with_traceback(traceback)
                record_error_for_launcher(value, self._log)
        finally:
            previous = self.previous if callable(self.previous) else sys.__excepthook__
            previous(kind, value, traceback)


def install_error_recording(log: Logger) -> bool:
    """Record the exception that ends this rank for the launcher, with or without torch's ``@record``.

    Chains a ``sys.excepthook`` (once per process, kept for the process's life: an exception
    raised after the front end shut down, e.g. from a ``finally: shutdown(...)``, still ends the
    rank) that writes an uncaught ``Exception`` to torch's error file when torch's agent gave the
    rank one (``TORCHELASTIC_ERROR_FILE``) and nothing wrote it yet; the launcher's failure line
    and crash-loop fingerprint then name the exception and its innermost frame. The previous hook
    runs after it, as before (the traceback is printed). ``KeyboardInterrupt`` and ``SystemExit``
    are not recorded (not an error of the rank's code).

    Returns:
        True if the hook was installed now, False when it already was or there is no error file
        (not started by torch's agent); never raises.
    """
    if not os.environ.get(TORCH_ERROR_FILE_ENV_VAR):
        return False
    # The state is the interpreter's own hook (as a signal handler is): ours once, found by its type.
    if isinstance(sys.excepthook, _RecordingExceptHook):
        return False
    sys.excepthook = _RecordingExceptHook(sys.excepthook, log)
    return True
