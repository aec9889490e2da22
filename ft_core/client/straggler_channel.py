"""A rank's way to hand its node's flagged stragglers to ``ft_launcher`` (its event log).

One message per report interval and node, on the launcher's control socket, which accepts it
only from its own workers (as workload control requests). Not being under ``ft_launcher`` is
normal for a detector (plain ``torchrun``, a notebook): that is said once and costs nothing more.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ft_core.client.connection import send_to_launcher
from ft_core.wire import protocol
from ft_core.wire.env import FT_LAUNCHER_IPC_SOCKET_ENV_VAR
from ft_core.wire.errors import ProtocolError
from ft_core.wire.straggler_report import StragglerEntry, report_message

logger = logging.getLogger(__name__)

_said_no_launcher = False


def report_to_launcher(entries: Sequence[Mapping[str, Any] | StragglerEntry], interval_s: float) -> bool:
    """Send flagged ranks and nodes to this node's ``ft_launcher``, which writes one
    ``straggler`` event record per entry.

    Args:
        entries: :class:`~ft_core.wire.straggler_report.StragglerEntry` objects or their dict form
            (``scope``, ``rank``, ``node``, ``relative``, ``individual``, ``consecutive``,
            ``action``). Send the entries of this rank's own node only: each node's launcher
            records its own ranks.
        interval_s: Length of the report interval the scores cover, in seconds.

    Returns:
        True when the launcher acknowledged the report. False (logged once at info) when this
        process was not started by ``ft_launcher``, and False with a warning when the launcher
        could not be reached or refused the report. Delivery problems never raise: a report must
        not stop training.

    Raises:
        ValueError: An entry is malformed (a bug of the caller, not of delivery).
    """
    global _said_no_launcher
    body = report_message(entries, interval_s)
    path = os.environ.get(FT_LAUNCHER_IPC_SOCKET_ENV_VAR)
    if not path:
        if not _said_no_launcher:
            _said_no_launcher = True
            logger.info("straggler reports go to the log only: not started by ft_launcher (%s is not set), "
                        "so there is no event log to record them in", FT_LAUNCHER_IPC_SOCKET_ENV_VAR)
        return False
    sender: dict[str, Any] = {}
    for key, env_name in (("rank", "RANK"), ("local_rank", "LOCAL_RANK")):
        value = os.environ.get(env_name, "")
        if value.isascii() and value.isdigit():
            sender[key] = int(value)
    try:
        reply = send_to_launcher(path, {"type": protocol.MSG_STRAGGLER_REPORT, **body, **sender})
    except (OSError, ProtocolError, TimeoutError) as err:
        logger.warning("could not deliver a straggler report to ft_launcher at %s: %s", path, err)
        return False
    if reply.get("type") != protocol.MSG_OK:
        logger.warning("ft_launcher refused a straggler report: %s", reply.get("error", reply.get("type")))
        return False
    return True
