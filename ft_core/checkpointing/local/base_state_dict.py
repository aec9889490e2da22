"""The interface between a training state and a local checkpoint manager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class TensorAwareStateDict(ABC):
    """A state dict whose tensors a checkpoint manager can copy off the device and back.

    A manager calls :meth:`copy_tensors_to_cpu` on the training thread (the only part of a save
    the step waits for), serializes the result in the background, and after a load calls
    :meth:`restore_tensor_device` and :meth:`to_state_dict`.
    """

    @abstractmethod
    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        """Replace every tensor by a CPU copy that later training steps do not change."""

    @abstractmethod
    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """Move the tensors back to the devices they were saved from, where those exist."""

    @abstractmethod
    def to_state_dict(self) -> Any:
        """The plain state (e.g. Lightning's checkpoint dict)."""
