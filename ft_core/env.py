"""Names of the environment variables that connect ranks, monitors and the launcher.

``ft_launcher`` sets the first two in every worker; the finished-flag variable is set by the
user or by ``scripts/autoresume.sh`` and passed through unchanged.
"""

FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = "FT_RANK_MONITOR_IPC_SOCKET"
"""Path of the Unix socket of this rank's monitor."""

FT_LAUNCHER_IPC_SOCKET_ENV_VAR = "FT_LAUNCHER_IPC_SOCKET"
"""Path of the launcher's control socket (workload control requests)."""

FT_RUN_DIR_ENV_VAR = "FT_LAUNCHER_RUN_DIR"
"""Private run directory of the launcher (sockets)."""

FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR = "FAULT_TOL_FINISHED_FLAG_FILE"
"""File created by rank 0 when training completed; tells an auto-resume loop to stop."""

FT_CYCLE_ENV_VAR = "FT_LAUNCHER_CYCLE"
"""Index of the current worker cycle (0 for the first start, +1 per restart)."""
