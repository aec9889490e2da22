"""Per-rank compute time: forward start to the moment the rank's last gradient is ready.

In a synchronous data-parallel job every rank's step takes the same wall time: fast ranks wait
for the slow one inside the gradient all-reduce. What differs between ranks is the work each does
*before* it is ready to communicate, so that is what :class:`ComputeTimer` measures, per step, in
two phases:

* **forward**: the ``forward`` of the module DDP wraps, wrapped on the instance (not DDP's own
  forward: it may broadcast buffers, a collective where fast ranks wait for slow ones). Not module
  hooks: any forward hook sends every call through ``Module``'s slow path, which cost about 15 µs
  per DDP step on an otherwise idle machine (``bench/straggler_overhead.py``), the wrapper well
  under one;
* **backward**: from the end of the forward to the moment the *last* parameter gradient of the
  step is accumulated. DDP's last gradient bucket becomes ready at that same moment (a bucket is
  ready when all its gradients are), before the rank waits for anyone. One
  ``register_post_accumulate_grad_hook`` on that parameter marks it: the first two backward passes
  hook every parameter to learn which one comes last, then only that one stays hooked.

A DDP communication hook (called per bucket, ``bucket.is_last()``) would mark the same moment,
but it replaces the reducer's C++ all-reduce with a Python one: on gloo that cost about 0.5 ms per
step (``bench/straggler_overhead.py``), the gradient hook well under a microsecond. It also leaves
the job's own communication hook alone (DDP takes only one).

Samples accumulate between reports. The clock, without CUDA, is the wall clock of the rank's
compute (``time.perf_counter``): a fail-slow node shows up in wall time (a CPU quota or a noisy
neighbour makes the rank *wait* for a core; CPU time, ``thread_time``, would not grow). With CUDA
the points are CUDA events on the current stream (the autograd engine sets the gradient's stream
when it runs the hook), read at the next report: they time compute only, NCCL kernels run on
their own streams.

Cost per step: a wrapper call and a gradient hook call; no synchronisation, no collective. With
the wall clock one step in :data:`WALL_CLOCK_SAMPLE_EVERY` is sampled (three clock reads into a flat
array), the others only count; with CUDA every step records its events. With ``profiling_interval``
n > 1 the gradient hook is registered for the measured steps only, so the other steps cost the
wrapper alone.
"""

from __future__ import annotations

import array
import logging
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)

__all__ = ["ComputeTimer"]

LEARNING_BACKWARDS = 2
"""Backward passes with every parameter hooked, to find the one whose gradient comes last."""
WALL_CLOCK_SAMPLE_EVERY = 3
"""With the wall clock and ``profiling_interval`` 1, one step in this many is sampled. A sample reads
the clock three times, and in a training step each read costs about 1 µs on the machines we
measured (``bench/straggler_overhead.py``; 56 ns in a tight loop): every step sampled would cost
about 3 µs, over the 2 µs goal. Medians of a third of the steps are as robust for the report."""


