"""What every front end shares besides the policy: argument checks and the client it holds.

The front ends are :class:`ft_core.client.integration.FaultToleranceIntegration` (a hand-written loop)
and the two Lightning callbacks (``ptl_resiliency``). The rules they follow are
:mod:`ft_core.client.sections_policy`'s and what they do with its answers is
:mod:`ft_core.client.policy_actions`'; this module holds the rest they do alike: checking their
arguments (one wording for every front end: ``<owner>: <name> must be ..., got <value>``) and
:class:`FrontEnd`, the base that holds the connected client and the state file.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

from ft_core.wire.errors import RankMonitorClientError
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.state_file import StateFile
from ft_core.client.timeout_bounds import (
    Snapshot,
    heartbeat_snapshot,
    section_snapshot,
    significant_change,
)

Logger = Union[logging.Logger, logging.LoggerAdapter]


def require_bool(owner: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is True or False (not merely truthy)."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")


def require_path(owner: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a ``str`` or ``os.PathLike`` (or None if allowed)."""
    if value is None and allow_none:
        return
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{owner}: {name} must be a path{' or None' if allow_none else ''}, got {value!r}")


class FrontEnd:
    """Holds a front end's :class:`~ft_core.RankMonitorClient` and its state file.

    A subclass sets ``_client`` (while connected), ``_state_file`` (from setup on) and ``_log``.
    """

    _client: Optional[RankMonitorClient] = None
    _state_file: Optional[StateFile] = None
    _log: Logger
    _saved: Optional[Snapshot] = None  # the timeouts the state file holds (as far as we know)

    @property
    def client(self) -> Optional[RankMonitorClient]:
        """The rank monitor client while connected (for inspection; do not shut it down)."""
        return self._client

    @property
    def state_file_path(self) -> Optional[str]:
        """Where calculated timeouts are loaded from and saved to (known once set up)."""
        return None if self._state_file is None else self._state_file.path

    def _remember_saved(self, client: RankMonitorClient) -> None:
        """The client's timeouts right after setup are what the state file gave (or configured)."""
        self._saved = _snapshot(client)

    def _save_timeouts(self, client: RankMonitorClient, rank: int) -> None:
        """On rank 0, write the client's timeouts to the state file (the other ranks have the same).

        The file is written after every update (it follows the merged values); the "saved" line
        is INFO only when the timeouts changed significantly since the last one, else DEBUG.
        """
        snapshot = _snapshot(client)
        announce = significant_change(self._saved, snapshot)
        if rank == 0 and self._state_file is not None and self._state_file.save(client.state_dict(), announce):
            self._saved = snapshot
        elif rank != 0:
            self._saved = snapshot

    def _disconnect(self, client: RankMonitorClient) -> None:
        """Shut ``client`` down; a failure is one ERROR line, never an exception."""
        try:
            client.shutdown_workload_monitoring()
        except (OSError, RankMonitorClientError) as err:
            self._log.error("fault tolerance: disconnecting from the monitor failed: %s", err)


def _snapshot(client: RankMonitorClient) -> Snapshot:
    both = {f"heartbeat {k}": v for k, v in heartbeat_snapshot(client.hb_timeouts).items()}
    both.update({f"section {k}": v for k, v in section_snapshot(client.section_timeouts).items()})
    return both
