"""Fault tolerance for a hand-written training loop (no Lightning): sections, warm-up, timeouts.

A few calls at fixed points of the loop wrap its phases in the sections ``setup``, ``step`` and
``checkpointing`` of the section API (seed 000) and keep the timeouts fitted to the run::

    import ft_core.integration as ft_integration

    dist.init_process_group(...)      # first: some calls below are collectives
    ft_integration.setup(checkpoint_dir, calculate_timeouts=True)      # opens "setup"
    ft_integration.maybe_setup_simulated_fault(fault_params)           # optional, for testing
    if load_checkpoint(checkpoint_dir):
        ft_integration.on_checkpoint_loaded(is_local_chkpt=False)
    for batch in data:
        ft_integration.on_training_step_start()   # closes "setup"; opens "step" after warm-up
        train_step(batch)
        ft_integration.on_training_step_end()
        if time_to_save:
            ft_integration.on_checkpointing_start()
            save_checkpoint(checkpoint_dir)
            ft_integration.on_checkpointing_end(is_async_finalization=False)
    ft_integration.shutdown()

What is watched:

* ``setup`` is opened by :meth:`FaultToleranceIntegration.setup` and closed by the first
  training or evaluation step: model construction, checkpoint loading, data loader start-up.
* ``step`` wraps each training and evaluation step, except the first ``num_warmup_iters``
  (default 1) training steps of the run and the first ones of each evaluation run: those are
  often much slower (allocation, compilation, data loader start-up) and would force a long
  ``step`` timeout. They fall into the out-of-section time.
* ``checkpointing`` wraps checkpoint saving, including asynchronous finalisation.
* Everything else is out of section and bounded by ``rank_out_of_section_timeout``.

Timeouts: with ``calculate_timeouts=True`` they are calculated from the longest durations seen
on any rank, times the config's ``safety_factor`` (at least 1 s), after every checkpoint save and
at :meth:`~FaultToleranceIntegration.shutdown`:

* ``step`` once the run did at least 16 training iterations;
* ``checkpointing`` once the run saved a checkpoint (not when asynchronous finalisation was seen:
  its duration varies too much from run to run);
* ``setup`` and the out-of-section timeout only in a run that loaded a persistent checkpoint, so
  that they include loading it (and, for the out-of-section time, once 16 iterations ran).

Rank 0 writes the client's ``state_dict()`` atomically to ``<checkpoint_dir>/_ft_state.json``
after each update; :meth:`~FaultToleranceIntegration.setup` of the next run (a restart or a
resumed job) loads it when present, so calculated timeouts replace configured ones from the
start.

Collectives: when a ``torch.distributed`` process group exists, ``setup`` (rank 0 reads the state
file and broadcasts it), ``maybe_setup_simulated_fault`` (the plan is broadcast), and, when
calculating timeouts, ``on_checkpointing_end(is_async_finalization=False)`` and ``shutdown``
must be called by every rank at the same point. Initialise the process group before ``setup``
and destroy it after ``shutdown``.

Every call is a no-op while fault tolerance is not initialised (before ``setup`` or after
``shutdown``), so a script can keep the calls and skip ``setup`` when it runs without
``ft_launcher``. Like the rest of ``ft_core``, this module never imports torch at import time.

The module-level functions act on one default :class:`FaultToleranceIntegration`; create your
own instance to hold the state elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from ft_core.atomic import atomic_write_text
from ft_core.client import RankMonitorClient
from ft_core.config import ConfigError
from ft_core.errors import RankMonitorClientError
from ft_core.simulated_fault import SimulatedFault, SimulatedFaultParams, setup_simulated_fault

logger = logging.getLogger(__name__)

SECTION_SETUP = "setup"
SECTION_STEP = "step"
SECTION_CHECKPOINTING = "checkpointing"
SECTIONS = (SECTION_SETUP, SECTION_STEP, SECTION_CHECKPOINTING)

NUM_WARMUP_ITERS = 1
"""Default number of training steps per run (and evaluation steps per evaluation run) left out
of the ``step`` section."""

MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE = 16
"""Training iterations a run must have done before it calculates the ``step`` (and the
out-of-section) timeout."""

STATE_FILE_NAME = "_ft_state.json"
"""Name of the file, in the checkpoint directory, that carries calculated timeouts across runs."""

# A state file is a few hundred bytes; anything much larger is not ours.
MAX_STATE_FILE_BYTES = 1 << 20

PathLike = Union[str, "os.PathLike[str]"]
FaultParams = Union[SimulatedFaultParams, Mapping[str, Any]]


class FaultToleranceIntegration:
    """The state of one training run's fault tolerance; see the module docstring.

    Args:
        logger_name: Logger the integration logs to (messages are prefixed ``[rank N]``).
    """

    def __init__(self, logger_name: str = __name__) -> None:
        self._log = logging.getLogger(logger_name)
        self._client: Optional[RankMonitorClient] = None
        self._fault: Optional[SimulatedFault] = None
        self._state_path: Optional[str] = None
        self._calculate_timeouts = False
        self._num_warmup_iters = NUM_WARMUP_ITERS
        self._rank: Any = os.environ.get("RANK", 0)
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        self._setup_open = False
        self._setup_closed_by_step = False
        self._step_open = False
        self._ckpt_depth = 0
        self._train_iters = 0
        self._eval_iters = 0
        self._ckpt_saves = 0
        self._async_finalization_seen = False
        self._persistent_ckpt_loaded = False

    # ------------------------------------------------------------------ public state

    @property
    def is_initialized(self) -> bool:
        """True between a successful :meth:`setup` and :meth:`shutdown`."""
        return self._client is not None

    @property
    def client(self) -> Optional[RankMonitorClient]:
        """The rank monitor client while initialised (for inspection; do not shut it down)."""
        return self._client

    @property
    def state_file_path(self) -> Optional[str]:
        """Where calculated timeouts are loaded from and saved to (known after :meth:`setup`)."""
        return self._state_path

    @property
    def train_iters(self) -> int:
        """Training iterations seen in this run (warm-up iterations included)."""
        return self._train_iters

    # ------------------------------------------------------------------ life cycle

    def setup(
        self,
        checkpoint_dir: Optional[PathLike],
        *,
        calculate_timeouts: bool = False,
        num_warmup_iters: int = NUM_WARMUP_ITERS,
        state_file_name: str = STATE_FILE_NAME,
    ) -> None:
        """Connect to this rank's monitor, restore saved timeouts and open the ``setup`` section.

        A collective when a ``torch.distributed`` process group exists (rank 0 reads the state
        file and broadcasts it): every rank must call it.

        Args:
            checkpoint_dir: The directory checkpoints are saved to; the timeouts file
                ``state_file_name`` lives there, next to the checkpoints it belongs with.
            calculate_timeouts: Calculate timeouts from observed durations and save them.
            num_warmup_iters: Training steps per run, and evaluation steps per evaluation run,
                left out of the ``step`` section (>= 0).
            state_file_name: Name of the timeouts file in ``checkpoint_dir``.

        Raises:
            ValueError: ``checkpoint_dir`` is not set, or another argument is invalid.
            RuntimeError: Already set up (call :meth:`shutdown` first).
            RankMonitorClientError: Not started by ``ft_launcher``, or the monitor cannot be
                reached.
            ConfigError: The monitor's configuration cannot watch this integration: a section
                is missing from ``rank_section_timeouts``, or, without ``calculate_timeouts``,
                a section or the out-of-section timeout is infinite.
        """
        if self._client is not None:
            raise RuntimeError("ft_core.integration.setup() was called twice; call shutdown() first")
        if checkpoint_dir is None or (isinstance(checkpoint_dir, str) and not checkpoint_dir.strip()):
            raise ValueError(
                f"ft_core.integration.setup: checkpoint_dir is not set (got {checkpoint_dir!r}). "
                "Fault tolerance keeps its state (calculated timeouts) next to the checkpoints: "
                "pass the directory your checkpoints are saved to."
            )
        if not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise ValueError(f"ft_core.integration.setup: checkpoint_dir must be a path, got {checkpoint_dir!r}")
        if not isinstance(calculate_timeouts, bool):
            raise ValueError(
                f"ft_core.integration.setup: calculate_timeouts must be True or False, got {calculate_timeouts!r}"
            )
        if isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
            raise ValueError(
                f"ft_core.integration.setup: num_warmup_iters must be a whole number >= 0, got {num_warmup_iters!r}"
            )
        if not isinstance(state_file_name, str) or not state_file_name or os.sep in state_file_name:
            raise ValueError(
                f"ft_core.integration.setup: state_file_name must be a plain file name, got {state_file_name!r}"
            )
        self._reset_run_state()
        self._rank = _global_rank()
        self._calculate_timeouts = calculate_timeouts
        self._num_warmup_iters = num_warmup_iters
        self._state_path = os.path.join(os.fspath(checkpoint_dir), state_file_name)
        if _process_group_size() == 1 and _env_int("WORLD_SIZE", 1) > 1:
            self._log.warning(
                "[rank %s] ft_core.integration.setup: WORLD_SIZE=%s but no torch.distributed process "
                "group is initialised; calculated timeouts will differ between ranks (initialise the "
                "process group before setup)", self._rank, os.environ.get("WORLD_SIZE"),
            )
        state = self._read_agreed_state()  # collective
        client = RankMonitorClient()
        if state is not None:
            try:
                client.load_state_dict(state)
            except RankMonitorClientError as err:
                self._log.warning("[rank %s] ignoring fault tolerance state file %s: %s; configured "
                                  "timeouts are used", self._rank, self._state_path, err)
        client.init_workload_monitoring()
        try:
            self._check_config(client)
            client.start_section(SECTION_SETUP)
        except BaseException:
            client.shutdown_workload_monitoring()
            raise
        self._client = client
        self._setup_open = True
        self._log.info(
            "[rank %s] fault tolerance set up: section timeouts %s, out-of-section %s; timeouts file "
            "%s (calculate_timeouts=%s, warm-up iterations %s)", self._rank,
            client.section_timeouts.section, client.section_timeouts.out_of_section,
            self._state_path, calculate_timeouts, num_warmup_iters,
        )

    def shutdown(self, update_timeouts: bool = True) -> None:
        """Close open sections, update and save timeouts, and disconnect from the monitor.

        Call it at the end of a run that ended normally, on every rank (the timeouts update is
        a collective). After a failure, when the other ranks may not get here, pass
        ``update_timeouts=False``: that only disconnects. Safe to call more than once; never
        raises (problems are logged).

        Args:
            update_timeouts: Run the final timeouts update (when ``calculate_timeouts``).
        """
        client = self._client
        if client is None:
            return
        try:
            if self._fault is not None:
                self._fault.cancel()
            self._close_open_sections(client)
            if update_timeouts:
                self._maybe_update_timeouts(final=True)
        except Exception:
            self._log.exception("[rank %s] fault tolerance: final timeouts update failed", self._rank)
        finally:
            self._fault = None
            self._client = None
            try:
                client.shutdown_workload_monitoring()
            except Exception:
                self._log.exception("[rank %s] fault tolerance: disconnecting from the monitor failed", self._rank)
        self._log.info("[rank %s] fault tolerance shut down after %s training iterations",
                       self._rank, self._train_iters)

    def _close_open_sections(self, client: RankMonitorClient) -> None:
        for name in client.open_sections:
            client.end_section(name)
        self._setup_open = self._step_open = False
        self._ckpt_depth = 0

    def _check_config(self, client: RankMonitorClient) -> None:
        configured = client.section_timeouts.section
        missing = [name for name in SECTIONS if name not in configured]
        if missing:
            raise ConfigError(
                f"ft_core.integration: rank_section_timeouts must configure the sections "
                f"{', '.join(SECTIONS)}; missing: {', '.join(missing)} (configured: {dict(configured)!r}). "
                "E.g. ft_launcher --ft-param-rank_section_timeouts=setup:600,step:180,checkpointing:420 "
                "--ft-param-rank_out_of_section_timeout=300 (null means: calculate)"
            )
        # Finite heartbeat timeouts are fine although no heartbeats are sent: the monitor counts
        # every section change as progress, so they only bound the time between two changes.
        if not self._calculate_timeouts and not client.section_timeouts.are_valid:
            raise ConfigError(
                "ft_core.integration: hang detection is incomplete because a timeout is infinite "
                f"(rank_section_timeouts={dict(client.section_timeouts.section)!r}, "
                f"rank_out_of_section_timeout={client.section_timeouts.out_of_section!r}) and "
                "calculate_timeouts=False. Give every section and the out-of-section time a timeout, "
                "or pass calculate_timeouts=True."
            )

    # ------------------------------------------------------------------ steps

    def _close_setup(self, client: RankMonitorClient) -> None:
        client.end_section(SECTION_SETUP)
        self._setup_open = False
        self._setup_closed_by_step = True

    def _begin_step(self, client: RankMonitorClient, iters_so_far: int) -> None:
        if self._setup_open:
            self._close_setup(client)
        if iters_so_far >= self._num_warmup_iters and not self._step_open:
            client.start_section(SECTION_STEP)
            self._step_open = True

    def _finish_step(self, client: RankMonitorClient) -> None:
        if self._step_open:
            client.end_section(SECTION_STEP)
            self._step_open = False

    def on_training_step_start(self) -> None:
        """A training step begins: close ``setup``; open ``step`` after the warm-up steps."""
        client = self._client
        if client is None:
            return
        self._eval_iters = 0  # training resumed: the next evaluation run warms up again
        self._begin_step(client, self._train_iters)

    def on_training_step_end(self) -> None:
        """A training step ended: close ``step`` if it was opened."""
        client = self._client
        if client is None:
            return
        self._finish_step(client)
        self._train_iters += 1

    def on_eval_step_start(self) -> None:
        """An evaluation step begins: close ``setup``; open ``step`` after the warm-up steps."""
        client = self._client
        if client is None:
            return
        self._begin_step(client, self._eval_iters)

    def on_eval_step_end(self) -> None:
        """An evaluation step ended: close ``step`` if it was opened."""
        client = self._client
        if client is None:
            return
        self._finish_step(client)
        self._eval_iters += 1

    # ------------------------------------------------------------------ checkpoints

    def on_checkpointing_start(self) -> None:
        """Checkpoint saving (or asynchronous finalisation) begins: open ``checkpointing``.

        Nested calls are counted; only the outermost pair opens and closes the section.
        """
        client = self._client
        if client is None:
            return
        if self._ckpt_depth == 0:
            client.start_section(SECTION_CHECKPOINTING)
        self._ckpt_depth += 1

    def on_checkpointing_end(self, is_async_finalization: bool) -> None:
        """Checkpoint saving ended: close ``checkpointing``; after a save, update timeouts.

        With ``calculate_timeouts`` and ``is_async_finalization=False`` this is a collective
        (every rank must call it after the same save).

        Args:
            is_async_finalization: True after finalising an asynchronous save (which may happen
                before any training step and may have had nothing to do); False after a save.
        """
        client = self._client
        if client is None:
            return
        if self._ckpt_depth == 0:
            self._log.debug("[rank %s] on_checkpointing_end() without on_checkpointing_start(); ignored",
                            self._rank)
            return
        self._ckpt_depth -= 1
        if self._ckpt_depth > 0:
            return
        client.end_section(SECTION_CHECKPOINTING)
        if is_async_finalization:
            self._async_finalization_seen = True
            return
        self._ckpt_saves += 1
        try:
            self._maybe_update_timeouts(final=False)
        except Exception:
            # Bookkeeping must never fail the checkpoint that was just saved.
            self._log.exception("[rank %s] fault tolerance: timeouts update after a checkpoint failed",
                                self._rank)

    def on_checkpoint_loaded(self, is_local_chkpt: bool) -> None:
        """A checkpoint was loaded; a persistent one makes ``setup`` timeouts calculable.

        Args:
            is_local_chkpt: True for a local (node-private, non-persistent) checkpoint, whose
                load time says little about a load from persistent storage.
        """
        if self._client is None:
            return
        if not is_local_chkpt:
            self._persistent_ckpt_loaded = True

    # ------------------------------------------------------------------ simulated faults

    def maybe_setup_simulated_fault(self, params: Optional[FaultParams]) -> Optional[SimulatedFault]:
        """Schedule a simulated fault (one rank kills or freezes itself) when ``params`` is given.

        A collective when a process group exists (the plan is agreed by broadcast): every rank
        must call it with the same ``params``. The fault is cancelled by :meth:`shutdown`.
        Arm it only in the first attempt (e.g. ``FT_LAUNCHER_CYCLE == "0"``), or every restart
        fails again.

        Args:
            params: A :class:`~ft_core.simulated_fault.SimulatedFaultParams`, an equivalent dict,
                or None for no fault.

        Returns:
            The scheduled fault (armed only on the failing rank), or None when ``params`` is
            None or fault tolerance is not initialised.

        Raises:
            ValueError: Invalid parameters, or ``rank_to_fail`` outside the world.
        """
        if params is None:
            return None
        if self._client is None:
            self._log.warning("[rank %s] simulated fault not scheduled: fault tolerance is not initialised "
                              "(call setup() first)", self._rank)
            return None
        params = SimulatedFaultParams.from_value(params)
        if self._fault is not None:
            self._fault.cancel()
        self._fault = setup_simulated_fault(params)  # collective
        return self._fault

    # ------------------------------------------------------------------ timeouts

    def _maybe_update_timeouts(self, final: bool) -> bool:
        """Calculate the timeouts the run has data for (a collective); save them on rank 0.

        Returns:
            True if timeouts were updated.
        """
        client = self._client
        if client is None or not self._calculate_timeouts:
            return False
        enough_iters, saved, sync_saves, loaded, setup_seen = _all_ranks_agree([  # collective
            self._train_iters >= MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE,
            self._ckpt_saves > 0,
            not self._async_finalization_seen,
            self._persistent_ckpt_loaded,
            self._setup_closed_by_step,
        ])
        selected = []
        if enough_iters:
            selected.append(SECTION_STEP)
        if saved and sync_saves:
            selected.append(SECTION_CHECKPOINTING)
        if loaded and setup_seen:
            selected.append(SECTION_SETUP)
        calc_out_of_section = loaded and enough_iters
        if not selected and not calc_out_of_section:
            self._log.log(
                logging.INFO if final else logging.DEBUG,
                "[rank %s] section timeouts not updated: too little data (%s training iterations, need %s; "
                "checkpoint saved: %s; persistent checkpoint loaded: %s)", self._rank, self._train_iters,
                MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE, saved, loaded,
            )
            return False
        updated = client.calculate_and_set_section_timeouts(  # collective
            selected_sections=selected, calc_out_of_section=calc_out_of_section, skip_if_not_ready=True,
        )
        if not updated:
            self._log.info("[rank %s] section timeouts not updated: %s not observed on every rank",
                           self._rank, ", ".join(selected + (["out-of-section"] if calc_out_of_section else [])))
            return False
        if saved and not sync_saves:
            self._log.info("[rank %s] checkpointing timeout not calculated: asynchronous checkpoint "
                           "finalisation makes its duration vary too much between runs", self._rank)
        if str(self._rank) == "0":
            self._write_state(client)
        return True

    def _write_state(self, client: RankMonitorClient) -> None:
        path = self._state_path
        assert path is not None
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            atomic_write_text(path, json.dumps(client.state_dict(), indent=2, sort_keys=True) + "\n")
        except OSError as err:
            # Losing calculated timeouts only means the next run starts from the configured ones.
            self._log.error("[rank %s] cannot save calculated timeouts to %s: %s", self._rank, path, err)
            return
        self._log.info("[rank %s] saved calculated timeouts to %s", self._rank, path)

    def _read_agreed_state(self) -> Optional[dict[str, Any]]:
        """Rank 0 reads the state file and broadcasts its text (a collective); parse it here."""
        text = self._read_state_text() if str(self._rank) == "0" or _process_group_size() == 1 else None
        text = _broadcast_text(text)
        if text is None:
            return None
        try:
            state = json.loads(text)
        except ValueError as err:
            self._log.warning("[rank %s] ignoring fault tolerance state file %s: not valid JSON (%s); "
                              "configured timeouts are used", self._rank, self._state_path, err)
            return None
        if not isinstance(state, dict):
            self._log.warning("[rank %s] ignoring fault tolerance state file %s: expected a JSON object, "
                              "got %s; configured timeouts are used", self._rank, self._state_path,
                              type(state).__name__)
            return None
        self._log.info("[rank %s] loaded calculated timeouts from %s", self._rank, self._state_path)
        return state

    def _read_state_text(self) -> Optional[str]:
        path = self._state_path
        assert path is not None
        try:
            with open(path, "rb") as stream:
                data = stream.read(MAX_STATE_FILE_BYTES + 1)
        except FileNotFoundError:
            self._log.info("[rank %s] no fault tolerance state file at %s yet", self._rank, path)
            return None
        except OSError as err:
            self._log.warning("[rank %s] cannot read fault tolerance state file %s: %s; ignored",
                              self._rank, path, err)
            return None
        if len(data) > MAX_STATE_FILE_BYTES:
            self._log.warning("[rank %s] ignoring fault tolerance state file %s: larger than %s bytes",
                              self._rank, path, MAX_STATE_FILE_BYTES)
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            self._log.warning("[rank %s] ignoring fault tolerance state file %s: not UTF-8 text (%s)",
                              self._rank, path, err)
            return None


# ---------------------------------------------------------------------- torch.distributed helpers
# torch is imported only when the program already imported torch.distributed: a program without
# it cannot have a process group.


def _dist() -> Any:
    """``torch.distributed`` when a process group is initialised, else None."""
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _process_group_size() -> int:
    dist = _dist()
    return 1 if dist is None else dist.get_world_size()


def _global_rank() -> Any:
    dist = _dist()
    if dist is not None:
        return dist.get_rank()
    return os.environ.get("RANK", 0)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else default


def _tensor_device(dist: Any) -> Any:
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_ranks_agree(flags: Sequence[bool]) -> list[bool]:
    """For each flag, whether it is true on every rank (one all-reduce MIN; a collective)."""
    flags = [bool(flag) for flag in flags]
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return flags
    import torch

    tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=_tensor_device(dist))
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return [bool(value) for value in tensor.cpu().tolist()]


def _broadcast_text(text: Optional[str]) -> Optional[str]:
    """Return rank 0's ``text`` on every rank (two broadcasts of plain bytes, no pickle)."""
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return text
    import torch

    device = _tensor_device(dist)
    data = b"" if text is None else text.encode("utf-8")
    length = torch.tensor([len(data) if text is not None else -1], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    size = int(length.item())
    if size < 0:
        return None
    buffer = torch.zeros(size, dtype=torch.uint8, device=device)
    if dist.get_rank() == 0 and size:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    if size:
        dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().tolist()).decode("utf-8")


