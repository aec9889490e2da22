"""The Lightning package: ``lightning.pytorch``, an optional dependency of ptl-resiliency
(``pip install 'ptl-resiliency[lightning]'``). Every module of ``ptl_resiliency`` imports
Lightning from here, so a missing Lightning is one clear error; ``ft_core`` and ``ft_launcher``
never need it."""

from __future__ import annotations

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, EarlyStopping, Timer
    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from lightning.pytorch.trainer.states import TrainerFn
except ModuleNotFoundError as err:
    if err.name is None or err.name.split(".")[0] != "lightning":
        raise
    raise ModuleNotFoundError(
        "ptl_resiliency (the Lightning callbacks) needs PyTorch Lightning, which is not installed: "
        "pip install 'ptl-resiliency[lightning]' (or pip install lightning). ft_core and ft_launcher "
        "work without it.",
        name=err.name,
    ) from err

__all__ = ["AsyncCheckpointIO", "Callback", "EarlyStopping", "Timer", "TrainerFn", "pl"]
