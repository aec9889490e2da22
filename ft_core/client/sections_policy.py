"""The sections-and-timeouts policy: one set of rules for every fault tolerance front end.

The loop integration (:mod:`ft_core.client.integration`) and the Lightning callbacks
(:mod:`ptl_resiliency`) feed a policy what happened in the training run and do what it answers:
open and close sections on their client, agree with the other ranks, calculate timeouts. This
module is pure: no I/O, no torch, no client; its decisions can be tested as tables.

Sections (the section API; their placement follows the reference's training-loop integration):

* ``setup`` opens when fault tolerance starts and closes at the first training or evaluation
  step.
* ``step`` wraps each training and evaluation step, except the first ``num_warmup_iters``
  (default 1) training steps of a run and the first ones of each evaluation run (a training step
  starts a new evaluation run). First steps are often much slower (allocation, compilation, data
  loader start-up) and would force a long ``step`` timeout; they fall into out-of-section time.
* ``checkpointing`` wraps checkpoint saving, including the finalisation of asynchronous saves.
  Nested start/end pairs count once: the outermost pair opens and closes the section.

Timeouts (with ``calculate_timeouts``), calculated after each checkpoint save that every rank
completed and at the end of the run, each once the run has the data for it:

* ``step``: at least :data:`MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE` training iterations (warm-up
  included);
* ``checkpointing``: a save was seen, and the run checkpoints synchronously: an asynchronous
  finalisation (or a checkpoint IO known to be asynchronous) makes the section's duration vary
  too much between runs;
* ``setup``: a persistent checkpoint was loaded (setup includes loading it), and a step closed
  the section (so it measured the whole setup);
* out-of-section: a persistent checkpoint was loaded and the ``step`` condition holds.

Each condition must hold on every rank: front ends reduce :meth:`SectionsPolicy.local_facts`
with an all-ranks AND before asking :meth:`SectionsPolicy.timeouts_update`, so that a rank with
different counts cannot leave the others waiting in the calculation's collective.

Heartbeats (:class:`HeartbeatsPolicy`): the heartbeat timeouts are calculated at the end of a run
that loaded and saved a checkpoint (so that the intervals include both) and did at least
:data:`MIN_ITERS_FOR_HB_TIMEOUTS` training iterations.

End of run: :func:`final_update_refusal` says when the final update must not run (a failed or
interrupted run, or a clean ``SystemExit(0)`` from inside the training loop of a multi-rank job;
after a graceful stop it may run: every rank stopped after the same step).

Configuration: :func:`sections_config_error` and :func:`heartbeats_config_error` say whether the
monitor's timeouts can watch a front end at all.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import NamedTuple, Optional

from ft_core.wire.config import ConfigError
from ft_core.wire.errors import GracefulStopExit

SECTION_SETUP = "setup"
SECTION_STEP = "step"
SECTION_CHECKPOINTING = "checkpointing"
SECTIONS = (SECTION_SETUP, SECTION_STEP, SECTION_CHECKPOINTING)
"""The sections every sections front end uses; all must be in ``rank_section_timeouts``."""

OUT_OF_SECTION = "out-of-section"
"""How log lines name the out-of-section timeout."""

NUM_WARMUP_ITERS = 1
"""Default number of training steps per run (and evaluation steps per evaluation run) left out
of the ``step`` section."""

MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE = 16
"""Training iterations a run must have done before it calculates the ``step`` (and the
out-of-section) timeout."""

MIN_ITERS_FOR_HB_TIMEOUTS = 2
"""Training iterations a run must have done before it calculates heartbeat timeouts: with fewer,
the intervals say nothing about a step."""

_EXAMPLE_SECTIONS = (
    "E.g. ft_launcher --ft-param-rank_section_timeouts=setup:600,step:180,checkpointing:420 "
    "--ft-param-rank_out_of_section_timeout=300 (null means: calculate)"
)


# ---------------------------------------------------------------------- answers


SectionChange = tuple[Optional[str], Optional[str]]
"""``(end, start)``: the section to close, then the section to open; None: none.

