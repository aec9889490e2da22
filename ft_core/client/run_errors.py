"""What a front end tells ``ft_launcher`` about the exception that ends a rank.

Any exception that ends the run is written to torch's per-worker error file
(``TORCHELASTIC_ERROR_FILE``, torch's format, as torch's ``@record`` would), unless the file exists
already; the launcher's failure line then carries the exception's summary line (``ValueError:
...``) even when the training script has no ``@record``. The Lightning callbacks record the
exception Lightning hands them; for a hand-written loop, :func:`install_error_recording` (called by
``RankMonitorClient.init_workload_monitoring``, so by every front end) chains a ``sys.excepthook``
that records the exception which ends the rank. Nothing here ever raises (the user's exception
comes first). A setup error that stops the job is :mod:`ft_core.client.setup_errors`'s.
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

Logger = Union[logging.Logger, logging.LoggerAdapter]

TORCH_ERROR_FILE_ENV_VAR = "TORCHELASTIC_ERROR_FILE"
"""torch's variable (set by its agent for each worker): where ``@record`` writes the error."""


def summary_line(exception: BaseException) -> str:
    """``"ExceptionType: first line of its message"``, as a traceback's last line starts."""
    text = str(exception).strip().splitlines()
    return f"{type(exception).__name__}: {text[0]}" if text else type(exception).__name__


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