class _TrainingFlag:
    """``flag["training"]`` is ``module.training``, for a module that keeps it outside its dict."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module

    def __getitem__(self, key: str) -> bool:
        return bool(getattr(self._module, key))


class ComputeTimer:
    """Collects one (forward, backward) compute-time sample per measured step (see the module docstring).

    Steps are counted at each *training* forward of the hooked module: the module in training mode
    and autograd recording (every rank runs the same number of those, so the count is what ranks
    agree on for the report step). Other forwards (an evaluation under ``torch.no_grad()`` or
    ``model.eval()``, perhaps on one rank only) pass through without being counted or timed.

    Args:
        use_cuda: Time with CUDA events on the current stream instead of the wall clock.
        profiling_interval: Measure every ``profiling_interval``-th step (1: every step with CUDA
            events; one in :data:`WALL_CLOCK_SAMPLE_EVERY` with the wall clock).
        sample_every: The wall clock's stride at ``profiling_interval`` 1 (tests set 1).
    """

    def __init__(self, use_cuda: bool, profiling_interval: int = 1,
                 sample_every: int = WALL_CLOCK_SAMPLE_EVERY) -> None:
        if profiling_interval < 1:
            raise ValueError(f"profiling_interval must be >= 1, got {profiling_interval}")
        self.use_cuda = use_cuda
        self.profiling_interval = profiling_interval
        self.sample_every = max(1, int(sample_every))
        # Steps are counted in chunks: the wrapper only decrements _countdown, and the chunk's last
        # forward (countdown 1) is a checked step that does everything else. steps = _counted +
        # _chunk - _countdown. A few touched fields per step matter: in a training step each
        # object the wrapper touches is out of the CPU's caches (about 0.3 µs each, measured).
        self._counted = 0
        self._chunk = 1
        self._countdown = 1
        self._start: Any = None  # this step's forward start (perf_counter float or CUDA event), slow path
        self._skip = 0  # steps still to leave out (after a checkpoint or an evaluation)
        self._samples: list[tuple[float, float]] = []  # (forward, backward) seconds
        self._events: list[tuple[Any, Any, Any]] = []  # (start, forward end, end) CUDA events not read yet
        self._module: Optional[torch.nn.Module] = None
        self._wrapper: Any = None
        self._method = "forward"
        self._grad_handles: list[Any] = []
        self._params: list[torch.nn.Parameter] = []
        self._last_param: Optional[torch.nn.Parameter] = None  # the one whose gradient comes last, once learned
        self._learning: list[int] = []  # parameter indices in the order their gradients came, this backward
        self._backwards_seen = 0
        self._measures_backward = False
        self.on_step_end: Optional[Callable[[int], None]] = None  # see notify_step
        self._notify_step = 0
        # The step awaiting its backward's end: wall clock in _fwd_start / _mid (_mid None: none), CUDA
        # events in _pending. Wall-clock stamps go to a flat array (start, forward end, end, ...): no
        # object per step for the garbage collector.
        self._fwd_start = 0.0
        self._mid: Optional[float] = None
        self._pending: Optional[tuple[Any, Any]] = None
        self._stamps = array.array("d")
        self._backward_end = self._make_backward_end()

    @property
    def steps(self) -> int:
        """Training forwards of the hooked module so far (see the class docstring)."""
        return self._counted + self._chunk - self._countdown

    @steps.setter
    def steps(self, value: int) -> None:
        self._counted += int(value) - self.steps

    @property
    def notify_step(self) -> int:
        """``on_step_end`` is called after each forward whose step count reaches this (the owner sets
        it to the next exchange step: the steps before it skip the call)."""
        return self._notify_step

    @notify_step.setter
    def notify_step(self, value: int) -> None:
        self._notify_step = int(value)
        self._start_chunk(1)

    def _start_chunk(self, length: int) -> None:
        """End the current chunk (its steps so far stay counted); the next ``length`` forwards are a
        new one, the last of them a checked step."""
        self._counted += self._chunk - self._countdown
        self._chunk = self._countdown = length

    @property
    def steps_per_sample(self) -> int:
        """Steps per sample when nothing is left out: ``profiling_interval``, or the wall clock's stride."""
        if self.profiling_interval == 1 and not self.use_cuda:
            return self.sample_every
        return self.profiling_interval

    @property
    def measures_backward(self) -> bool:
        """True when the backward pass is measured (the module has parameters that get gradients)."""
        return self._measures_backward

    # ------------------------------------------------------------------ hooks

    def attach(self, module: torch.nn.Module, method: str = "forward") -> bool:
        """Wrap ``module``'s forward (or ``method``) and hook its parameters' gradients.

        Args:
            module: The module whose forward is a step (for DDP, the module it wraps).
            method: The method that is the step's forward: ``"training_step"`` for a
                LightningModule (Lightning calls it directly, redirecting DDP's forward to it).

        Returns:
            True when the backward pass is measured too.
        """
        original = getattr(module, method)
        timer = self
        recording = torch.is_grad_enabled  # a C function
        # The module's own dict: one lookup (about 0.1 µs), where ``module.training`` takes about
        # 0.25 µs (Module's attribute machinery). A module whose ``training`` is not plain state
        # (a property) is read through the attribute.
        state: Any = module.__dict__ if "training" in module.__dict__ else _TrainingFlag(module)

        def timed_forward(*args: Any, **kwargs: Any) -> Any:
            if not (recording() and state["training"]):
                # An evaluation forward (eval mode, or autograd off: no_grad, inference_mode) is no
                # training step. Often only some ranks evaluate (rank 0's sample predictions):
                # counted, it would move those ranks' report step away from the others'.
                return original(*args, **kwargs)
            countdown = timer._countdown - 1
            if countdown:  # most steps: one field read and written (see __init__)
                timer._countdown = countdown
                return original(*args, **kwargs)
            return timer._checked_step(original, args, kwargs)

        setattr(module, method, timed_forward)  # on the instance; detach() removes it
        self._module, self._wrapper, self._method = module, timed_forward, method
        self._params = [p for p in module.parameters() if p.requires_grad]
        if self._params and hasattr(self._params[0], "register_post_accumulate_grad_hook"):
            for index, param in enumerate(self._params):
                self._grad_handles.append(param.register_post_accumulate_grad_hook(self._learner(index)))
            self._measures_backward = True
        return self._measures_backward

    def _make_backward_end(self) -> Callable[[Any], None]:
        """The gradient hook on the last parameter: closes the pending step's sample."""
        timer, append, clock = self, self._stamps.append, time.perf_counter

        def backward_end(param: Any) -> None:
            # Unsampled steps leave _mid alone (one write fewer per step): a sampled forward with no
            # backward (a skipped step) would pair with the next backward, one long sample that the
            # interval's median leaves out.
            mid = timer._mid
            if mid is not None:
                timer._mid = None
                append(timer._fwd_start)
                append(mid)
                append(clock())
            elif timer._pending is not None:
                start, mid_event = timer._pending
                timer._pending = None
                timer._events.append((start, mid_event, timer._now()))
        return backward_end

    @property
    def _fast(self) -> bool:
        """Whether a checked step is the common one, nothing to do but the sample: wall clock, every
        step measured, the last gradient learned, no step to leave out."""
        return (not self.use_cuda and self.profiling_interval == 1 and self._measures_backward
                and self._last_param is not None and not self._skip and not self._learning)

    def detach(self) -> None:
        """Remove the forward wrapper and the gradient hooks."""
        module, self._module = self._module, None
        if module is not None and module.__dict__.get(self._method) is self._wrapper:
            delattr(module, self._method)
        for handle in self._grad_handles:
            handle.remove()
        self._grad_handles.clear()
        self.on_step_end = None

    def _learner(self, index: int) -> Callable[[Any], None]:
        def learn(param: Any) -> None:
            self._learning.append(index)
        return learn

    def _learned(self) -> None:
        """After a backward pass with every parameter hooked: keep only the last one's hook."""
        self._backwards_seen += 1
        if self._backwards_seen < LEARNING_BACKWARDS:
            self._learning.clear()
            return
        last = self._learning[-1]
        self._learning.clear()
        for handle in self._grad_handles:
            handle.remove()
        self._last_param = self._params[last]
        self._grad_handles = [self._last_param.register_post_accumulate_grad_hook(self._backward_end)]
        log.debug("straggler detection: the backward ends with parameter %d of %d", last, len(self._params))

    # ------------------------------------------------------------------ per step

    def _now(self) -> Any:
        if self.use_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _checked_step(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """The last forward of a chunk: sample it if due, call ``on_step_end`` if due, plan the next chunk."""
        self._counted += self._chunk  # this step included
        self._chunk = self._countdown = 0
        steps = self._counted
        try:
            if self._learning:  # the previous forward's backward ran with every parameter hooked
                self._learned()
            if self._fast:
                if steps % self.sample_every == 0:
                    clock = time.perf_counter
                    start = clock()
                    output = original(*args, **kwargs)
                    self._mid = clock()
                    self._fwd_start = start
                else:
                    self._mid = None
                    output = original(*args, **kwargs)
            else:
                self._forward_start(steps)
                output = original(*args, **kwargs)
                self._forward_end()
            if steps >= self._notify_step and self.on_step_end is not None:
                self.on_step_end(steps)
        finally:  # a forward that raised (and was caught by the job) must not leave the countdown at 0
            self._plan_chunk(steps)
        return output

    def _plan_chunk(self, steps: int) -> None:
        """The forwards until the next checked step: the next sampled one or the notify step."""
        length = 1
        if self._fast and steps < self._notify_step:
            length = min(self.sample_every - steps % self.sample_every, self._notify_step - steps)
        elif self._fast and self.on_step_end is None:
            length = self.sample_every - steps % self.sample_every
        self._start_chunk(length)

    def _forward_start(self, steps: int) -> None:
        """Every step while the common path is off (learning, steps left out, CUDA, profiling_interval > 1)."""
        profiled = steps % self.profiling_interval == 0 and not self._skip
        if self.profiling_interval > 1 and self._last_param is not None:
            # The gradient hook costs more than its registration: with profiling_interval > 1 it is
            # there for the measured steps only (removed here, not in the hook: the engine is
            # iterating over the hooks then).
            if profiled and not self._grad_handles:
                self._grad_handles.append(self._last_param.register_post_accumulate_grad_hook(self._backward_end))
            elif not profiled and self._grad_handles:
                for handle in self._grad_handles:
                    handle.remove()
                self._grad_handles.clear()
        self._start = self._now() if profiled else None
        self._pending = self._mid = None

    def _forward_end(self) -> None:
        if self._skip:
            self._skip -= 1
        elif self._start is not None:
            if not self._measures_backward:
                self._record_forward_only(self._start, self._now())
            elif self.use_cuda:
                self._pending = (self._start, self._now())
            else:
                self._fwd_start, self._mid = self._start, self._now()
        self._start = None

    def _record_forward_only(self, start: Any, end: Any) -> None:
        if self.use_cuda:
            self._events.append((start, end, end))
        else:
            self._stamps.extend((start, end, end))

    def skip_next(self, steps: int = 1) -> None:
        """Leave the next ``steps`` steps out, and the one in progress (the first step after a
        checkpoint or an evaluation is often slower: caches, allocator, loader workers)."""
        self._skip = max(self._skip, steps)
        self._start = self._pending = self._mid = None
        self._start_chunk(1)

    def record(self, seconds: float) -> None:
        """Add a sample measured elsewhere (a detection section), in seconds, as forward time."""
        self._samples.append((seconds, 0.0))

    def take_samples(self) -> list[tuple[float, float]]:
        """The (forward, backward) samples since the last call, in seconds (waits for pending CUDA events)."""
        if self._events:
            self._events[-1][2].synchronize()
            self._samples.extend((start.elapsed_time(mid) / 1000.0, mid.elapsed_time(end) / 1000.0)
                                 for start, mid, end in self._events)
            self._events.clear()
        stamps = self._stamps
        if stamps:
            self._samples.extend((stamps[i + 1] - stamps[i], stamps[i + 2] - stamps[i + 1])
                                 for i in range(0, len(stamps), 3))
            del stamps[:]  # in place: the gradient hook holds its append
        samples, self._samples = self._samples, []
        return samples
