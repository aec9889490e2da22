"""After a rank failed, and before the survivors are stopped: one survivor of this node saves
the training state of its last completed step (just-in-time state, docs/jit-state.md).

:class:`SurvivorSave` asks the monitors of the node's running ranks (``save_state``; a hung rank's
monitor may have asked it already and answers from memory), waits for the first rank that saved,
or for all to decline, or for the bound (``jit_state_timeout``, by default sized from the state's
bytes), whichever comes first. A rank whose collective failed may save in its own exception path
and exit before it is asked: a complete state of this cycle in the node's state directory counts
as saved. One log line and one record (``state_saved`` or ``state_not_saved``) say what happened.
"""

from __future__ import annotations

import logging
import os
import time

from ft_core.wire import messages, saved_state
from ft_core.wire.config import FaultToleranceConfig
from launcher.events.log import EventLog
from launcher.events.records import JitStateNotSaved, JitStateSaved
from launcher.node.monitors import MonitorPool

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.05
"""How often the state directory is looked at while the ranks are asked."""
STATE_SUBDIR = "state"


def state_dir(run_dir: str) -> str:
    """The node-local state directory under the launcher's run directory."""
    return os.path.join(run_dir, STATE_SUBDIR)


class SurvivorSave:
    """See the module docstring.

    Args:
        monitors: The node's rank monitors.
        events: Where the record goes.
        ft_cfg: ``jit_state`` (off: :meth:`run` does nothing) and ``jit_state_timeout``.
    """

    def __init__(self, monitors: MonitorPool, events: EventLog, ft_cfg: FaultToleranceConfig) -> None:
        self._monitors = monitors
        self._events = events
        self._cfg = ft_cfg
        self.directory = state_dir(monitors.run_dir) if ft_cfg.jit_state else None

    def run(self, cycle: int, running: list[int], reports: dict[int, messages.ProgressReport]) -> bool:
        """Have one survivor of ``running`` (local ranks) save; True if a state of ``cycle`` is saved.

        Args:
            cycle: The cycle that failed.
            running: Local ranks whose workers are still running (hung ones included).
            reports: The monitors' progress reports of this failure (they carry the state's size).
        """
        if self.directory is None:
            return False
        began = time.monotonic()
        on_disk = self._on_disk(cycle)
        if on_disk is not None:  # a rank's exception path saved (and the rank may have exited)
            return self._conclude(cycle, None, "", began, on_disk)
        if not running:
            return self._conclude(cycle, None, "no rank of this node was running", began)
        sizes = [r.state_bytes for r in reports.values() if r.state_bytes]
        bound = saved_state.save_timeout(self._cfg.jit_state_timeout, max(sizes, default=0))
        request = messages.SaveState(cycle=cycle, reason="another rank of the job failed", timeout=bound)
        replies: list[messages.StateSaved] = []

        def done(answers: dict[int, dict[type[messages.Message], messages.Message]]) -> bool:
            replies[:] = [a for lr in answers.values() if isinstance(a := lr.get(messages.StateSaved),
                                                                   messages.StateSaved) and a.cycle == cycle]
            return any(r.ok for r in replies) or self._on_disk(cycle) is not None

        answers = self._monitors.ask_each({lr: [request] for lr in running}, bound, until=done,
                                          poll_interval=POLL_INTERVAL)
        done(answers)
        saved = next((r for r in replies if r.ok), None)
        if saved is None and self._on_disk(cycle) is None and any(
                r.reason.startswith(saved_state.CLAIMED_BY_ANOTHER) for r in replies):
            # A rank (another thread of a rank, or its exception path) is writing: wait for its manifest.
            deadline = began + bound
            while time.monotonic() < deadline and self._on_disk(cycle) is None:
                time.sleep(POLL_INTERVAL)
        on_disk = self._on_disk(cycle) if saved is None else None
        if saved is None and on_disk is None:
            reasons = sorted({r.reason for r in replies if r.reason})
            unanswered = len(running) - len(replies)
            if unanswered and time.monotonic() - began >= bound:
                reasons.insert(0, f"no rank answered within {bound:.1f} s" if not replies
                               else f"{unanswered} rank(s) did not answer within {bound:.1f} s")
            return self._conclude(cycle, None, "; ".join(reasons) or "no rank saved its state", began)
        return self._conclude(cycle, saved, "", began, on_disk)

    def _on_disk(self, cycle: int) -> saved_state.SavedState | None:
        assert self.directory is not None
        return saved_state.newest(self.directory, cycle=cycle)

    def _conclude(self, cycle: int, saved: messages.StateSaved | None, reason: str, began: float,
                  on_disk: saved_state.SavedState | None = None) -> bool:
        waited = time.monotonic() - began
        if saved is not None:
            record = JitStateSaved(cycle=cycle, rank=saved.rank, local_rank=saved.local_rank, step=saved.step,
                                   bytes=saved.bytes, seconds=saved.seconds, source=saved.source, path=saved.path)
        elif on_disk is not None:
            record = JitStateSaved(cycle=cycle, rank=on_disk.rank, local_rank=on_disk.local_rank, step=on_disk.step,
                                   bytes=on_disk.bytes, seconds=on_disk.seconds, source=on_disk.source,
                                   path=on_disk.payload_path)
        else:
            logger.warning("cycle %s: no just-in-time state saved on this node (%s); the restart falls back to the "
                           "last periodic checkpoint unless another node saved one", cycle, reason)
            self._events.record_event(JitStateNotSaved(cycle=cycle, reason=reason))
            return False
        logger.info("cycle %s: rank %s saved its state of step %s (%.1f MB, %s path) in %.2f s; the launcher waited "
                    "%.2f s", cycle, record.rank, record.step, (record.bytes or 0) / 1e6, record.source,
                    record.seconds or 0.0, waited)
        self._events.record_event(record)
        return True
