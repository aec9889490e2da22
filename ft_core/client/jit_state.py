"""Just-in-time state: a surviving rank saves its full training state when a peer fails.

In a replicated job (DDP, one device per rank) every rank outside the optimizer update holds the
full, consistent state of its last completed step. When a peer fails, the launcher asks (through
the rank monitor) one survivor per node to save it, and restarted workers load it instead of the
last periodic checkpoint (docs/jit-state.md). Two paths save:

* the **exception path** (:meth:`JitState.save_now`, main thread): the survivor's collective
  failed with an exception (a crashed peer closes the connection), the front end catches it
  (Lightning's ``on_exception``, the plain loop's ``sys.excepthook``) and saves before exiting;
* the **blocked path** (the state thread): the survivor's main thread is blocked inside a
  collective (a hung peer), the GIL released; a daemon thread, connected to the rank's monitor
  by a second connection (the *state channel*), takes the monitor's ``save_state`` request,
  copies the state and saves it.

A copy is accepted only when it is consistent: the provider's completed-step counter is the
same before and after the copy and the main thread was not inside the optimizer update before
or after it. What the state is comes from a :class:`StateProvider` (the Lightning callbacks', or
:func:`ft_core.client.integration.track_state`'s for a plain loop).

Off unless ``ft_launcher`` set ``FT_JIT_STATE_DIR`` (``--ft-jit-state false`` does not). Costs
nothing per step: the thread sleeps in ``recv`` until a failure. Like the rest of ``ft_core``,
this module imports torch only inside the function that writes a payload.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any, Optional, Protocol, runtime_checkable

from ft_core.client.requeue_state import shared_state_dir
from ft_core.wire import protocol, saved_state
from ft_core.wire.env import (
    FT_CYCLE_ENV_VAR,
    FT_JIT_STATE_DIR_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)
from ft_core.wire.errors import ProtocolError

logger = logging.getLogger(__name__)

CHANNEL_RETRY_MAX = 5.0
"""Longest pause between two attempts of the state thread to open its channel (the monitor
refuses it until the rank's own monitoring session is attached)."""


@runtime_checkable
class StateProvider(Protocol):
    """What a front end tells :class:`JitState` about its training state.

    ``completed_step`` and ``in_update`` are read from another thread while the main thread may
    be anywhere; they must be plain attribute reads (no locks, no collectives).
    """

    kind: str
    """``lightning`` or ``plain``: which loader understands the payload."""

    def completed_step(self) -> int:
        """Optimizer updates finished so far."""
        ...

    def in_update(self) -> bool:
        """True between the start and the end of the optimizer's parameter update."""
        ...

    def replicated(self) -> tuple[bool, str]:
        """``(True, "")`` when this rank holds the full state; else ``(False, why)``."""
        ...

    def capture(self) -> Any:
        """The full state on the CPU (detached) that ``torch.save`` can write; may run in another
        thread than the training loop's. CPU tensors that change only inside the optimizer update
        may be the live ones: :class:`JitState` checks the step and the update flag again after
        the payload is written."""
        ...

    def approx_bytes(self) -> int:
        """About how many bytes :meth:`capture` produces (sizes the launcher's wait)."""
        ...


@dataclass(frozen=True)
class SaveResult:
    """The outcome of one save request.

    Attributes:
        ok: A consistent state was saved.
        step: Its completed step (the step seen when declining, -1 if unknown).
        path: The payload's path (node-local state directory).
        bytes: The payload's size.
        seconds: How long the save took (copy, write, checksum).
        reason: Why nothing was saved (empty when ok).
        source: ``exception`` or ``blocked``.
    """

    ok: bool
    step: int = -1
    path: str = ""
    bytes: int = 0
    seconds: float = 0.0
    reason: str = ""
    source: str = ""

    def to_wire(self) -> dict[str, Any]:
        """The ``state_saved`` message a rank sends its monitor."""
        return {"type": protocol.MSG_STATE_SAVED, **asdict(self)}


class JitState:
    """One rank's just-in-time state: the provider, the saves, the state thread.

    Args:
        state_dir: The node-local state directory; default ``$FT_JIT_STATE_DIR`` (absent: off).
        monitor_socket: The rank monitor's socket for the state channel; default
            ``$FT_RANK_MONITOR_IPC_SOCKET`` (absent: no blocked path).
    """

    def __init__(self, state_dir: Optional[str] = None, monitor_socket: Optional[str] = None) -> None:
        self.state_dir = state_dir if state_dir is not None else os.environ.get(FT_JIT_STATE_DIR_ENV_VAR) or None
        self.monitor_socket = (monitor_socket if monitor_socket is not None
                               else os.environ.get(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR) or None)
        self._provider: Optional[StateProvider] = None
        self._shared_dir: Optional[str] = None
        self._lock = threading.Lock()  # one save at a time in this process
        self._last: Optional[SaveResult] = None  # the last successful save (answered from memory)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._sock: Any = None
        self._said_refused = False

    @property
    def enabled(self) -> bool:
        """True when a state directory is set (the launcher turned the feature on)."""
        return bool(self.state_dir)

    @property
    def provider(self) -> Optional[StateProvider]:
        return self._provider

    @property
    def shared_dir(self) -> Optional[str]:
        """``<checkpoint_dir>/ft_jit_state`` of the last :meth:`attach`, or None."""
        return self._shared_dir

    def attach(self, provider: StateProvider, checkpoint_dir: Optional[str] = None) -> bool:
        """Use ``provider``'s state from now on; start the state thread if needed.

        Args:
            provider: The front end's state.
            checkpoint_dir: The user's shared checkpoint directory: saves are copied to
                ``<checkpoint_dir>/ft_jit_state/`` too, for a requeued job.

        Returns:
            True when just-in-time state is on for this rank (under ft_launcher with it enabled).
        """
        if not isinstance(provider, StateProvider):
            raise TypeError(f"a state provider needs kind, completed_step, in_update, replicated, capture and "
                            f"approx_bytes; got {type(provider).__name__}")
        self._provider = provider
        self._shared_dir = shared_state_dir(checkpoint_dir)  # where a requeued job looks for it
        if not self.enabled:
            return False
        ok, why = provider.replicated()
        if not ok and not self._said_refused:
            self._said_refused = True
            logger.warning("just-in-time state is off for this job: %s; it needs a replicated job (DDP), so "
                           "restarts resume from the periodic checkpoints", why)
        _install_excepthook()
        if self.monitor_socket and (self._thread is None or not self._thread.is_alive()):
            self._stop.clear()
            self._thread = threading.Thread(target=self._serve, name="ft-jit-state", daemon=True)
            self._thread.start()
        return True

    def detach(self) -> None:
        """Forget the provider and stop the state thread (its channel closes)."""
        self._provider = None
        self._stop.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(2)
            sock.close()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    # ------------------------------------------------------------------ saving

    def save_now(self, source: str = "exception") -> SaveResult:
        """Save the provider's state now if it is consistent (the exception path: main thread).

        Never raises: a failed save returns ``ok=False`` with the reason (the user's exception
        comes first).
        """
        try:
            return self._save(source)
        except Exception as err:  # disk full, a provider bug: the rank is failing anyway
            logger.warning("just-in-time state: the save failed: %s: %s", type(err).__name__, err)
            return SaveResult(ok=False, reason=f"the save failed: {type(err).__name__}: {err}", source=source)

    def _save(self, source: str) -> SaveResult:
        provider = self._provider
        if not self.enabled:
            return SaveResult(ok=False, reason=f"just-in-time state is off ({FT_JIT_STATE_DIR_ENV_VAR} is not set)",
                              source=source)
        if provider is None:
            return SaveResult(ok=False, reason="no training state is tracked in this rank", source=source)
        ok, why = provider.replicated()
        if not ok:
            return SaveResult(ok=False, reason=why or "the state is not replicated", source=source)
        with self._lock:
            started = time.monotonic()
            step, updating = provider.completed_step(), provider.in_update()
            last = self._last
            if last is not None and last.step == step and not updating:
                return last  # asked again (the monitor, then the launcher): answered from memory
            if updating:
                return SaveResult(ok=False, step=step, reason="inside the optimizer update", source=source)
            assert self.state_dir is not None
            saved_state.ensure_dir(self.state_dir)
            if not saved_state.claim(self.state_dir, step):
                return SaveResult(ok=False, step=step, source=source,
                                  reason=f"{saved_state.CLAIMED_BY_ANOTHER} {step}")
            try:
                captured = provider.capture()
                if provider.completed_step() != step or provider.in_update():
                    saved_state.release(self.state_dir, step)
                    return SaveResult(ok=False, step=step, source=source,
                                      reason="the state changed during the copy (training went on)")
                # A capture may hold live CPU tensors (PlainStateProvider): checked again once written.
                state = saved_state.write(self.state_dir, step, _torch_writer(captured), kind=provider.kind,
                                          source=source, started=started, **_rank_fields(),
                                          still_valid=lambda: provider.completed_step() == step
                                          and not provider.in_update(), publish=False)
                # The local manifest last: the launcher takes it as "saved" and may stop this rank
                # at once, so the shared copy (for a requeued job) must be complete before it.
                state = self._copy_to_shared(state)
                state = replace(state, seconds=round(time.monotonic() - started, 4))
                saved_state.rewrite_manifest(state)
            except saved_state.StateChanged:
                saved_state.release(self.state_dir, step)
                return SaveResult(ok=False, step=step, source=source,
                                  reason="the state changed during the save (training went on)")
            except BaseException:
                saved_state.release(self.state_dir, step)
                raise
            del captured
            saved_state.prune(self.state_dir)
            result = SaveResult(ok=True, step=step, path=state.payload_path, bytes=state.bytes,
                                seconds=round(time.monotonic() - started, 4), source=source)
            self._last = result
            logger.info("just-in-time state: saved step %s (%.1f MB) in %.2f s from the %s path to %s", step,
                        state.bytes / 1e6, result.seconds, source, state.payload_path)
            return result

    def _copy_to_shared(self, state: saved_state.SavedState) -> saved_state.SavedState:
        """Copy a saved state's payload to the user's checkpoint directory (for other nodes and a
        requeued job); the returned state (whose manifest the caller writes) names the copy."""
        if not self._shared_dir:
            return state
        try:
            shared = saved_state.write(self._shared_dir, state.step,
                                       lambda path: shutil.copyfile(state.payload_path, path),
                                       kind=state.kind, source=state.source, rank=state.rank,
                                       local_rank=state.local_rank, cycle=state.cycle, world_size=state.world_size,
                                       durable=True)
            saved_state.prune(self._shared_dir)
            state = replace(state, shared_path=shared.payload_path)
        except OSError as err:
            logger.warning("just-in-time state: could not copy step %s to %s: %s", state.step, self._shared_dir, err)
        return state

    # ------------------------------------------------------------------ the state thread

    def _serve(self) -> None:
        """The state thread: open the channel, then answer ``save_state`` requests until detached."""
        pause = 0.2
        while not self._stop.is_set():
            try:
                self._serve_channel()
            except (OSError, ProtocolError, TimeoutError, ConnectionError) as err:
                logger.debug("just-in-time state channel: %s", err)
            if self._stop.wait(pause):
                return
            pause = min(pause * 2, CHANNEL_RETRY_MAX)

    def _serve_channel(self) -> None:
        assert self.monitor_socket is not None
        sock = protocol.connect_unix(self.monitor_socket, 10.0, "rank monitor")
        self._sock = sock
        try:
            provider = self._provider
            protocol.send_message(sock, {"type": protocol.MSG_STATE_CHANNEL, "pid": os.getpid(),
                                         "approx_bytes": provider.approx_bytes() if provider else 0})
            reply = protocol.recv_message(sock, 10.0)
            if reply.get("type") != protocol.MSG_OK:
                raise ProtocolError(f"the monitor refused the state channel: {reply.get('error', reply.get('type'))}")
            while not self._stop.is_set():
                request = protocol.recv_message(sock, None)
                if request.get("type") != protocol.MSG_SAVE_STATE:
                    raise ProtocolError(f"unexpected message on the state channel: {request.get('type')!r}")
                result = self.save_now("blocked")
                protocol.send_message(sock, result.to_wire())
        finally:
            self._sock = None
            sock.close()


def _torch_writer(captured: Any) -> Any:
    def write(path: str) -> None:
        import torch

        torch.save(captured, path)

    return write


def _rank_fields() -> dict[str, int]:
    fields = {}
    for key, name in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world_size", "WORLD_SIZE"),
                      ("cycle", FT_CYCLE_ENV_VAR)):
        value = os.environ.get(name, "")
        fields[key] = int(value) if value.isascii() and value.isdigit() else -1
    return fields


