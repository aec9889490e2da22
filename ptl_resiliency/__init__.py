"""ptl_resiliency: fault tolerance callbacks for PyTorch Lightning.

``FaultToleranceCallback`` detects hangs with heartbeats, ``FaultToleranceSectionsCallback``
with sections (setup, step, checkpointing); both create the auto-resume finished flag and can
calculate and persist timeouts. Lightning is imported as ``lightning.pytorch`` (the package
requires ``lightning``). The sections and timeouts rules are :mod:`ft_core.client.sections_policy`'s,
the same as :mod:`ft_core.client.integration`'s. See ``docs/lightning.md``.
"""

from ft_core.client.simulated_fault import SimulatedFaultParams
from ptl_resiliency.fault_tolerance_callback import FaultToleranceCallback
from ptl_resiliency.fault_tolerance_sections_callback import FaultToleranceSectionsCallback
from ptl_resiliency.straggler_det_callback import StragglerDetectionCallback

__all__ = [
    "FaultToleranceCallback", "FaultToleranceSectionsCallback", "SimulatedFaultParams", "StragglerDetectionCallback",
]
