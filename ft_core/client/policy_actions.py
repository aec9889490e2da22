"""Carrying out :mod:`ft_core.client.sections_policy`'s answers on a client: one copy for every front end.

The policy decides; the front ends (:mod:`ft_core.client.integration`, the Lightning callbacks) act.
What they do the same way lives here: apply a section change to a
:class:`~ft_core.RankMonitorClient` (the per-step hooks too: the call costs about 0.05 us, against
the 6 us Lightning spends dispatching one hook), and run a timeouts update (agree with the other
ranks, ask the policy, calculate, log why not).
"""

from __future__ import annotations

import logging
from typing import Optional, Union

from ft_core.client.collectives import Collectives
from ft_core.client.graceful_stop import GracefulStop
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.sections_policy import (
    HeartbeatsFacts,
    HeartbeatsPolicy,
    SectionChange,
    SectionsFacts,
    SectionsPolicy,
)

Logger = Union[logging.Logger, logging.LoggerAdapter]


def apply_change(client: RankMonitorClient, change: SectionChange) -> None:
    """Close, then open, the sections ``change`` names."""
    end, start = change
    if end is not None:
        client.end_section(end)
    if start is not None:
        client.start_section(start)


def training_step_ended(
    client: RankMonitorClient, policy: SectionsPolicy, stop: Optional[GracefulStop], collectives: Collectives,
) -> bool:
    """A training step ended: close ``step`` if it was opened, then the graceful stop's check.

    A collective at the graceful stop's agreed check steps (every rank calls it after every
    training step).

    Returns:
        True after the step at which every rank agreed to stop (once; the front end then stops).
    """
    end = policy.training_step_ended()
    if end is not None:
        client.end_section(end)
    return stop is not None and stop.stop_step is None and stop.step_ended(collectives)  # collective


def update_section_timeouts(
    policy: SectionsPolicy, client: RankMonitorClient, collectives: Collectives, log: Logger, final: bool,
) -> bool:
    """Calculate the section timeouts the run has data for, on every rank alike.

    A collective: every rank must call it at the same point (the facts are agreed with one
    all-ranks AND, then the client's calculation reduces the durations).

    Args:
        final: The end-of-run update (its "not updated" line is INFO; after a save, DEBUG).

    Returns:
        True if timeouts were calculated and sent to the monitor (the caller saves them).
    """
    agreed = SectionsFacts(*collectives.all_true(policy.local_facts()))  # collective
    decision = policy.timeouts_update(agreed)
    if not decision.runs:
        if final:
            _rank_zero_info(log, "section timeouts not updated: %s", decision.skip_reason)
        else:
            log.debug("section timeouts not updated: %s", decision.skip_reason)
        return False
    updated = client.calculate_and_set_section_timeouts(  # collective
        selected_sections=list(decision.selected_sections),
        calc_out_of_section=decision.calc_out_of_section, skip_if_not_ready=True,
    )
    if not updated:
        _rank_zero_info(log, "section timeouts not updated: %s not observed on every rank", decision.describe())
        return False
    for note in decision.notes:  # the same after every save: INFO once per run
        if note in policy.reported_notes:
            log.debug("%s", note)
        else:
            policy.reported_notes.add(note)
            _rank_zero_info(log, "%s", note)
    return True


def update_heartbeat_timeouts(
    policy: HeartbeatsPolicy, client: RankMonitorClient, collectives: Collectives, log: Logger,
) -> bool:
    """Calculate the heartbeat timeouts when the run has the data (a collective, as above).

    Returns:
        True if timeouts were calculated and sent to the monitor (the caller saves them).
    """
    agreed = HeartbeatsFacts(*collectives.all_true(policy.local_facts()))  # collective
    decision = policy.timeouts_update(agreed)
    if not decision.calculate:
        _rank_zero_info(log, "heartbeat timeouts not updated: %s", decision.skip_reason)
        return False
    if not client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):  # collective
        _rank_zero_info(log, "heartbeat timeouts not updated: too few heartbeats were observed (%s training "
                        "iterations)", policy.train_iters)
        return False
    return True


def _rank_zero_info(log: Logger, msg: str, *args: object) -> None:
    """The same decision is taken on every rank: INFO once (rank 0), DEBUG elsewhere."""
    getattr(log, "rank_zero_info", log.info)(msg, *args)
