"""ft_core: hang detection for distributed training ranks.

Three runtimes share this package, one subpackage each: :mod:`ft_core.client` runs in the
training ranks, :mod:`ft_core.monitor` is the stdlib-only rank monitor, and :mod:`ft_core.wire`
is what both (and the launcher) share: the wire format, the config, names and OS helpers.

Importing this package never imports torch, and its public names are loaded on first use, so a
rank monitor that imports :mod:`ft_core.monitor` loads none of the client.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "ConfigError": "ft_core.wire.config",
    "FaultToleranceConfig": "ft_core.wire.config",
    "HeartbeatTimeouts": "ft_core.wire.data",
    "SectionAction": "ft_core.wire.data",
    "SectionTimeouts": "ft_core.wire.data",
    "WorkloadAction": "ft_core.wire.data",
    "WorkloadControlRequest": "ft_core.wire.data",
    "FAULT_TOL_FINISHED_FLAG_FILE_ENV_VAR": "ft_core.wire.env",
    "FT_LAUNCHER_IPC_SOCKET_ENV_VAR": "ft_core.wire.env",
    "FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR": "ft_core.wire.env",
    "RankMonitorClientError": "ft_core.wire.errors",
    "TimeoutsCalcError": "ft_core.wire.errors",
    "RankMonitorClient": "ft_core.client.rank_monitor_client",
    "TimeoutsCalc": "ft_core.client.timeouts_calc",
    "RankMonitorServer": "ft_core.monitor.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ft_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__all__ = sorted(_HOMES)
