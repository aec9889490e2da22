"""What each fault tolerance callback tells its rank monitor as training goes on: heartbeats
(:class:`HeartbeatDriver`) or sections (:class:`SectionsDriver`).

A driver turns the run's events (a training batch ended, a checkpoint was saved, the run ended)
into the policy's answers (:mod:`ft_core.client.sections_policy`) and sends them through the
session's client; it also says when timeouts should be calculated and how. The callbacks call it
from their Lightning hooks; the set-up and tear-down around it are
:class:`~ptl_resiliency._session.FitSession`'s.

Per-step methods read the session's plain attributes (``client``, ``set_step``,
``graceful_stop``, ``collectives``) once each: they run on every training step.
"""

from __future__ import annotations

from typing import Optional

from ft_core.client.policy_actions import (
    apply_change,
    training_step_ended,
    update_heartbeat_timeouts,
    update_section_timeouts,
)
from ft_core.client.rank_monitor_client import RankMonitorClient
from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.client.sections_policy import (
    HeartbeatsPolicy,
    SectionsPolicy,
    heartbeats_config_error,
    sections_config_error,
)
from ft_core.client.session import FrontEndSession
from ft_core.client.state_file import PART_HEARTBEATS, PART_SECTIONS
from ft_core.wire.config import ConfigError
from ptl_resiliency._checkpoint_hooks import KIND_FINALIZE, KIND_SAVE, uses_async_checkpointing
from ptl_resiliency._lightning import pl


class _Driver:
    """What both drivers hold: the callback's session and logger, and whether this run calculates timeouts.

    Args:
        session: The callback's session (the client while connected).
        log: The callback's logger.
    """

    def __init__(self, session: FrontEndSession, log: RankLoggerAdapter) -> None:
        self._session = session
        self._log = log
        self._calculate_timeouts = False


class HeartbeatDriver(_Driver):
    """Heartbeats: at train start, after every training and validation batch, around validation,
    after every checkpoint save, at train end and at the end of the run.

    Args:
        session: The callback's session (the client while connected).
        log: The callback's logger.
    """

    part = PART_HEARTBEATS
    """The state file's part these timeouts are saved in."""
    wraps_checkpoint_io = False
    """Heartbeats need ``trainer.save_checkpoint`` only, not the checkpoint IO's own work."""

    def __init__(self, session: FrontEndSession, log: RankLoggerAdapter) -> None:
        super().__init__(session, log)
        self.policy = HeartbeatsPolicy(False)  # a placeholder until start() makes this run's

    # ------------------------------------------------------------------ set-up and tear-down

    def start(self, trainer: pl.Trainer, calculate_timeouts: bool) -> None:
        """A new run: a fresh policy."""
        self._calculate_timeouts = calculate_timeouts
        self.policy = HeartbeatsPolicy(calculate_timeouts)

    def config_error(self, client: RankMonitorClient) -> Optional[ConfigError]:
        """Why heartbeat hang detection cannot work with the monitor's configuration, or None."""
        timeouts = client.hb_timeouts
        return heartbeats_config_error(
            "FaultToleranceCallback", timeouts.initial, timeouts.subsequent,
            client.section_timeouts.out_of_section, self._calculate_timeouts,
        )

    def started(self, client: RankMonitorClient) -> None:
        """The set-up is complete (nothing to send: the first heartbeat is at train start)."""

    def run_ended(self, client: RankMonitorClient, clean: bool) -> None:
        """The last heartbeat before disconnecting."""
        client.send_heartbeat()

    def calculate(self, client: RankMonitorClient, final: bool) -> bool:
        """Calculate and send the heartbeat timeouts if there is data for them (a collective)."""
        return update_heartbeat_timeouts(self.policy, client, self._session.collectives, self._log)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_loaded(self) -> None:
        """The run resumed from a checkpoint (its intervals include the load)."""
        self.policy.checkpoint_loaded()

    def checkpoint_started(self, client: RankMonitorClient, kind: str) -> None:
        """Checkpoint work of ``kind`` begins (nothing to send)."""

    def checkpoint_ended(self, client: RankMonitorClient, kind: str, ok: bool) -> bool:
        """A heartbeat after every completed save.

        Returns:
            Whether timeouts should be calculated now (never: heartbeat timeouts only at the end).
        """
        if kind == KIND_SAVE and ok:
            self.policy.checkpoint_saved()
            client.send_heartbeat()
        return False

    # ------------------------------------------------------------------ training

    def heartbeat(self) -> None:
        """One heartbeat while connected."""
        client = self._session.client
        if client is not None:
            client.send_heartbeat()

    def train_started(self, trainer: pl.Trainer) -> None:
        """Heartbeat: set-up and checkpoint loading are done; publish the step."""
        self.heartbeat()
        set_step = self._session.set_step
        if set_step is not None:
            set_step(trainer.global_step)

    def train_batch_ended(self, trainer: pl.Trainer) -> bool:
        """Heartbeat after a training batch; the graceful stop's check (a collective at agreed steps).

        Returns:
            True after the step at which every rank agreed to stop.
        """
        session = self._session
        client = session.client
        if client is None:
            return False
        client.send_heartbeat()
        self.policy.train_iters += 1
        # The step that starts next (no on_train_batch_start hook here: it would cost a
        # Lightning hook call per step).
        set_step = session.set_step
        if set_step is not None:
            set_step(trainer.global_step)
        stop = session.graceful_stop
        return stop is not None and stop.step_ended(session.collectives)


