"""What a front end tells ``ft_launcher`` when the run fails in a rank.

* A setup error that no restart can fix (our :class:`~ft_core.wire.config.ConfigError`: a missing
  ``FAULT_TOL_FINISHED_FLAG_FILE``, a config the front end cannot work with, two callbacks)
  becomes a ``ShutdownWorkload`` request: the launcher stops every node without restarting and
  exits 64, so ``scripts/autoresume.sh`` stops too instead of burning the allocation on attempts
  that fail the same way. The error's message is the request's description.
* Any exception that ends the run is written to torch's per-worker error file
  (``TORCHELASTIC_ERROR_FILE``, torch's format, as torch's ``@record`` would), unless the file
  exists already; the launcher's failure line then carries the exception's summary line
  (``ValueError: ...``) even when the training script has no ``@record``.

Both are used by the Lightning callbacks (``ptl_resiliency``) and :mod:`ft_core.client.integration`;
neither ever raises (the user's exception comes first).
"""

from __future__ import annotations

import logging
import os
from typing import Union

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

    Uses torch's own error handler (the format its agent reads back into the failure's
    message). Returns True if written; never raises.
    """
    path = os.environ.get(TORCH_ERROR_FILE_ENV_VAR)
    if not path or os.path.exists(path) or not isinstance(exception, Exception):
        return False
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exception)
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
