"""A setup error that no restart can fix stops the job instead of burning restarts.

Our :class:`~ft_core.wire.config.ConfigError` (a missing ``FAULT_TOL_FINISHED_FLAG_FILE``, a config
the front end cannot work with, two callbacks) becomes a ``ShutdownWorkload`` request: the
launcher stops every node without restarting and exits 64, so ``scripts/autoresume.sh`` stops too
instead of spending the allocation on attempts that fail the same way. The error's message is the
request's description. Used by the Lightning callbacks and :mod:`ft_core.client.integration`; it
never raises (the user's exception comes first). Recording the exception in torch's error file is
:mod:`ft_core.client.run_errors`'s.
"""

from __future__ import annotations

import os
from logging import Logger

from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.wire.config import ConfigError
from ft_core.wire.data import WorkloadAction, WorkloadControlRequest
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import RankMonitorClientError

MAX_DESCRIPTION_CHARS = 2000


def is_unfixable_setup_error(exception: BaseException) -> bool:
    """True for an error that every restart would hit again (our ``ConfigError``)."""
    return isinstance(exception, ConfigError)


def stop_job_for_setup_error(exception: BaseException, log: Logger) -> bool:
    """Ask ``ft_launcher`` for ``ShutdownWorkload`` when ``exception`` is an unfixable setup error.

    Returns:
        True if the launcher acknowledged the request. False when the exception is not such an
        error, or there is no launcher (then it is logged); never raises.
    """
    if not is_unfixable_setup_error(exception) or not os.environ.get(FT_LAUNCHER_IPC_SOCKET_ENV_VAR):
        return False
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
