"""Names of the environment variables that connect ranks, monitors and the launcher.

``ft_launcher`` sets the two socket variables and the cycle in every worker; the finished-flag
variable is set by the user or by ``scripts/autoresume.sh`` and passed through unchanged. Every
environment variable name of this package is defined here, once (torch's and Python's own, such
as ``RANK`` or ``PYTHONPATH``, are not ours to rename).
"""

FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = "FT_RANK_MONITOR_IPC_SOCKET"
"""Path of the Unix socket of this rank's monitor."""

FT_LAUNCHER_IPC_SOCKET_ENV_VAR = "FT_LAUNCHER_IPC_SOCKET"
"""Path of the launcher's control socket (workload control requests)."""

FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR = "FAULT_TOL_FINISHED_FLAG_FILE"
"""File created by rank 0 when training completed; tells an auto-resume loop to stop."""

FT_CYCLE_ENV_VAR = "FT_LAUNCHER_CYCLE"
"""Index of the current worker cycle (0 for the first start, +1 per restart)."""

AUTORESUME_RUN_DIR_ENV_VAR = "AUTORESUME_RUN_DIR"
"""Set by ``scripts/autoresume.sh`` (``--run-dir``) for the launcher and the ranks: where the loop
keeps its state; ``ft_launcher`` appends its event log there by default (``ft_events.jsonl``)."""

AUTORESUME_ATTEMPT_ENV_VAR = "AUTORESUME_ATTEMPT"
"""Set by ``scripts/autoresume.sh``: the attempt number (1, 2, ...); recorded in the event log."""

# ---------------------------------------------------------------------- launcher-internal
# Set or read by ft_launcher only; listed here so that every variable name lives in one module.

FT_LAUNCHER_EVENT_LOG_ENV_VAR = "FT_LAUNCHER_EVENT_LOG"
"""Default for ``ft_launcher --ft-event-log`` (a path; ``{node}`` is replaced by the host name)."""

FT_LAUNCHER_WARM_RESTARTS_ENV_VAR = "FT_LAUNCHER_WARM_RESTARTS"
"""``0`` turns warm restarts off, like ``--no-warm-restarts``."""

FT_LAUNCHER_WARM_START_DELAY_ENV_VAR = "FT_LAUNCHER_WARM_START_DELAY"
"""Seconds after a cycle's workers started by which the warm template is started at the latest."""

FT_WARM_TEMPLATE_SOCKET_ENV_VAR = "FT_WARM_TEMPLATE_SOCKET"
"""Set in each worker's environment by the launcher: the warm template's socket (the
trampoline reads it; the forked worker never sees it)."""

FT_LAUNCHER_RUN_ENV_VAR = "FT_LAUNCHER_RUN"
"""Set by the launcher in its own environment before it starts anything, so that every process
of the run inherits it (monitors, warm template, workers and whatever they start): a random
token, by which the launcher's sentinel finds them all if the launcher dies (launcher/node/sentinel.py)."""

FT_LAUNCHER_PARENT_PID_ENV_VAR = "FT_LAUNCHER_PARENT_PID"
"""Set by ``scripts/autoresume.sh`` to its own pid: the launcher stops (as on SIGTERM) when that
parent dies, even by SIGKILL (``PR_SET_PDEATHSIG``). Removed from the workers' environment."""

FT_LAUNCHER_KEEP_FD_ENV_VAR = "FT_LAUNCHER_KEEP_FD"
"""Set by ``scripts/autoresume.sh``: an inherited file descriptor (its run-directory lock) that the
launcher and its sentinel keep open until every process of the run is gone. Removed from the
workers' environment."""

FT_LAUNCHER_RESULT_FILE_ENV_VAR = "FT_LAUNCHER_RESULT_FILE"
"""Set by ``scripts/autoresume.sh``: a file the launcher writes atomically as it exits, one
``key=value`` per line: ``exit_code``, ``outcome`` and ``root_nodes`` (comma-separated host names
its records name as the root of the failure that ended the run; empty otherwise). The loop keeps
those nodes out of the next allocation. Removed from the workers' environment."""

FT_PY_SPY_ENV_VAR = "FT_PY_SPY"
"""Read by rank monitors: the py-spy executable used to capture a hung rank's stacks, or ``off``
to use only the client's faulthandler signal. Default: py-spy next to the interpreter, else on
``PATH``."""

FT_RANK_CONFIG_ENV_VAR = "FT_RANK_CONFIG"
"""Set in each worker by ft_launcher: the config a rank receives (JSON, as the monitor's handshake
would send it). A rank whose monitor does not answer the handshake uses it to go on unwatched
(fail-open) with the same sections and collectives as its peers."""

# ---------------------------------------------------------------------- just-in-time state
# Set by ft_launcher in each worker (docs/jit-state.md); read by ft_core.client.jit_state.

FT_JIT_STATE_DIR_ENV_VAR = "FT_JIT_STATE_DIR"
"""The node-local directory where a surviving rank saves its just-in-time state after a peer's
failure (``<run dir>/state``). Absent: just-in-time state is off (not under ft_launcher, or
``--ft-jit-state false``)."""

FT_JIT_RESUME_ENV_VAR = "FT_JIT_RESUME"
"""The payload a restarted rank resumes from (a just-in-time state every node agreed on); absent
when there is none (the periodic checkpoint is used)."""

FT_JIT_RESUME_STEP_ENV_VAR = "FT_JIT_RESUME_STEP"
"""The completed step of :data:`FT_JIT_RESUME_ENV_VAR`'s state."""
