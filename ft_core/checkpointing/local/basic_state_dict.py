"""A :class:`TensorAwareStateDict` for states whose tensors sit in nested dicts, lists and tuples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ft_core.checkpointing.local.base_state_dict import TensorAwareStateDict


def map_tensors(fn: Callable[[Any], Any], value: Any) -> Any:
    """A copy of ``value`` with every tensor replaced by ``fn(tensor)``.

    Dicts (their type kept, e.g. ``OrderedDict``), lists and tuples are rebuilt, so that training
    code that later changes the original containers does not change the copy; other objects are
    shared.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        rebuilt = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            rebuilt[key] = map_tensors(fn, item)
        return rebuilt
    if isinstance(value, list):
        return [map_tensors(fn, item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(map_tensors(fn, item) for item in value)
    return value


class BasicTensorAwareStateDict(TensorAwareStateDict):
    """Wraps a state dict (e.g. Lightning's checkpoint) whose tensors are in dicts, lists and tuples.

    Unlike the reference's, tensors may be on the CPU (the copy is then a clone) as well as on CUDA.

    Args:
        state_dict: The state; it is not changed (the copy replaces this object's view of it).
    """

    def __init__(self, state_dict: Any) -> None:
        self.state_dict = state_dict
        self._devices: dict[int, Any] = {}

    @property
    def tensors(self) -> list[Any]:
        """The tensors of the state, in a fixed order."""
        found: list[Any] = []

        def collect(tensor: Any) -> Any:
            found.append(tensor)
            return tensor

        map_tensors(collect, self.state_dict)
        return found

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        """Replace the state by one whose tensors are CPU copies (clones of CPU tensors).

        Args:
            non_blocking: For CUDA tensors: an asynchronous copy into pinned memory; the caller
                synchronizes (``BaseCheckpointManager.save`` does).
        """
        def copy(tensor: Any) -> Any:
            detached = tensor.detach()
            if detached.device.type == "cpu":
                return detached.clone()
            target = detached.new_empty(detached.shape, device="cpu", pin_memory=non_blocking)
            target.copy_(detached, non_blocking=non_blocking)
            self._devices[id(target)] = detached.device
            return target

        self.state_dict = map_tensors(copy, self.state_dict)

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """Move tensors copied from a device back there (a loaded state stays on the CPU: Lightning
        moves it where the model is)."""
        if not self._devices:
            return
        self.state_dict = map_tensors(
            lambda t: t.to(self._devices[id(t)], non_blocking=non_blocking) if id(t) in self._devices else t,
            self.state_dict)
        self._devices.clear()

    def to_state_dict(self) -> Any:
        """The wrapped state."""
        return self.state_dict
