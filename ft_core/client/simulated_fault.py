"""Simulated faults for testing fault tolerance end to end: one rank kills or stops itself.

A fault is described by :class:`SimulatedFaultParams` and scheduled with
:func:`setup_simulated_fault`, which every rank calls at the same point of its program. Rank 0
resolves the random choices (which rank fails, which kind of fault when ``random``, the delay)
and, when the job has a process group, broadcasts the plan as JSON text through
:mod:`ft_core.client.collectives` (``torch.distributed`` by default, a Lightning strategy in the
callbacks) so that all ranks agree and log the same plan. The failing rank starts a daemon
thread that, after the delay, sends itself ``SIGKILL`` (``rank_killed``: the process dies at
once) or ``SIGSTOP`` (``rank_hung``: the process freezes, as a rank stuck in a collective would,
and only the rank monitor can notice).

Like the rest of ``ft_core``, this module never imports torch at import time; the default
collectives use it only if the program already imported ``torch.distributed``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional, Union

from ft_core.client.collectives import Collectives, default_collectives, rank_and_world_size
from ft_core.client.ranklog import RankLoggerAdapter

logger = logging.getLogger(__name__)

FAULT_RANK_KILLED = "rank_killed"
FAULT_RANK_HUNG = "rank_hung"
FAULT_RANDOM = "random"
FAULT_TYPES = (FAULT_RANK_KILLED, FAULT_RANK_HUNG, FAULT_RANDOM)

# The signal each resolved fault type sends to the failing rank.
FAULT_SIGNALS = {FAULT_RANK_KILLED: signal.SIGKILL, FAULT_RANK_HUNG: signal.SIGSTOP}
_RESOLVED_TYPES = (FAULT_RANK_KILLED, FAULT_RANK_HUNG)


@dataclass(frozen=True)
class SimulatedFaultParams:
    """What fault to simulate, where and when.

    Attributes:
        fault_type: ``"rank_killed"`` (the rank gets ``SIGKILL``), ``"rank_hung"`` (the rank
            gets ``SIGSTOP`` and freezes) or ``"random"`` (one of the two, chosen by rank 0).
        base_delay: Seconds from :func:`setup_simulated_fault` to the fault.
        rand_delay: Up to this many extra seconds, drawn uniformly by rank 0.
        rank_to_fail: The global rank that fails; ``None``: a random rank chosen by rank 0.

    Raises:
        ValueError: A field has an invalid value (the message names it and echoes the value).
    """

    fault_type: str
    base_delay: float
    rand_delay: float = 0.0
    rank_to_fail: Optional[int] = None

    def __post_init__(self) -> None:
        if self.fault_type not in FAULT_TYPES:
            raise ValueError(
                f"simulated fault: fault_type must be one of {', '.join(FAULT_TYPES)}, "
                f"got {self.fault_type!r}"
            )
        for name in ("base_delay", "rand_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"simulated fault: {name} must be a finite number of seconds >= 0, got {value!r}"
                )
            object.__setattr__(self, name, float(value))
        rank = self.rank_to_fail
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(
                f"simulated fault: rank_to_fail must be a rank number >= 0 or None, got {rank!r}"
            )

    @classmethod
    def from_value(cls, value: Union[SimulatedFaultParams, Mapping[str, Any]]) -> SimulatedFaultParams:
        """Accept an instance (returned as is) or a mapping with the same field names.

        Raises:
            ValueError: Unknown or missing keys, invalid values, or a value of another type.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            known = [f.name for f in fields(cls)]
            unknown = sorted(str(k) for k in value if k not in known)
            if unknown:
                raise ValueError(
                    f"simulated fault: unknown key(s) {', '.join(unknown)} in {dict(value)!r}; "
                    f"valid keys are: {', '.join(known)}"
                )
            missing = [k for k in ("fault_type", "base_delay") if k not in value]
            if missing:
                raise ValueError(
                    f"simulated fault: missing key(s) {', '.join(missing)} in {dict(value)!r}"
                )
            return cls(**dict(value))
        raise ValueError(
            "simulated fault parameters must be a SimulatedFaultParams or a dict with keys "
            f"fault_type, base_delay, rand_delay, rank_to_fail; got {value!r}"
        )


@dataclass(frozen=True)
class FaultPlan:
    """A resolved fault, identical on all ranks.

    Attributes:
        rank_to_fail: Global rank that fails.
        fault_type: ``"rank_killed"`` or ``"rank_hung"`` (never ``"random"``).
        delay: Seconds from scheduling to the fault.
    """

    rank_to_fail: int
    fault_type: str
    delay: float


