"""The fault tolerance callbacks' just-in-time state part (``docs/jit-state.md``).

One per callback; :class:`~ptl_resiliency._session.FitSession` drives it through a ``fit`` run:

* :meth:`LightningJit.open` (``setup``): arm the restore of the launcher's just-in-time state
  (:mod:`ptl_resiliency._jit_restore`);
* :meth:`LightningJit.train_started` (``on_train_start``): attach a
  :class:`~ptl_resiliency._jit_state.LightningProvider` to this process's
  :class:`~ft_core.client.jit_state.JitState` (its thread answers the monitor's save requests);
* :meth:`LightningJit.batch_ended` (``on_train_batch_end``, every batch: one flag update);
* :meth:`LightningJit.save_on_failure` (``on_exception``): the exception path's save;
* :meth:`LightningJit.close` (the session's tear-down): detach, unhook.

Nothing happens unless ``ft_launcher`` turned the feature on (``FT_JIT_STATE_DIR`` set).
"""

from __future__ import annotations

from typing import Optional

from ft_core.client import jit_state
from ft_core.client.collectives import Collectives
from ft_core.client.ranklog import RankLoggerAdapter
from ptl_resiliency._jit_restore import JitRestore
from ptl_resiliency._jit_state import LightningProvider, checkpoint_dir_of
from ptl_resiliency._lightning import pl


class LightningJit:
    """Just-in-time state for one callback's ``fit`` runs.

    Args:
        log: The callback's logger.
    """

    def __init__(self, log: RankLoggerAdapter) -> None:
        self._log = log
        self._restore = JitRestore(log)
        self._provider: Optional[LightningProvider] = None

    @property
    def provider(self) -> Optional[LightningProvider]:
        """The attached provider (from ``on_train_start`` to the end of the run), else None."""
        return self._provider

    @property
    def restored(self) -> Optional[object]:
        """The just-in-time state this process's run resumed from (its ``SavedState``), else None."""
        return self._restore.restored

    @property
    def restored_source(self) -> str:
        """``jit_shared`` when :attr:`restored` is a previous job's copy (a requeue), else ``jit``."""
        return "jit_shared" if self._restore.from_shared else "jit"

    def open(self, trainer: pl.Trainer, collectives: Collectives) -> None:
        """Arm the restore of ``FT_JIT_RESUME`` for this run (before Lightning restores anything)."""
        self._restore.install(trainer, collectives)

    def train_started(self, trainer: pl.Trainer) -> None:
        """Track this run's state (the strategy, optimizers and restored state are ready now)."""
        state = jit_state.get_jit_state()
        if not state.enabled or self._provider is not None:
            return
        self._restore.uninstall()  # a run that never restored (no checkpoint loading at all)
        provider = LightningProvider(trainer)
        try:
            state.attach(provider, checkpoint_dir_of(trainer))
        except BaseException:
            provider.close()
            raise
        self._provider = provider

    def batch_ended(self) -> None:
        """A training batch ended (its optimizer step, if any, is counted)."""
        provider = self._provider
        if provider is not None:
            provider.batch_ended()

    def save_on_failure(self) -> None:
        """The run failed: save the state if it is consistent (never raises)."""
        if self._provider is None:
            return
        result = jit_state.get_jit_state().save_now("exception")
        if not result.ok:
            self._log.info("just-in-time state not saved on the exception path: %s", result.reason)

    def close(self) -> None:
        """Stop tracking; remove the restore wrapper and the optimizer hooks. Safe to call twice."""
        self._restore.uninstall()
        provider, self._provider = self._provider, None
        if provider is not None:
            jit_state.detach()
            provider.close()
