"""The Lightning behaviour the callbacks' skipped hooks rely on, checked on the installed Lightning.

``ptl_resiliency._base.SKIPPED_HOOKS`` are None on the fault tolerance callbacks so that Lightning
does not dispatch them on every batch (each dispatch costs a profiler context). That works only
because Lightning calls a callback's hook when the attribute is callable and passes over one that
is not. These tests run real (tiny, CPU) ``fit``, ``test`` and ``predict`` calls and check, by
what happens, that a None hook is neither called nor an error, that the hooks named are ones
Lightning does call, and that the callbacks define exactly the ones they use. ``make
check-lightning-versions`` runs this file against every supported Lightning minor.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch.utils.data import DataLoader

from ptl_resiliency import FaultToleranceCallback, FaultToleranceSectionsCallback
from ptl_resiliency._base import SKIPPED_HOOKS, _FaultToleranceCallbackBase
from ptl_resiliency._lightning import Callback, pl

LIGHTNING = f"lightning {pl.__version__}"


class Recorder(Callback):
    """Records each call of the skipped hooks (defined here as methods)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = dict.fromkeys(SKIPPED_HOOKS, 0)


def _recording(name: str):
    def hook(self: Recorder, trainer: pl.Trainer, pl_module: pl.LightningModule, *args, **kwargs) -> None:
        self.calls[name] += 1
    hook.__name__ = name
    return hook


for _name in SKIPPED_HOOKS:
    setattr(Recorder, _name, _recording(_name))

class TinyModel(pl.LightningModule):
    """A linear layer on 8 random samples, 2 a batch, in every stage (the demos need extra packages)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.layer(batch)

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.layer(batch)

    def predict_step(self, batch: torch.Tensor, *args: int) -> torch.Tensor:
        return self.layer(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.randn(8, 4), batch_size=2)

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


# The skipped hooks None on the class, as on the fault tolerance callbacks' base.
Skipper = type("Skipper", (Callback,), dict.fromkeys(SKIPPED_HOOKS))


def _run_every_stage(tmp_path, callbacks: list[Callback]) -> None:
    """fit (3 training batches, then one validation batch), test and predict (one batch each)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner per Trainer
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=3, limit_val_batches=1,
        limit_test_batches=1, limit_predict_batches=1, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, callbacks=callbacks,
    )
    model = TinyModel()
    trainer.fit(model)
    assert trainer.global_step == 3, f"{LIGHTNING}: fit did not run its 3 steps"
    trainer.test(model, verbose=False)
    trainer.predict(model)


def test_a_hook_that_is_none_is_not_called_and_no_error(tmp_path):
    """Lightning dispatches the hooks it finds callable; a None one (class or instance) is passed over."""
    recorder = Recorder()
    on_instance = Recorder()  # None on the instance only: the class still has the methods
    for name in SKIPPED_HOOKS:
        setattr(on_instance, name, None)
    _run_every_stage(tmp_path, [Skipper(), recorder, on_instance])  # a None hook that was called would raise
    never = [name for name, count in recorder.calls.items() if count == 0]
    assert not never, f"{LIGHTNING} never called {never}: skipping them saves nothing (renamed hooks?)"
    assert recorder.calls["on_train_batch_start"] == 3 and recorder.calls["on_before_backward"] == 3, (
        f"{LIGHTNING}: {recorder.calls}")
    assert on_instance.calls == dict.fromkeys(SKIPPED_HOOKS, 0), (
        f"{LIGHTNING} called hooks that were None on the instance: {on_instance.calls}")


def test_the_callbacks_skip_exactly_the_hooks_they_do_not_use():
    """The base sets SKIPPED_HOOKS to None; each callback defines as methods the ones it uses,
    and every other Lightning hook they define is a method Lightning can call."""
    for name in SKIPPED_HOOKS:
        assert name in vars(Callback) and callable(vars(Callback)[name]), f"{LIGHTNING}: no Callback.{name} hook"
        assert vars(_FaultToleranceCallbackBase)[name] is None, name
    used = {FaultToleranceCallback: set(), FaultToleranceSectionsCallback: {"on_train_batch_start",
                                                                             "on_validation_batch_start"}}
    for cls, defined in used.items():
        callback = cls(autoresume=False, calculate_timeouts=False)
        skipped = {name for name in SKIPPED_HOOKS if getattr(callback, name) is None}
        assert skipped == set(SKIPPED_HOOKS) - defined, cls.__name__
        assert all(inspect.ismethod(getattr(callback, name)) for name in defined), cls.__name__