# ---------------------------------------------------------------------- the process's instance

_default: Optional[JitState] = None


def get_jit_state() -> JitState:
    """This process's :class:`JitState` (made on first use from the environment)."""
    global _default
    if _default is None:
        _default = JitState()
    return _default


def attach(provider: StateProvider, checkpoint_dir: Optional[str] = None) -> bool:
    """:meth:`JitState.attach` on this process's instance."""
    return get_jit_state().attach(provider, checkpoint_dir)


def detach() -> None:
    """:meth:`JitState.detach` on this process's instance."""
    if _default is not None:
        _default.detach()


def save_now(source: str = "exception") -> SaveResult:
    """:meth:`JitState.save_now` on this process's instance."""
    return get_jit_state().save_now(source)


class _SavingExceptHook:
    """``sys.excepthook`` that saves the state (exception path) before the hook it replaced runs."""

    def __init__(self, previous: object) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException,
                 traceback: Optional[TracebackType]) -> None:
        try:
            if isinstance(value, Exception) and _default is not None and _default.provider is not None:
                _default.save_now("exception")
        finally:
            previous = self.previous if callable(self.previous) else sys.__excepthook__
            previous(kind, value, traceback)


def _install_excepthook() -> None:
    if not isinstance(sys.excepthook, _SavingExceptHook):
        sys.excepthook = _SavingExceptHook(sys.excepthook)
