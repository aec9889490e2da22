"""Calculated timeouts in a Lightning run: update them (a collective), save them on rank 0, and
say so in the reference's "Updated FT timeouts" line.

What is calculated when is the driver's (:mod:`ptl_resiliency._drivers`, after the policy of
:mod:`ft_core.client.sections_policy`); when the final update may run is
:func:`~ft_core.client.sections_policy.final_update_refusal`'s; saving is the
:class:`~ft_core.client.session.FrontEndSession`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.sections_policy import final_update_refusal
from ft_core.client.session import FrontEndSession
from ft_core.client.state_file import PART_SECTIONS
from ft_core.client.timeout_bounds import (
    Snapshot,
    describe_heartbeat_timeouts,
    describe_section_timeouts,
    heartbeat_snapshot,
    section_snapshot,
    significant_change,
)

Calculate = Callable[[RankMonitorClient, bool], bool]
"""``(client, final) -> updated``: calculate and send the timeouts the run has data for (a collective)."""


class TimeoutsUpdater:
    """Updates and saves a callback's calculated timeouts and logs what changed.

    Args:
        session: The callback's session (its collectives, the state file).
        calculate: The driver's calculation (:data:`Calculate`).
        log: The callback's logger.
    """

    def __init__(self, session: FrontEndSession, calculate: Calculate, log: RankLoggerAdapter) -> None:
        self._session = session
        self._calculate = calculate
        self._log = log
        self._logged: Optional[Snapshot] = None  # the timeouts the last "Updated FT timeouts" line showed

    def reset(self) -> None:
        """A new run: its first update is logged at INFO whatever it shows."""
        self._logged = None

    def update(self, client: RankMonitorClient, final: bool) -> bool:
        """Update timeouts (a collective, every rank together) and, on rank 0, save them.

        Returns:
            True if timeouts were updated (saved or not).
        """
        if not self._calculate(client, final):
            return False
        saved = self._session.save_timeouts()
        self._log_updated(client, saved)
        return True

    def final_update(self, client: RankMonitorClient, exception: Optional[BaseException]) -> bool:
        """The end-of-run update, when it is safe (see ``final_update_refusal``); never raises.

        Returns:
            True if timeouts were updated.
        """
        collectives = self._session.collectives
        world_size = collectives.world_size() if collectives is not None else 1
        refusal = final_update_refusal(exception, world_size)
        if refusal is not None:
            self._log.rank_zero_info("timeouts not updated: %s", refusal)
            return False
        try:
            return self.update(client, final=True)
        except Exception:  # a completed run must still create its flag and disconnect
            self._log.exception("fault tolerance: final timeouts update failed")
            return False

    def _log_updated(self, client: RankMonitorClient, saved: bool) -> None:
        """The reference's line after calculated timeouts were applied and saved.

        People grep logs for "Updated FT timeouts"; it stands next to the client's "timeouts in
        force (calculated)" line, which says how each value came about. INFO (rank 0) when the
        timeouts changed significantly since this run's last such line, else DEBUG, like ours.
        When rank 0 could not save them the line says so (they hold for this run only).
        """
        if self._session.part == PART_SECTIONS:
            snapshot = section_snapshot(client.section_timeouts)
            text = describe_section_timeouts(client.section_timeouts)
        else:
            snapshot = heartbeat_snapshot(client.hb_timeouts)
            text = describe_heartbeat_timeouts(client.hb_timeouts)
        if significant_change(self._logged, snapshot):
            self._logged = snapshot
            if saved:
                self._log.rank_zero_info("Updated FT timeouts. New values: %s", text)
            else:  # the state file's warning said why; the next run starts from the configured ones
                self._log.rank_zero_info("Updated FT timeouts for this run only (not saved to %s). New values: %s",
                                         self._session.state_file_path, text)
        else:
            self._log.debug("Updated FT timeouts: no significant change")  # short: every checkpoint, every rank