An event changes at most one section each way. A plain tuple, not a named one: front ends unpack
it on the hot path (``end, start = policy.training_step_started()``), and Python unpacks an exact
tuple several times faster. Events that can only close a section (a step ended) answer with its
name or None.
"""

NO_CHANGE: SectionChange = (None, None)
# The answers are constants: the per-step events allocate nothing.
_START_SETUP: SectionChange = (None, SECTION_SETUP)
_END_SETUP: SectionChange = (SECTION_SETUP, None)
_END_SETUP_START_STEP: SectionChange = (SECTION_SETUP, SECTION_STEP)
_START_STEP: SectionChange = (None, SECTION_STEP)
_START_CHECKPOINTING: SectionChange = (None, SECTION_CHECKPOINTING)
_END_CHECKPOINTING: SectionChange = (SECTION_CHECKPOINTING, None)


class CheckpointingEnd(NamedTuple):
    """The answer to :meth:`SectionsPolicy.checkpointing_ended`.

    Attributes:
        change: Sections to close.
        update_timeouts: A save completed on every rank and timeouts are calculated: run the
            (collective) timeouts update now.
        unmatched: The end had no matching start and was ignored.
    """

    change: SectionChange
    update_timeouts: bool = False
    unmatched: bool = False


_UNMATCHED_END = CheckpointingEnd(NO_CHANGE, unmatched=True)
_NESTED_END = CheckpointingEnd(NO_CHANGE)
_PLAIN_END = CheckpointingEnd(_END_CHECKPOINTING)
_SAVE_END = CheckpointingEnd(_END_CHECKPOINTING, update_timeouts=True)


class SectionsFacts(NamedTuple):
    """What one rank knows about its run; each field must hold on every rank to count.

    Reduce with an all-ranks AND (``Collectives.all_true``) and pass the result to
    :meth:`SectionsPolicy.timeouts_update`.
    """

    enough_iters: bool
    checkpoint_saved: bool
    sync_checkpointing: bool
    persistent_checkpoint_loaded: bool
    setup_ended_by_step: bool


class TimeoutsUpdate(NamedTuple):
    """Which section timeouts to calculate now.

    Attributes:
        selected_sections: For ``calculate_and_set_section_timeouts(selected_sections=...)``.
        calc_out_of_section: For ``calculate_and_set_section_timeouts(calc_out_of_section=...)``.
        skip_reason: None when the update should run; otherwise why nothing is updated (the
            text of a log line).
        notes: Timeouts left out on purpose although there was data, and why (log lines).
    """

    selected_sections: tuple[str, ...]
    calc_out_of_section: bool
    skip_reason: Optional[str] = None
    notes: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        """True when timeouts should be calculated."""
        return self.skip_reason is None

    def describe(self) -> str:
        """The timeouts concerned, for log lines, e.g. ``"checkpointing, step, out-of-section"``."""
        names = list(self.selected_sections) + ([OUT_OF_SECTION] if self.calc_out_of_section else [])
        return ", ".join(names) or "none"


class HeartbeatsFacts(NamedTuple):
    """What one rank knows for the heartbeat timeouts; reduce with an all-ranks AND."""

    checkpoint_loaded: bool
    checkpoint_saved: bool
    enough_iters: bool


class HeartbeatsUpdate(NamedTuple):
    """Whether to calculate heartbeat timeouts; ``skip_reason`` says why not (a log line)."""

    calculate: bool
    skip_reason: Optional[str] = None


# ---------------------------------------------------------------------- the sections policy


class SectionsPolicy:
    """The section and timeout decisions of one training run (see the module docstring).

    Args:
        calculate_timeouts: Whether timeouts are calculated from observed durations.
        num_warmup_iters: Training steps per run, and evaluation steps per evaluation run, left
            out of the ``step`` section (>= 0).
        async_checkpointing: The front end knows that checkpoints are saved asynchronously
            (e.g. Lightning's ``AsyncCheckpointIO``): the ``checkpointing`` timeout is never
            calculated, as after an asynchronous finalisation.
    """

    __slots__ = (
        "calculate_timeouts", "num_warmup_iters", "async_checkpointing",
        "_setup_open", "_setup_ended_by_step", "_step_open", "_ckpt_depth",
        "train_iters", "_eval_iters", "_eval_run_at", "checkpoint_saves", "_async_seen", "_persistent_loaded",
        "reported_notes",
    )

    def __init__(
        self,
        calculate_timeouts: bool,
        num_warmup_iters: int = NUM_WARMUP_ITERS,
        async_checkpointing: bool = False,
    ) -> None:
        self.calculate_timeouts = calculate_timeouts
        self.num_warmup_iters = num_warmup_iters
        self.async_checkpointing = async_checkpointing
        self._setup_open = False
        self._setup_ended_by_step = False
        self._step_open = False
        self._ckpt_depth = 0
        self.train_iters = 0  # training steps that ended in this run, warm-up included
        self._eval_iters = 0  # steps of the current evaluation run
        self._eval_run_at = 0  # train_iters when it began: a training step starts a new one
        self.checkpoint_saves = 0  # saves completed on every rank in this run
        self._async_seen = False
        self._persistent_loaded = False
        self.reported_notes: set[str] = set()  # notes already logged at INFO in this run (see policy_actions)

    # ------------------------------------------------------------------ events

    def setup_started(self) -> SectionChange:
        """Fault tolerance started: open ``setup``."""
        if self._setup_open:
            return NO_CHANGE
        self._setup_open = True
        return _START_SETUP

    def training_step_started(self) -> SectionChange:
        """A training step begins: close ``setup``; open ``step`` after the warm-up steps."""
        # Checked inline, not in a helper: this runs every step, and a call costs as much as the rest.
        if self._setup_open:
            return self._end_setup(self.train_iters)
        if self._step_open or self.train_iters < self.num_warmup_iters:
            return NO_CHANGE
        self._step_open = True
        return _START_STEP

    def training_step_ended(self) -> Optional[str]:
        """A training step ended: the section to close (``step`` if it was opened), or None."""
        self.train_iters += 1
        if self._step_open:
            self._step_open = False
            return SECTION_STEP
        return None

    def eval_step_started(self) -> SectionChange:
        """An evaluation step begins: close ``setup``; open ``step`` after the warm-up steps."""
        if self._eval_run_at != self.train_iters:  # training went on: a new evaluation run warms up
            self._eval_run_at = self.train_iters
            self._eval_iters = 0
        if self._setup_open:
            return self._end_setup(self._eval_iters)
        if self._step_open or self._eval_iters < self.num_warmup_iters:
            return NO_CHANGE
        self._step_open = True
        return _START_STEP

    def eval_step_ended(self) -> Optional[str]:
        """An evaluation step ended: the section to close (``step`` if it was opened), or None."""
        self._eval_iters += 1
        if self._step_open:
            self._step_open = False
            return SECTION_STEP
        return None

    def step_abandoned(self) -> Optional[str]:
        """A step that began will not end (e.g. Lightning skipped the rest of an epoch): the
        section to close, or None."""
        if self._step_open:
            self._step_open = False
            return SECTION_STEP
        return None

    def _end_setup(self, iters_so_far: int) -> SectionChange:
        """The first step of the run begins (training or evaluation)."""
        self._setup_open = False
        self._setup_ended_by_step = True
        if iters_so_far >= self.num_warmup_iters:
            self._step_open = True
            return _END_SETUP_START_STEP
        return _END_SETUP

    def checkpointing_started(self) -> SectionChange:
        """Checkpoint work begins (a save, a removal, an asynchronous finalisation)."""
        self._ckpt_depth += 1
        return _START_CHECKPOINTING if self._ckpt_depth == 1 else NO_CHANGE

    def checkpointing_ended(self, is_async_finalization: bool = False, completes_save: bool = True) -> CheckpointingEnd:
        """Checkpoint work ended.

        Args:
            is_async_finalization: The work was the finalisation of an asynchronous save:
                from now on the ``checkpointing`` timeout is not calculated in this run.
            completes_save: The work was a save that every rank completed here, so that a
                collective may run (False for work on some ranks only, or a failed save). Only
                the outermost end of a save that is not a finalisation counts.
        """
        if self._ckpt_depth == 0:
            return _UNMATCHED_END
        self._ckpt_depth -= 1
        if is_async_finalization:
            self._async_seen = True
        if self._ckpt_depth:
            return _NESTED_END
        if is_async_finalization or not completes_save:
            return _PLAIN_END
        self.checkpoint_saves += 1
        return _SAVE_END if self.calculate_timeouts else _PLAIN_END

    def checkpoint_loaded(self, persistent: bool = True) -> None:
        """A checkpoint was loaded; a persistent one makes ``setup`` timeouts calculable.

        Args:
            persistent: False for a local (node-private, in-memory) checkpoint, whose load time
                says little about a load from persistent storage.
        """
        if persistent:
            self._persistent_loaded = True

    def run_ended(self) -> tuple[str, ...]:
        """The run ends: the sections this policy opened, to close in this order."""
        end = []
        if self._ckpt_depth:
            end.append(SECTION_CHECKPOINTING)
        if self._step_open:
            end.append(SECTION_STEP)
        if self._setup_open:
            end.append(SECTION_SETUP)
        self._ckpt_depth = 0
        self._step_open = self._setup_open = False
        return tuple(end)

    # ------------------------------------------------------------------ timeouts

    def local_facts(self) -> SectionsFacts:
        """This rank's facts, to be reduced with an all-ranks AND."""
        return SectionsFacts(
            enough_iters=self.train_iters >= MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE,
            checkpoint_saved=self.checkpoint_saves > 0,
            sync_checkpointing=not (self.async_checkpointing or self._async_seen),
            persistent_checkpoint_loaded=self._persistent_loaded,
            setup_ended_by_step=self._setup_ended_by_step,
        )

    def timeouts_update(self, agreed: SectionsFacts) -> TimeoutsUpdate:
        """Which timeouts to calculate, given facts that hold on every rank.

        Args:
            agreed: :meth:`local_facts` reduced over all ranks (or this rank's alone without a
                process group).
        """
        if not self.calculate_timeouts:
            return TimeoutsUpdate((), False, "calculate_timeouts is off")
        selected = []
        notes = []
        if agreed.checkpoint_saved:
            if agreed.sync_checkpointing:
                selected.append(SECTION_CHECKPOINTING)
            else:
                notes.append("checkpointing timeout not calculated: asynchronous checkpoint finalisation "
                             "makes its duration vary too much between runs")
        if agreed.persistent_checkpoint_loaded and agreed.setup_ended_by_step:
            selected.append(SECTION_SETUP)
        if agreed.enough_iters:
            selected.append(SECTION_STEP)
        calc_out_of_section = agreed.persistent_checkpoint_loaded and agreed.enough_iters
        if not selected and not calc_out_of_section:
            reason = (
                f"too little data ({self.train_iters} training iterations, need "
                f"{MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE}; checkpoint saved: {agreed.checkpoint_saved}; "
                f"persistent checkpoint loaded: {agreed.persistent_checkpoint_loaded})"
            )
            return TimeoutsUpdate((), False, reason, tuple(notes))
        return TimeoutsUpdate(tuple(selected), calc_out_of_section, None, tuple(notes))


# ---------------------------------------------------------------------- the heartbeats policy


class HeartbeatsPolicy:
    """What a heartbeat front end needs to know for its timeouts (see the module docstring).

    Args:
        calculate_timeouts: Whether heartbeat timeouts are calculated from observed intervals.
    """

    __slots__ = ("calculate_timeouts", "train_iters", "checkpoint_saves", "_loaded")

    def __init__(self, calculate_timeouts: bool) -> None:
        self.calculate_timeouts = calculate_timeouts
        # Training steps that ended: the front end adds 1 after each step (an attribute, not a
        # method, because it runs every step next to a ~0.5 us heartbeat).
        self.train_iters = 0
        self.checkpoint_saves = 0
        self._loaded = False

    def checkpoint_saved(self) -> None:
        """Every rank completed a checkpoint save."""
        self.checkpoint_saves += 1

    def checkpoint_loaded(self) -> None:
        """The run resumed from a checkpoint (its intervals include the load)."""
        self._loaded = True

    def local_facts(self) -> HeartbeatsFacts:
        """This rank's facts, to be reduced with an all-ranks AND."""
        return HeartbeatsFacts(
            checkpoint_loaded=self._loaded,
            checkpoint_saved=self.checkpoint_saves > 0,
            enough_iters=self.train_iters >= MIN_ITERS_FOR_HB_TIMEOUTS,
        )

    def timeouts_update(self, agreed: HeartbeatsFacts) -> HeartbeatsUpdate:
        """Whether to calculate heartbeat timeouts at the end of the run, given agreed facts."""
        if not self.calculate_timeouts:
            return HeartbeatsUpdate(False, "calculate_timeouts is off")
        if not agreed.enough_iters:
            return HeartbeatsUpdate(False, (
                f"too little data ({self.train_iters} training iterations in this run, need "
                f"{MIN_ITERS_FOR_HB_TIMEOUTS})"
            ))
        if not (agreed.checkpoint_loaded and agreed.checkpoint_saved):
            return HeartbeatsUpdate(False, (
                "a run must both load and save a checkpoint so that the intervals include them "
                f"(this run: loaded={agreed.checkpoint_loaded}, saved={agreed.checkpoint_saved})"
            ))
        return HeartbeatsUpdate(True)


# ---------------------------------------------------------------------- end of run


def is_graceful_stop(exception: Optional[BaseException]) -> bool:
    """True for :class:`~ft_core.client.graceful_stop.GracefulStopExit`: every rank agreed to stop after
    the same step and saved a checkpoint; training did not complete."""
    return isinstance(exception, GracefulStopExit)


def is_interruption(exception: BaseException) -> bool:
    """True for a ``SystemExit`` that means "stopped before the end", not "done": a graceful stop,
    or Lightning's ``SIGTERMException`` (a ``SystemExit()`` raised after SIGTERM, on whichever rank
    received it; matched by name, as this module does not import Lightning)."""
    return is_graceful_stop(exception) or any(cls.__name__ == "SIGTERMException" for cls in type(exception).__mro__)


def is_clean_exit(exception: BaseException) -> bool:
    """True for ``SystemExit(0)`` / ``SystemExit()`` / ``sys.exit()``: a deliberate, successful end.

    Not for an interruption (:func:`is_interruption`), although it exits with status 0 too.
    """
    return isinstance(exception, SystemExit) and exception.code in (0, None) and not is_interruption(exception)


def final_update_refusal(exception: Optional[BaseException], world_size: int) -> Optional[str]:
    """Why the end-of-run timeouts update must not run, or None when it may.

    Args:
        exception: What ended the run, or None when it ended normally.
        world_size: Ranks in the job: a collective after an exception raised inside the training
            loop could wait for ranks that never come.
    """
    if exception is None or is_graceful_stop(exception):  # a graceful stop: every rank is at the same point
        return None
    if is_interruption(exception):
        return f"the run was interrupted ({type(exception).__name__}), possibly on some ranks only"
    if not is_clean_exit(exception):
        return f"the run failed ({exception!r}) and its intervals may include the failure"
    if world_size > 1:
        return "the run exited from inside the training loop, where other ranks may not join a collective"
    return None


# ---------------------------------------------------------------------- configuration


def sections_config_error(
    who: str,
    section_timeouts: Mapping[str, Optional[float]],
    out_of_section: Optional[float],
    calculate_timeouts: bool,
    *,
    initial_heartbeat: Optional[float] = None,
    opens_only_these: bool = False,
) -> Optional[ConfigError]:
    """The reason a sections front end cannot work with the monitor's timeouts, or None.

    Args:
        who: Names the front end in the message (e.g. ``"ft_core.client.integration"``).
        section_timeouts: The configured ``rank_section_timeouts`` (None: infinite).
        out_of_section: The configured ``rank_out_of_section_timeout``.
        calculate_timeouts: Infinite timeouts are acceptable when they are to be calculated.
        initial_heartbeat: The ``initial_rank_heartbeat_timeout`` the monitor enforces. It must
            be infinite: a sections front end sends no heartbeats, and sections are not
            heartbeats, so a finite one would stop the rank when it passes.
        opens_only_these: The front end opens no section but :data:`SECTIONS` (the Lightning
            sections callback; the loop integration's users may open their own). A configured
            section it never opens is then an error, as in the reference: it is most likely a
            typo (``checkpoint`` for ``checkpointing``) that would leave the real section without
            its intended timeout.

    Returns:
        A :class:`~ft_core.wire.config.ConfigError` naming what is missing, unknown or infinite,
        or None.
    """
    if initial_heartbeat is not None:
        return ConfigError(
            f"{who}: initial_rank_heartbeat_timeout={initial_heartbeat!r} is finite, but this front end "
            "sends no heartbeats and sections are not heartbeats, so the monitor would stop this rank "
            f"{initial_heartbeat:g} s after it connected. For the sections API pass "
            "--ft-param-initial_rank_heartbeat_timeout=null --ft-param-rank_heartbeat_timeout=null "
            "(or null for both in the config file)."
        )
    missing = [name for name in SECTIONS if name not in section_timeouts]
    if missing:
        return ConfigError(
            f"{who}: rank_section_timeouts must configure the sections {', '.join(SECTIONS)}; "
            f"missing: {', '.join(missing)} (configured: {dict(section_timeouts)!r}). {_EXAMPLE_SECTIONS}"
        )
    never_opened = [name for name in section_timeouts if name not in SECTIONS] if opens_only_these else []
    if never_opened:
        named = ", ".join(_with_closest(name) for name in never_opened)
        return ConfigError(
            f"{who}: rank_section_timeouts configures {named}, which this front end never opens (it opens "
            f"{', '.join(SECTIONS)} only); remove it, or fix the name. {_EXAMPLE_SECTIONS}"
        )
    infinite = [name for name, value in section_timeouts.items() if value is None]
    if out_of_section is None:
        infinite.append(OUT_OF_SECTION)
    if infinite and not calculate_timeouts:
        return ConfigError(
            f"{who}: hang detection is incomplete because a timeout is infinite ({', '.join(infinite)}; "
            f"rank_section_timeouts={dict(section_timeouts)!r}, rank_out_of_section_timeout={out_of_section!r}) "
            "and calculate_timeouts=False. Give every section and the out-of-section time a timeout, or "
            "pass calculate_timeouts=True."
        )
    return None


def _with_closest(name: str) -> str:
    """``'checkpoint' (did you mean 'checkpointing'?)`` for a section name that looks like a typo."""
    close = difflib.get_close_matches(name, SECTIONS, n=1, cutoff=0.6)
    return f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def heartbeats_config_error(
    who: str,
    initial: Optional[float],
    subsequent: Optional[float],
    out_of_section: Optional[float],
    calculate_timeouts: bool,
) -> Optional[ConfigError]:
    """The reason a heartbeat front end cannot work with the monitor's timeouts, or None.

    Args:
        who: Names the front end in the message.
        initial: ``initial_rank_heartbeat_timeout`` (None: infinite).
        subsequent: ``rank_heartbeat_timeout``.
        out_of_section: ``rank_out_of_section_timeout``: must be infinite, since a heartbeat
            front end opens no section and the monitor would stop the rank after it.
        calculate_timeouts: Infinite heartbeat timeouts are acceptable when they are to be
            calculated.
    """
    if out_of_section is not None:
        return ConfigError(
            f"{who}: rank_out_of_section_timeout={out_of_section!r} is set, but this callback opens no "
            f"sections, so the monitor would stop this rank after {out_of_section:g} s. Pass "
            "--ft-param-rank_out_of_section_timeout=null, or use FaultToleranceSectionsCallback."
        )
    if (initial is None or subsequent is None) and not calculate_timeouts:
        return ConfigError(
            f"{who}: heartbeat hang detection is off because a heartbeat timeout is infinite "
            f"(initial_rank_heartbeat_timeout={initial!r}, rank_heartbeat_timeout={subsequent!r}) and "
            "calculate_timeouts=False. Set both timeouts, e.g. ft_launcher "
            "--ft-param-initial_rank_heartbeat_timeout=600 --ft-param-rank_heartbeat_timeout=300, or "
            "pass calculate_timeouts=True."
        )
    return None