def plan_simulated_fault(
    params: Union[SimulatedFaultParams, Mapping[str, Any]],
    rng: Optional[random.Random] = None,
    collectives: Optional[Collectives] = None,
) -> FaultPlan:
    """Resolve the random choices of ``params`` so that all ranks agree.

    A collective when the job has a process group: every rank must call it. Without one, a
    single process (``WORLD_SIZE`` unset or 1) decides alone; several processes without a
    process group must name ``rank_to_fail`` (they cannot agree otherwise), and a ``random``
    fault type or delay is then drawn by the failing rank only.

    Args:
        params: The fault description.
        rng: Source of randomness (default: a fresh ``random.Random``), used on rank 0.
        collectives: How the ranks agree (default: ``torch.distributed`` when initialised):
            rank 0 broadcasts its plan as JSON text.

    Returns:
        The plan, the same on every rank.

    Raises:
        ValueError: Invalid parameters, ``rank_to_fail`` outside the world, or several processes
            without a process group and no ``rank_to_fail``.
    """
    params = SimulatedFaultParams.from_value(params)
    collectives = collectives if collectives is not None else default_collectives()
    rank, world_size, grouped = rank_and_world_size(collectives)
    if params.rank_to_fail is not None and params.rank_to_fail >= world_size:
        raise ValueError(
            f"simulated fault: rank_to_fail={params.rank_to_fail} but the world has only "
            f"{world_size} rank(s)"
        )
    if not grouped and world_size > 1 and params.rank_to_fail is None:
        raise ValueError(
            f"simulated fault: WORLD_SIZE={world_size} but no torch.distributed process group is "
            "initialised, so the ranks cannot agree on a random rank; set rank_to_fail"
        )
    rng = rng or random.Random()
    chosen_rank = params.rank_to_fail if params.rank_to_fail is not None else rng.randrange(world_size)
    chosen_type = params.fault_type
    if chosen_type == FAULT_RANDOM:
        chosen_type = rng.choice(_RESOLVED_TYPES)
    delay = params.base_delay + (rng.uniform(0.0, params.rand_delay) if params.rand_delay else 0.0)
    plan = FaultPlan(rank_to_fail=chosen_rank, fault_type=chosen_type, delay=delay)
    if grouped:
        text = collectives.broadcast_text(json.dumps(asdict(plan)) if rank == 0 else None)
        if text is None:
            raise RuntimeError("simulated fault: rank 0 broadcast no plan")
        plan = FaultPlan(**json.loads(text))
    return plan


class SimulatedFault:
    """A scheduled fault; :meth:`cancel` it if the run ends first.

    Attributes:
        plan: The agreed plan.
        rank: This process's rank.
    """

    def __init__(self, plan: FaultPlan, rank: int) -> None:
        self.plan = plan
        self.rank = rank
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_armed(self) -> bool:
        """True on the failing rank while the fault has neither fired nor been cancelled."""
        return self._thread is not None and self._thread.is_alive() and not self._cancelled.is_set()

    def _arm(self) -> None:
        self._thread = threading.Thread(target=self._fire_later, name="ft-simulated-fault", daemon=True)
        self._thread.start()

    def _fire_later(self) -> None:
        if self._cancelled.wait(self.plan.delay):
            return
        sig = FAULT_SIGNALS[self.plan.fault_type]
        RankLoggerAdapter(logger, self.rank).warning(
            "simulated fault %s: sending %s to this process (pid %s)", self.plan.fault_type, sig.name, os.getpid(),
        )
        for handler in logging.getLogger().handlers + logger.handlers:
            try:
                handler.flush()
            except Exception:  # any handler failure: flushing is best effort, the signal matters
                pass
        os.kill(os.getpid(), sig)

    def cancel(self) -> None:
        """Prevent the fault from firing (no effect once it fired). Safe to call repeatedly."""
        self._cancelled.set()


def setup_simulated_fault(
    params: Union[SimulatedFaultParams, Mapping[str, Any]],
    rng: Optional[random.Random] = None,
    collectives: Optional[Collectives] = None,
) -> SimulatedFault:
    """Agree on a fault plan (see :func:`plan_simulated_fault`) and arm it on the failing rank.

    Every rank must call this (a collective when a process group exists). On the failing rank a
    daemon thread sends the fault's signal to this process after the planned delay.

    Returns:
        The handle; ``is_armed`` is True only on the failing rank.

    Raises:
        ValueError: As :func:`plan_simulated_fault`.
    """
    collectives = collectives if collectives is not None else default_collectives()
    plan = plan_simulated_fault(params, rng, collectives)
    rank, _world_size, _grouped = rank_and_world_size(collectives)
    fault = SimulatedFault(plan, rank)
    log = RankLoggerAdapter(logger, rank)
    if rank == plan.rank_to_fail:
        log.info("simulated fault %s scheduled on this rank in %.2f s", plan.fault_type, plan.delay)
        fault._arm()
    else:
        log.info("simulated fault %s scheduled on rank %s in %.2f s", plan.fault_type, plan.rank_to_fail, plan.delay)
    return fault
