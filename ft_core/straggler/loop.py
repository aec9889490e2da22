"""Straggler detection for a hand-written loop, with the Lightning callback's flags and actions.

:func:`ft_core.integration.straggler_detection` returns a :class:`StragglerLoop`::

    stragglers = ft_integration.straggler_detection(report_time_interval=300, action="replace")
    ddp = DistributedDataParallel(model)
    stragglers.instrument(ddp)               # forward hooks, one gradient hook
    for batch in data:
        train_step(ddp, batch)
        outcome = stragglers.on_training_step_end()   # every rank; a collective at report steps
        if outcome is not None and outcome.stop:
            save_checkpoint(); break                  # stop: save and leave, do not mark finished
        if time_to_save:
            save_checkpoint()
            stragglers.on_checkpoint_saved()          # "replace": this node leaves now (ExcludeThisNode)
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from ft_core.straggler.engine import DEFAULT_MIN_SAMPLES, SCORE_NAMES, StragglerEngine
from ft_core.straggler.outcome import DEFAULT_REPLACE_AFTER, ReportHandler, StragglerOutcome, request_node_exclusion
from ft_core.straggler.scores import Report

__all__ = ["StragglerLoop"]


class StragglerLoop:
    """Straggler detection state for one training loop on one rank.

    Args:
        report_time_interval: Seconds between reports (default 300).
        relative_threshold: Flag a rank or node whose relative score is below this (default 0.8).
        individual_threshold: Flag a rank whose individual score is below this (default 0.7); None: off.
        action: ``"report"`` (default), ``"stop"`` or ``"replace"`` (see docs/stragglers.md).
        replace_after: Reports in a row before ``"replace"`` acts (default 3).
        num_to_print: Worst ranks named per report line (default 5).
        min_samples: Samples an interval needs for a rank to be scored (default 8).
        profiling_interval: Measure every n-th step (default 1).
        logger: Where the report lines go.
        node_name: This node's name in reports and events (default: the host name).
    """

    def __init__(self, report_time_interval: float = 300.0, relative_threshold: Optional[float] = 0.8,
                 individual_threshold: Optional[float] = 0.7, action: str = "report",
                 replace_after: int = DEFAULT_REPLACE_AFTER, num_to_print: int = 5,
                 min_samples: int = DEFAULT_MIN_SAMPLES, profiling_interval: int = 1,
                 logger: Optional[logging.Logger] = None, node_name: Optional[str] = None) -> None:
        scores = [name for name, threshold in zip(SCORE_NAMES, (relative_threshold, individual_threshold),
                                                  strict=True) if threshold is not None]
        self.engine = StragglerEngine(report_time_interval, scores, profiling_interval, node_name,
                                      min_samples=min_samples)
        self.handler = ReportHandler(relative_threshold, individual_threshold, num_to_print, action, replace_after,
                                     logger)
        self.last_outcome: Optional[StragglerOutcome] = None
        self.last_report: Optional[Report] = None  # the latest report's scores and timings
        self._leave_reason: Optional[str] = None
        self._left = False

    def instrument(self, model: torch.nn.Module) -> bool:
        """Hook ``model`` (a DDP: the module it wraps; or a plain module); True if the backward is measured."""
        ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
        return self.engine.timer.attach(ddp.module if ddp is not None else model)

    def on_training_step_end(self) -> Optional[StragglerOutcome]:
        """Call after every training step on every rank: the outcome at report steps (a collective on
        detection's own process group), else None.

        The report steps are counted in training forwards (the module in training mode, autograd
        recording): evaluation forwards, also on some ranks only, do not move them.
        """
        if not self.engine.exchange.due(self.engine.timer.steps):
            return None
        report = self.engine.report()
        self.last_report = report
        rank = report.rank or 0
        outcome = self.handler.handle(report, rank, int(os.environ.get("LOCAL_RANK", "0")))
        self.last_outcome = outcome
        if self.engine.rank_to_node.get(rank) in outcome.replace_nodes and self._leave_reason is None:
            self._leave_reason = (f"straggler: node {self.engine.node_name} flagged in "
                                  f"{self.handler.replace_after} straggler reports in a row")
        return outcome

    def on_eval_end(self) -> None:
        """After an evaluation: the next step is left out."""
        self.engine.timer.skip_next()

    def on_checkpoint_saved(self) -> bool:
        """After every rank saved a checkpoint: the next step is left out; a node to be replaced
        leaves now. Returns True when this call asked the launcher for ``ExcludeThisNode``."""
        self.engine.timer.skip_next()
        if self._leave_reason is None or self._left:
            return False
        self._left = request_node_exclusion(self._leave_reason)
        return self._left

    def shutdown(self) -> None:
        """Remove the forward hooks."""
        self.engine.timer.detach()
