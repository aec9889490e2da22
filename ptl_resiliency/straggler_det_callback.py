"""``StragglerDetectionCallback``: fail-slow ranks and nodes in a Lightning run. See ``docs/stragglers.md``.

The reference's constructor arguments, with defaults added, plus ours (``min_samples``,
``action``, ``replace_after``). Each rank measures its own compute per step (forward start to its
last gradient: :mod:`ft_core.straggler.timing`); about every ``report_time_interval``
seconds, at a step all ranks agreed on, one small all-gather exchanges the interval medians and
every rank gets the same scores (:mod:`ft_core.straggler.engine`); :mod:`ft_core.straggler.outcome`
flags, logs, tells the launcher and decides the action.

Per step the callback costs the hooks only: Lightning's per-batch callback hooks are not defined
(each would cost a dispatch); ``on_train_batch_end`` is set on the instance for the report step alone.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from ft_core.client.ranklog import configure_rank_logging
from ft_core.straggler.engine import DEFAULT_MIN_SAMPLES, StragglerEngine
from ft_core.straggler.outcome import (
    ACTIONS,
    DEFAULT_REPLACE_AFTER,
    ReportHandler,
    StragglerOutcome,
    request_node_exclusion,
    scores_summary,
)
from ft_core.wire.errors import GracefulStopExit
from ptl_resiliency._checkpoint_hooks import KIND_SAVE, CheckpointHooks
from ptl_resiliency._graceful_stop import last_checkpoint_path
from ptl_resiliency._lightning import Callback, TrainerFn, pl

__all__ = ["StragglerDetectionCallback"]


class StragglerDetectionCallback(Callback):
    """Detect straggler ranks and nodes during ``fit`` and report them, stop, or replace the node.

    Args:
        report_time_interval: Seconds between reports (default 300).
        calc_relative_gpu_perf: Score each rank against the median rank (default True).
        calc_individual_gpu_perf: Score each rank against its own best interval (default True).
        num_gpu_perf_scores_to_print: N best and worst scores listed under the reference's
            headings ("GPU relative performance:", "GPU individual performance:"), and worst ranks
            named in our report line; 0: no listings, our line only when something is flagged
            (default 5).
        gpu_relative_perf_threshold: Flag a rank or node whose relative score is below this
            (default 0.8: about 1.25x slower than the median rank).
        gpu_individual_perf_threshold: Flag a rank whose individual score is below this (default 0.7:
            about 1.4x slower than its own best interval).
        stop_if_detected: On any flag, save a checkpoint and stop gracefully (exit 0, run not
            marked finished), as the reference (default False).
        enable_ptl_logging: Log min/median/max scores to the Trainer's loggers (default False).
        profiling_interval: Measure every n-th step (default 1).
        logger_name: The logger for the report lines.
        min_samples: Ours: samples a rank needs in an interval to be scored (default 8).
        action: Ours: ``"report"`` (default), ``"stop"`` (same as ``stop_if_detected=True``) or
            ``"replace"``: a node flagged in ``replace_after`` reports in a row leaves the job
            right after the next checkpoint is saved (its ranks send ``ExcludeThisNode``), when
            the job can go on without it (a spare waits, or ``--nnodes`` MIN allows one node
            fewer); otherwise ``ft_launcher`` keeps it, says why, and training goes on.
        replace_after: Ours: K for ``action="replace"`` (default 3).
        node_name: Ours: this node's name in reports and events (default: the host name), as the
            reference's ``Detector.initialize(node_name=...)``.

    Raises:
        ValueError: Neither score requested, or a bad value.
    """

    # Set on the instance only for the step that needs them (each defined hook costs a dispatch per step).
    on_train_batch_end = None  # type: ignore[assignment]  # the report step
    on_train_batch_start = None  # type: ignore[assignment]  # the step after the checkpoint a replaced node leaves at

    def __init__(
        self,
        report_time_interval: float = 300.0,
        calc_relative_gpu_perf: bool = True,
        calc_individual_gpu_perf: bool = True,
        num_gpu_perf_scores_to_print: int = 5,
        gpu_relative_perf_threshold: float = 0.8,
        gpu_individual_perf_threshold: float = 0.7,
        stop_if_detected: bool = False,
        enable_ptl_logging: bool = False,
        profiling_interval: int = 1,
        logger_name: Optional[str] = "nemo_logger.StragglerDetectionCallback",
        min_samples: int = DEFAULT_MIN_SAMPLES,
        action: str = "report",
        replace_after: int = DEFAULT_REPLACE_AFTER,
        node_name: Optional[str] = None,
    ) -> None:
        super().__init__()
        if not (calc_relative_gpu_perf or calc_individual_gpu_perf):
            raise ValueError("No straggler performance scores specified. Check if calc_relative_gpu_perf=True or "
                             "calc_individual_gpu_perf=True")
        if not report_time_interval > 0:
            raise ValueError(f"report_time_interval must be > 0, got {report_time_interval!r}")
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
        if profiling_interval < 1 or min_samples < 1 or num_gpu_perf_scores_to_print < 0:
            raise ValueError("profiling_interval and min_samples must be >= 1, num_gpu_perf_scores_to_print >= 0")
        self.report_time_interval = float(report_time_interval)
        self.calc_relative_gpu_perf = calc_relative_gpu_perf
        self.calc_individual_gpu_perf = calc_individual_gpu_perf
        self.num_gpu_perf_scores_to_print = num_gpu_perf_scores_to_print
        self.gpu_relative_perf_threshold = gpu_relative_perf_threshold
        self.gpu_individual_perf_threshold = gpu_individual_perf_threshold
        self.stop_if_detected = stop_if_detected or action == "stop"
        self.enable_ptl_logging = enable_ptl_logging
        self.profiling_interval = profiling_interval
        self.logger = logging.getLogger(logger_name)
        self.min_samples = min_samples
        self.action = "stop" if self.stop_if_detected else action
        self.replace_after = replace_after
        self.node_name = node_name
        self.last_outcome: Optional[StragglerOutcome] = None  # the latest report's outcome on this rank
        self._engine: Optional[StragglerEngine] = None
        self._handler: Optional[ReportHandler] = None
        self._ckpt_hooks: Optional[CheckpointHooks] = None
        self._leave_after_checkpoint: Optional[str] = None  # why, once this node is to be replaced
        self._left = False

    # ------------------------------------------------------------------ set-up

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Start detection (``fit`` only); the report lines reach the console as the other callbacks' do."""
        if stage != TrainerFn.FITTING or self._engine is not None:
            return
        if self.logger is not logging.getLogger():  # logger_name=None: the root logger, the program's own
            # INFO, and a console handler when the program set up no logging (as the FT callbacks)
            configure_rank_logging(None, self.logger.name, "ft_core.straggler")
        scores = [name for name, on in (("relative_perf_scores", self.calc_relative_gpu_perf),
                                        ("individual_perf_scores", self.calc_individual_gpu_perf)) if on]
        self._engine = StragglerEngine(self.report_time_interval, scores, self.profiling_interval,
                                       node_name=self.node_name, min_samples=self.min_samples)
        self._handler = ReportHandler(
            self.gpu_relative_perf_threshold if self.calc_relative_gpu_perf else None,
            self.gpu_individual_perf_threshold if self.calc_individual_gpu_perf else None,
            self.num_gpu_perf_scores_to_print, self.action, self.replace_after, self.logger)
        self._leave_after_checkpoint = None
        self._left = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Hook the model (DDP is built by now) and checkpoint saving."""
        engine = self._engine
        if engine is None:
            return
        # Lightning calls training_step itself (under DDP it redirects DDP's forward to it): that
        # method is the step's forward, on every strategy.
        backward = engine.timer.attach(pl_module, method="training_step")
        engine.timer.on_step_end = self._step_ended
        self._ckpt_hooks = CheckpointHooks(self._checkpoint_started, self._checkpoint_ended, False)
        self._ckpt_hooks.install(trainer)
        self.logger.debug("straggler detection: measuring forward%s", " and backward to the last gradient"
                          if backward else " only (no parameter gets a gradient)")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Remove the hooks."""
        if stage != TrainerFn.FITTING:
            return
        self._close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Remove the hooks (never raises)."""
        try:
            self._close()
        except Exception:  # the user's exception comes first
            self.logger.exception("straggler detection: cleanup failed")

    def _close(self) -> None:
        if self._engine is not None:
            self._engine.timer.detach()
        if self._ckpt_hooks is not None:
            self._ckpt_hooks.uninstall()
        self._engine, self._ckpt_hooks = None, None
        self.__dict__.pop("on_train_batch_end", None)
        self.__dict__.pop("on_train_batch_start", None)

    # ------------------------------------------------------------------ steps that are not typical

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The step after an evaluation is left out (and the evaluation's forwards never count)."""
        if self._engine is not None:
            self._engine.timer.skip_next()

    def _checkpoint_started(self, kind: str) -> None:
        pass

    def _checkpoint_ended(self, kind: str, ok: bool) -> None:
        if self._engine is not None:
            self._engine.timer.skip_next()
        if kind == KIND_SAVE and ok and self._leave_after_checkpoint and not self._left:
            # Leave at the next step's start: ModelCheckpoint may save more than once at this step
            # (a top-k file, then last.ckpt), and the spare's workers resume from the last one.
            self.on_train_batch_start = self._leave  # type: ignore[method-assign]

    def _leave(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        del self.on_train_batch_start
        if self._leave_after_checkpoint and not self._left:
            self._left = request_node_exclusion(self._leave_after_checkpoint, self.logger)

    # ------------------------------------------------------------------ reports

    def _step_ended(self, steps: int) -> None:
        # Called at the end of every training_step, on every rank: the step counts, and so the
        # report step, are the same on all ranks.
        engine = self._engine
        if engine is not None and engine.exchange.due(steps):
            self.on_train_batch_end = self._report  # type: ignore[method-assign]

    def _report(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                batch_idx: int) -> None:
        del self.on_train_batch_end  # back to the class's None: no dispatch on the next steps
        engine, handler = self._engine, self._handler
        if engine is None or handler is None:
            return
        report = engine.report()  # the collective, every rank at this step
        local_rank = int(os.environ.get("LOCAL_RANK", trainer.local_rank))
        outcome = handler.handle(report, trainer.global_rank, local_rank)
        self.last_outcome = outcome
        if self.enable_ptl_logging:
            self._log_scores(pl_module, report)
        if engine.rank_to_node.get(trainer.global_rank) in outcome.replace_nodes and not self._leave_after_checkpoint:
            self._leave_after_checkpoint = (f"straggler: node {engine.node_name} flagged in {self.replace_after} "
                                            "straggler reports in a row")
        if outcome.stop:
            self._stop(trainer)

    def _log_scores(self, pl_module: pl.LightningModule, report: Any) -> None:
        values: dict[str, float] = {}
        for prefix, scores, on in (("gpu_relative_perf", report.gpu_relative_perf_scores, self.calc_relative_gpu_perf),
                                   ("gpu_individual_perf", report.gpu_individual_perf_scores,
                                    self.calc_individual_gpu_perf)):
            if on:
                low, mid, high = scores_summary(scores)
                values.update({f"{prefix}/min": low, f"{prefix}/median": mid, f"{prefix}/max": high})
        try:
            pl_module.log_dict(values, logger=True, batch_size=1, rank_zero_only=True)
        except Exception as err:  # logging scores must never end the run
            self.logger.error("straggler detection: could not log the scores: %s", err)

    def _stop(self, trainer: pl.Trainer) -> None:
        """Save (every rank takes part) and leave ``fit`` as a graceful stop: exit 0, no finished flag."""
        self.logger.error("Detected stragglers. Terminating training...")
        path = last_checkpoint_path(trainer)
        if path is not None:
            trainer.save_checkpoint(path)
        raise GracefulStopExit(int(trainer.global_step), "straggler detected", path)
