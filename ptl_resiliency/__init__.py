"""ptl_resiliency: fault tolerance callbacks for PyTorch Lightning.

``FaultToleranceCallback`` detects hangs with heartbeats, ``FaultToleranceSectionsCallback``
with sections (setup, step, checkpointing); both create the auto-resume finished flag and can
calculate and persist timeouts. Lightning is imported as ``lightning.pytorch``, or as
``pytorch_lightning`` when only that package is installed. See ``docs/lightning.md``.
"""

from ft_core.simulated_fault import SimulatedFaultParams
from ptl_resiliency.heartbeats_callback import FaultToleranceCallback
from ptl_resiliency.sections_callback import FaultToleranceSectionsCallback

__all__ = ["FaultToleranceCallback", "FaultToleranceSectionsCallback", "SimulatedFaultParams"]
