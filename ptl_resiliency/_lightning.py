"""The Lightning package in use: ``lightning.pytorch``, or ``pytorch_lightning`` when only that is
installed. Every module of ``ptl_resiliency`` imports Lightning from here."""

from __future__ import annotations

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, EarlyStopping, Timer
    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from lightning.pytorch.trainer.states import TrainerFn
except ImportError:  # only the standalone package is installed
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.callbacks import Callback, EarlyStopping, Timer  # type: ignore[no-redef]
    from pytorch_lightning.plugins.io import AsyncCheckpointIO  # type: ignore[no-redef]
    from pytorch_lightning.trainer.states import TrainerFn  # type: ignore[no-redef]

__all__ = ["AsyncCheckpointIO", "Callback", "EarlyStopping", "Timer", "TrainerFn", "pl"]