class SectionsDriver(_Driver):
    """Sections: ``setup`` from set-up to the first batch, ``step`` around each batch after the
    warm-up ones, ``checkpointing`` around checkpoint saving (see
    :class:`~ptl_resiliency.FaultToleranceSectionsCallback`).

    Args:
        session: The callback's session (the client while connected).
        log: The callback's logger.
    """

    part = PART_SECTIONS
    """The state file's part these timeouts are saved in."""
    wraps_checkpoint_io = True
    """The checkpoint IO's own save, remove and finalisation are ``checkpointing`` too."""

    def __init__(self, session: FrontEndSession, log: RankLoggerAdapter) -> None:
        super().__init__(session, log)
        self.policy = SectionsPolicy(False)  # a placeholder until start() makes this run's

    # ------------------------------------------------------------------ set-up and tear-down

    def start(self, trainer: pl.Trainer, calculate_timeouts: bool) -> None:
        """A new run: a fresh policy, told whether the checkpoint IO is asynchronous."""
        self._calculate_timeouts = calculate_timeouts
        self.policy = SectionsPolicy(
            calculate_timeouts, async_checkpointing=uses_async_checkpointing(trainer.strategy.checkpoint_io),
        )

    def config_error(self, client: RankMonitorClient) -> Optional[ConfigError]:
        """Why section hang detection cannot work with the monitor's configuration, or None."""
        timeouts = client.section_timeouts
        return sections_config_error("FaultToleranceSectionsCallback", timeouts.section,
                                     timeouts.out_of_section, self._calculate_timeouts,
                                     initial_heartbeat=client.hb_timeouts.initial, opens_only_these=True)

    def started(self, client: RankMonitorClient) -> None:
        """The set-up is complete: open ``setup``."""
        policy = self.policy
        apply_change(client, policy.setup_started())
        if policy.async_checkpointing:
            self._log.info("asynchronous checkpoint IO: the checkpointing timeout is not calculated")

    def run_ended(self, client: RankMonitorClient, clean: bool) -> None:
        """Close the sections left open."""
        for name in self.policy.run_ended():
            client.end_section(name)

    def calculate(self, client: RankMonitorClient, final: bool) -> bool:
        """Calculate and send the section timeouts there is data for (a collective)."""
        return update_section_timeouts(self.policy, client, self._session.collectives, self._log, final)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_loaded(self) -> None:
        """The run resumed from a checkpoint (``setup`` and out-of-section include the load)."""
        self.policy.checkpoint_loaded()

    def checkpoint_started(self, client: RankMonitorClient, kind: str) -> None:
        """Open ``checkpointing``."""
        apply_change(client, self.policy.checkpointing_started())

    def checkpoint_ended(self, client: RankMonitorClient, kind: str, ok: bool) -> bool:
        """Close ``checkpointing``.

        Returns:
            Whether timeouts should be calculated now (after a completed ``trainer.save_checkpoint``,
            the only checkpoint work that runs on every rank; the IO's may be rank 0's alone).
        """
        end = self.policy.checkpointing_ended(is_async_finalization=kind == KIND_FINALIZE,
                                              completes_save=kind == KIND_SAVE and ok)
        apply_change(client, end.change)
        return end.update_timeouts

    # ------------------------------------------------------------------ training

    def train_batch_started(self, trainer: pl.Trainer) -> None:
        """Close ``setup`` at the first batch; open ``step`` after the warm-up batch; publish the step."""
        session = self._session
        client = session.client
        if client is not None:
            set_step = session.set_step
            if set_step is not None:
                set_step(trainer.global_step)
            apply_change(client, self.policy.training_step_started())

    def train_batch_ended(self, trainer: pl.Trainer) -> bool:
        """Close ``step``; the graceful stop's check (a collective at the agreed check steps).

        Returns:
            True after the step at which every rank agreed to stop.
        """
        session = self._session
        client = session.client
        return client is not None and training_step_ended(client, self.policy,
                                                          session.graceful_stop, session.collectives)

    def validation_batch_started(self) -> None:
        """Close ``setup`` at the first batch; open ``step`` after the run's warm-up batch."""
        client = self._session.client
        if client is not None:
            apply_change(client, self.policy.eval_step_started())

    def validation_batch_ended(self) -> None:
        """Close ``step``."""
        client = self._session.client
        if client is not None:
            end = self.policy.eval_step_ended()
            if end is not None:
                client.end_section(end)

    def train_epoch_ended(self) -> None:
        """Close a ``step`` left open by a batch that ended the epoch early (hook returned -1)."""
        client = self._session.client
        if client is not None:
            end = self.policy.step_abandoned()
            if end is not None:
                client.end_section(end)