# ---------------------------------------------------------------------- module-level API

_default = FaultToleranceIntegration()


def get_integration() -> FaultToleranceIntegration:
    """The instance the module-level functions act on."""
    return _default


def get_rank_monitor_client() -> Optional[RankMonitorClient]:
    """The rank monitor client while initialised, else None."""
    return _default.client


def is_initialized() -> bool:
    """True between :func:`setup` and :func:`shutdown`."""
    return _default.is_initialized


def setup(
    checkpoint_dir: Optional[PathLike],
    *,
    calculate_timeouts: bool = False,
    num_warmup_iters: int = NUM_WARMUP_ITERS,
    state_file_name: str = STATE_FILE_NAME,
) -> None:
    """Initialise fault tolerance; see :meth:`FaultToleranceIntegration.setup`."""
    _default.setup(checkpoint_dir, calculate_timeouts=calculate_timeouts,
                   num_warmup_iters=num_warmup_iters, state_file_name=state_file_name)


def on_training_step_start() -> None:
    """See :meth:`FaultToleranceIntegration.on_training_step_start`."""
    _default.on_training_step_start()


def on_training_step_end() -> None:
    """See :meth:`FaultToleranceIntegration.on_training_step_end`."""
    _default.on_training_step_end()


def on_eval_step_start() -> None:
    """See :meth:`FaultToleranceIntegration.on_eval_step_start`."""
    _default.on_eval_step_start()


def on_eval_step_end() -> None:
    """See :meth:`FaultToleranceIntegration.on_eval_step_end`."""
    _default.on_eval_step_end()


def on_checkpointing_start() -> None:
    """See :meth:`FaultToleranceIntegration.on_checkpointing_start`."""
    _default.on_checkpointing_start()


def on_checkpointing_end(is_async_finalization: bool) -> None:
    """See :meth:`FaultToleranceIntegration.on_checkpointing_end`."""
    _default.on_checkpointing_end(is_async_finalization)


def on_checkpoint_loaded(is_local_chkpt: bool) -> None:
    """See :meth:`FaultToleranceIntegration.on_checkpoint_loaded`."""
    _default.on_checkpoint_loaded(is_local_chkpt)


def shutdown(update_timeouts: bool = True) -> None:
    """See :meth:`FaultToleranceIntegration.shutdown`."""
    _default.shutdown(update_timeouts)


def maybe_setup_simulated_fault(params: Optional[FaultParams]) -> Optional[SimulatedFault]:
    """See :meth:`FaultToleranceIntegration.maybe_setup_simulated_fault`."""
    return _default.maybe_setup_simulated_fault(params)
