"""Which fault tolerance implementation a benchmark drives: ours or the peer (NVRx).

The benchmarks run the same code against ``ft_core``/``ptl_resiliency`` (``--impl ours``) or
against NVIDIA nvidia-resiliency-ext (``--impl nvrx``). NVRx is never part of this repository:
``make bench-peer`` installs it into a separate virtual environment (``.venv-peer``) and runs the
``--impl nvrx`` variants with that environment's interpreter. The two packages have the same
client/monitor API (this project is API-compatible with NVRx), so only the imports differ.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

IMPLS = ("ours", "nvrx")

_MODULES = {
    "ours": {"core": "ft_core", "ptl": "ptl_resiliency", "launcher": "launcher"},
    "nvrx": {
        "core": "nvidia_resiliency_ext.fault_tolerance",
        "ptl": "nvidia_resiliency_ext.ptl_resiliency",
        "launcher": "nvidia_resiliency_ext.fault_tolerance.launcher",
    },
}


def module_name(impl: str, part: str) -> str:
    """The module that holds ``part`` ("core", "ptl" or "launcher") of ``impl``."""
    return _MODULES[impl][part]


def core(impl: str) -> SimpleNamespace:
    """FaultToleranceConfig, RankMonitorClient and RankMonitorServer of ``impl``."""
    module = importlib.import_module(_MODULES[impl]["core"])
    return SimpleNamespace(
        FaultToleranceConfig=module.FaultToleranceConfig,
        RankMonitorClient=module.RankMonitorClient,
        RankMonitorServer=module.RankMonitorServer,
    )


def callbacks(impl: str) -> SimpleNamespace:
    """The Lightning FaultToleranceCallback and FaultToleranceSectionsCallback of ``impl``."""
    module = importlib.import_module(_MODULES[impl]["ptl"])
    return SimpleNamespace(
        FaultToleranceCallback=module.FaultToleranceCallback,
        FaultToleranceSectionsCallback=module.FaultToleranceSectionsCallback,
    )


def launcher_command(impl: str, python: str) -> list[str]:
    """The command that starts ``impl``'s ft_launcher with the interpreter ``python``."""
    return [python, "-m", _MODULES[impl]["launcher"]]
