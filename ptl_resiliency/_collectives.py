"""The collectives fault tolerance needs, through a Lightning strategy.

:class:`StrategyCollectives` implements :class:`ft_core.client.collectives.Collectives` with the
strategy's own ``reduce_boolean_decision``, ``reduce`` and ``broadcast``, so the callbacks work
with whatever strategy the ``Trainer`` uses (DDP, FSDP, DeepSpeed, a single device) and on
whatever device and process group it set up, without a second copy of that choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from ptl_resiliency._lightning import pl


class StrategyCollectives:
    """:class:`~ft_core.client.collectives.Collectives` over ``strategy``'s processes.

    Every rank must call each method (the strategy's collectives are no-ops with one process).

    Args:
        strategy: The ``Trainer``'s strategy, after its setup (``trainer.strategy``).
    """

    def __init__(self, strategy: pl.strategies.Strategy) -> None:
        self._strategy = strategy

    def world_size(self) -> int:
        return int(getattr(self._strategy, "world_size", 1))

    def rank(self) -> int:
        return int(self._strategy.global_rank)

    def all_true(self, flags: Sequence[bool]) -> list[bool]:
        # One small collective per flag: called a few times per run, at checkpoints and at the end.
        return [bool(self._strategy.reduce_boolean_decision(bool(flag), all=True)) for flag in flags]

    def all_max(self, values: Sequence[float]) -> list[float]:
        import torch

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._strategy.root_device)
        reduced = self._strategy.reduce(tensor, reduce_op="max")
        return [float(v) for v in reduced.cpu().tolist()]

    def broadcast_text(self, text: Optional[str]) -> Optional[str]:
        result = self._strategy.broadcast(text, src=0)
        if result is not None and not isinstance(result, str):
            raise TypeError(f"strategy.broadcast returned {type(result).__name__}, expected str or None")
        return result
