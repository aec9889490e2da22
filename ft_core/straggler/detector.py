"""``Detector``: the plain-loop straggler detection API, shaped like the reference's
``nvidia_resiliency_ext.straggler.Detector`` (class methods, never instantiated)::

    from ft_core.straggler import Detector

    Detector.initialize(report_time_interval=60)
    Detector.instrument(ddp_model)               # ours: measure forward + backward to the last gradient
    for batch in data:
        with Detector.detection_section("step"):
            train_step(batch)
        report = Detector.generate_report_if_interval_elapsed()   # every rank, every step
        if report is not None:
            print(report.identify_stragglers(gpu_rel_threshold=0.8))
    Detector.shutdown()

Without :meth:`Detector.instrument`, each step's compute sample is the time spent in the step's
sections with ``profile_cuda=True`` (CUDA events with CUDA, the wall clock without).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Optional, Union

import torch

from ft_core.straggler.engine import SCORE_NAMES, StragglerEngine
from ft_core.straggler.scores import Report

__all__ = ["CallableId", "Detector"]


@dataclasses.dataclass(frozen=True)
class CallableId:
    """A callable to time as a detection section: ``getattr(obj, name)``."""

    obj: object
    name: str

    def __str__(self) -> str:
        owner = self.obj if inspect.ismodule(self.obj) or inspect.isclass(self.obj) else type(self.obj)
        return f"{getattr(owner, '__name__', owner)}.{self.name}"


class Detector:
    """Straggler detection for a hand-written loop (class-level state; do not instantiate)."""

    initialized: ClassVar[bool] = False
    _engine: ClassVar[Optional[StragglerEngine]] = None
    _last_report_step: ClassVar[bool] = False
    _step_compute: ClassVar[float] = 0.0  # this step's profile_cuda section time (without instrument)
    _section_entries: ClassVar[dict[str, int]] = {}
    _originals: ClassVar[dict[CallableId, Any]] = {}
    _instrumented: ClassVar[bool] = False
    profiling_interval: ClassVar[int] = 1

    def __new__(cls) -> Detector:  # noqa: D102 - the reference's class is not instantiated either
        raise RuntimeError(f"class {cls.__name__} should not be instantiated")

    @classmethod
    def initialize(
        cls,
        scores_to_compute: Union[Sequence[str], str] = "all",
        gather_on_rank0: bool = True,
        profiling_interval: int = 1,
        report_time_interval: float = 60,
        node_name: Optional[str] = None,
    ) -> None:
        """Start detection on this rank (after ``init_process_group``; every rank).

        Args:
            scores_to_compute: ``"all"`` or a list of ``"relative_perf_scores"``, ``"individual_perf_scores"``.
            gather_on_rank0: Kept for compatibility; every rank receives the whole report.
            profiling_interval: Measure every n-th step or section entry (1: all).
            report_time_interval: Seconds between reports of
                :meth:`generate_report_if_interval_elapsed`; default 60.
            node_name: This node's name in reports; default the host name.

        Raises:
            RuntimeError: Already initialized.
            ValueError: Unknown score names or a bad interval.
        """
        if cls.initialized:
            raise RuntimeError("Detector is already initialized")
        names = list(SCORE_NAMES) if str(scores_to_compute) == "all" else list(scores_to_compute)
        cls._engine = StragglerEngine(report_time_interval, names, profiling_interval, node_name,
                                      gather_on_rank0=gather_on_rank0)
        cls.profiling_interval = profiling_interval
        cls._last_report_step = False
        cls._step_compute = 0.0
        cls._section_entries = {}
        cls._originals = {}
        cls._instrumented = False
        cls.initialized = True

    @classmethod
    def _require(cls) -> StragglerEngine:
        if not cls.initialized or cls._engine is None:
            raise RuntimeError("Detector is not initialized")
        return cls._engine

    @classmethod
    def instrument(cls, model: torch.nn.Module) -> bool:
        """Measure each step's compute with hooks (ours): forward start to the last gradient.

        Args:
            model: A ``DistributedDataParallel`` (the module it wraps is hooked) or a plain module.

        Returns:
            True when the backward pass is measured too (the module has parameters with gradients).
        """
        engine = cls._require()
        ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
        cls._instrumented = True
        return engine.timer.attach(ddp.module if ddp is not None else model)

    @classmethod
    @contextlib.contextmanager
    def detection_section(cls, name: Optional[str] = None, profile_cuda: bool = True) -> Iterator[None]:
        """Time the enclosed code as section ``name`` (default: the ``with`` statement's file:line).

        Every ``profiling_interval``-th entry is timed (wall clock). With ``profile_cuda`` the time
        also counts as the rank's compute for the "gpu" scores (CUDA events with CUDA), unless
        :meth:`instrument` measures the compute.
        """
        engine = cls._require()
        if name is None:  # the `with` statement's place: this generator <- contextlib's __enter__ <- the caller
            caller = sys._getframe(0).f_back.f_back  # type: ignore[union-attr]
            name = f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else "<section>"
        entry = cls._section_entries.get(name, 0)
        cls._section_entries[name] = entry + 1
        if entry % cls.profiling_interval:
            yield
            return
        use_events = profile_cuda and engine.use_cuda and not cls._instrumented
        if use_events:
            start_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        engine.add_section_sample(name, seconds)
        if profile_cuda and not cls._instrumented:
            if use_events:
                end_event = torch.cuda.Event(enable_timing=True)
                end_event.record()
                end_event.synchronize()  # sections are the simple path; instrument() avoids this wait
                seconds = start_event.elapsed_time(end_event) / 1000.0
            cls._step_compute += seconds

    @classmethod
    def wrap_callables(cls, callable_ids: Sequence[CallableId], profile_cuda: bool = True) -> None:
        """Replace each ``getattr(obj, name)`` by a wrapper that runs it in a detection section."""
        cls._require()
        for callable_id in callable_ids:
            original = getattr(callable_id.obj, callable_id.name)
            cls._originals[callable_id] = original

            def wrapper(*args: Any, _fn: Any = original, _name: str = str(callable_id), **kwargs: Any) -> Any:
                with cls.detection_section(_name, profile_cuda=profile_cuda):
                    return _fn(*args, **kwargs)

            setattr(callable_id.obj, callable_id.name, wrapper)

    @classmethod
    def restore_original_callables(cls) -> None:
        """Undo :meth:`wrap_callables`."""
        for callable_id, original in cls._originals.items():
            setattr(callable_id.obj, callable_id.name, original)
        cls._originals = {}

    @classmethod
    def _end_step(cls) -> None:
        engine = cls._require()
        if not cls._instrumented:
            if cls._step_compute > 0.0:
                engine.timer.record(cls._step_compute)
            cls._step_compute = 0.0
            engine.timer.steps += 1

    @classmethod
    def generate_report(cls) -> Report:
        """Score the samples since the last report: a collective, call it on every rank at the same point."""
        engine = cls._require()
        return engine.report()

    @classmethod
    def generate_report_if_interval_elapsed(cls) -> Optional[Report]:
        """Call once per step on every rank: a :class:`Report` at the agreed report steps, else None."""
        engine = cls._require()
        cls._end_step()
        cls._last_report_step = engine.exchange.due(engine.timer.steps)
        return engine.report() if cls._last_report_step else None

    @classmethod
    def is_interval_elapsed(cls) -> bool:
        """True when the last :meth:`generate_report_if_interval_elapsed` call made a report."""
        return cls._last_report_step

    @classmethod
    def shutdown(cls) -> None:
        """Stop detection: remove hooks, restore wrapped callables."""
        if cls._engine is not None:
            cls._engine.timer.detach()
        cls.restore_original_callables()
        cls._engine = None
        cls.initialized = False
