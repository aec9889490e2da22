"""ft_core: hang detection for distributed training ranks.

Importing this package never imports torch: the rank monitor and the client hot path are
standard-library code; torch is used lazily, only to synchronise calculated timeouts across
ranks when a process group exists.
"""

from ft_core.config import ConfigError, FaultToleranceConfig
from ft_core.data import (
    HeartbeatTimeouts,
    SectionAction,
    SectionTimeouts,
    WorkloadAction,
    WorkloadControlRequest,
)
from ft_core.env import (
    FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR,
    FT_LAUNCHER_IPC_SOCKET_ENV_VAR,
    FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR,
)
from ft_core.errors import RankMonitorClientError, TimeoutsCalcError
from ft_core.rank_monitor_client import RankMonitorClient
from ft_core.timeouts_calc import TimeoutsCalc


def __getattr__(name: str):
    # Imported lazily: ranks, which import this package, never need the server.
    if name == "RankMonitorServer":
        from ft_core.rank_monitor_server import RankMonitorServer

        return RankMonitorServer
    raise AttributeError(f"module 'ft_core' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR",
    "FT_LAUNCHER_IPC_SOCKET_ENV_VAR",
    "FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR",
    "FaultToleranceConfig",
    "HeartbeatTimeouts",
    "RankMonitorClient",
    "RankMonitorClientError",
    "RankMonitorServer",
    "SectionAction",
    "SectionTimeouts",
    "TimeoutsCalc",
    "TimeoutsCalcError",
    "WorkloadAction",
    "WorkloadControlRequest",
]
