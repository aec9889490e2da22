"""The Lightning side of just-in-time state (ptl_resiliency._jit_state, _jit_restore), in process.

Real (tiny, CPU, one device) ``fit`` runs: the state a second thread copies while the main thread
is blocked inside a training step, when the provider says "in update", the restore of
``FT_JIT_RESUME`` whatever ``ckpt_path`` the user passes, and the refusal of sharded strategies.
The 2-rank runs under ft_launcher are in tests/integration/test_lightning_jit_state.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from ft_core.client.ranklog import RankLoggerAdapter
from ft_core.wire import saved_state
from ft_core.wire.env import FT_JIT_RESUME_ENV_VAR, FT_JIT_RESUME_STEP_ENV_VAR, FT_JIT_STATE_DIR_ENV_VAR
from ptl_resiliency import _jit_restore
from ptl_resiliency._collectives import StrategyCollectives
from ptl_resiliency._jit_restore import JitRestore
from ptl_resiliency._jit_state import LightningProvider, sharding_reason
from ptl_resiliency._lightning import Callback, pl

LOG = RankLoggerAdapter(logging.getLogger("test.jit"))


def state_hash(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the parameters and the optimizer's state tensors, in a fixed order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for index, state in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            digest.update(f"{index}.{key}".encode())
            digest.update(torch.as_tensor(value).detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Model(pl.LightningModule):
    """A linear layer with Adam (optimizer state to copy) on 16 fixed samples; hooks for tests."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 2)
        self.in_step = None  # called in training_step with the global step

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.in_step is not None:
            self.in_step(self.trainer.global_step)
        return self.layer(batch).pow(2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.arange(64, dtype=torch.float32).reshape(16, 4) / 64, batch_size=2)


class Track(Callback):
    """Makes a LightningProvider at train start and tells it each batch end, as the callbacks do."""

    def __init__(self) -> None:
        self.provider: LightningProvider | None = None
        self.after_batch: list[bool] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.provider = LightningProvider(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.provider.batch_ended()

    def on_train_end(self, trainer, pl_module) -> None:
        self.provider.close()


def trainer_for(tmp_path, callbacks, **kwargs) -> pl.Trainer:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    options = dict(accelerator="cpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                   num_sanity_val_steps=0, callbacks=callbacks)
    options.update(kwargs)
    return pl.Trainer(**options)


def test_a_second_thread_copies_the_last_completed_step_while_the_main_thread_is_blocked(tmp_path):
    track, model = Track(), Model()
    blocked, copied = threading.Event(), threading.Event()
    seen: dict = {}

    def block_at_3(step: int) -> None:
        if step == 3:  # as in DDP's gradient all-reduce with a hung peer: GIL released, nothing moves
            seen["expected"] = state_hash(model, model.trainer.optimizers[0])
            blocked.set()
            assert copied.wait(30)

    def copier() -> None:
        assert blocked.wait(30)
        provider = track.provider
        seen["before"] = (provider.completed_step(), provider.in_update())
        seen["checkpoint"] = provider.capture()
        seen["after"] = (provider.completed_step(), provider.in_update())
        seen["bytes"] = provider.approx_bytes()
        copied.set()

    model.in_step = block_at_3
    thread = threading.Thread(target=copier)
    thread.start()
    trainer_for(tmp_path, [track]).fit(model)
    thread.join(30)
    assert seen["before"] == seen["after"] == (3, False)
    checkpoint = seen["checkpoint"]
    assert checkpoint["global_step"] == 3 and set(checkpoint) >= {"state_dict", "optimizer_states", "loops"}
    # A copy, not the live tensors: training went on to step 6 after it.
    restored, optimizer = Model(), None
    restored.load_state_dict(checkpoint["state_dict"])
    optimizer = torch.optim.Adam(restored.parameters(), lr=0.01)
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    assert state_hash(restored, optimizer) == seen["expected"] != state_hash(model, model.trainer.optimizers[0])
    assert all(t.device.type == "cpu" for t in checkpoint["state_dict"].values())
    assert seen["bytes"] == 10 * 4 * 3 + 2 * 4  # weights + bias, Adam's two moments and its step counters


class RecordingAdam(torch.optim.Adam):
    """Records the provider's in_update inside the update (after the closure returned)."""

    provider_of = None
    inside: list[bool] = []

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.inside.append(self.provider_of().in_update())
        super().step()
        return loss


@pytest.mark.parametrize("accumulate", [1, 2])
def test_in_update_spans_the_update_and_unfinished_accumulation_windows(tmp_path, accumulate):
    track, model = Track(), Model()
    in_step: list[tuple[int, bool]] = []
    model.in_step = lambda step: in_step.append((step, track.provider.in_update()))
    RecordingAdam.provider_of = staticmethod(lambda: track.provider)
    RecordingAdam.inside = []
    model.configure_optimizers = lambda: RecordingAdam(model.parameters(), lr=0.01)

    class AfterTrack(Callback):  # after Track in the list: the batch's step is counted
        after: list[bool] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.after.append(track.provider.in_update())

    after = AfterTrack()
    trainer_for(tmp_path, [track, after], max_steps=4, accumulate_grad_batches=accumulate).fit(model)
    assert RecordingAdam.inside == [True] * 4
    if accumulate == 1:
        assert [flag for _, flag in in_step] == [False] * 4
        assert after.after == [False] * 4
    else:  # the second micro-batch of each window runs with the first one's gradients pending
        assert [flag for _, flag in in_step] == [False, True] * 4
        assert after.after == [True, False] * 4


def test_sharded_strategies_and_optimizers_are_refused_with_a_reason():
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    # object.__new__: DeepSpeedStrategy's constructor needs deepspeed; only the type matters here.
    for cls, words in ((FSDPStrategy, "shards parameters"), (DeepSpeedStrategy, "shards optimizer state"),
                       (ModelParallelStrategy, "splits the model")):
        reason = sharding_reason(object.__new__(cls))
        assert reason is not None and cls.__name__ in reason and words in reason, reason

    class ZeroLike(torch.optim.SGD):
        def consolidate_state_dict(self, to: int = 0) -> None: ...

    ddp = object.__new__(DDPStrategy)
    ddp._lightning_module = None
    assert sharding_reason(ddp) is None
    assert "ZeroLike shards its state" in sharding_reason(ddp, [ZeroLike([torch.zeros(1, requires_grad=True)], lr=1)])
    assert sharding_reason(SingleDeviceStrategy("cpu")) is None
    assert "not a data-parallel one" in sharding_reason(object())


# ---------------------------------------------------------------------- the restore


class ArmRestore(Callback):
    """Arms JitRestore in setup, as FitSession.open does."""

    def __init__(self) -> None:
        self.restore = JitRestore(LOG)
        self.steps: list[int] = []
        self.hash: str | None = None

    def setup(self, trainer, pl_module, stage) -> None:
        self.restore.install(trainer, StrategyCollectives(trainer.strategy))

    def on_train_start(self, trainer, pl_module) -> None:
        self.restore.uninstall()
        self.steps.append(trainer.global_step)
        self.hash = state_hash(pl_module, trainer.optimizers[0])


@pytest.fixture
def jit_env(tmp_path, monkeypatch):
    """A just-in-time state of step 3 saved the way JitState saves one; FT_JIT_RESUME names it."""
    monkeypatch.setattr(_jit_restore, "_used_in_process", False)
    track, model = Track(), Model()
    saved: dict = {}

    def save_at_3(step: int) -> None:
        if step == 3 and not saved:
            saved["hash"] = state_hash(model, model.trainer.optimizers[0])
            captured = track.provider.capture()
            saved["state"] = saved_state.write(str(tmp_path / "state"), 3, lambda path: torch.save(captured, path),
                                               kind="lightning", source="exception", started=time.monotonic(),
                                               rank=0, local_rank=0, cycle=0, world_size=1)

    model.in_step = save_at_3
    trainer = trainer_for(tmp_path, [track], enable_checkpointing=True, max_steps=2)
    trainer.fit(model)  # a periodic checkpoint of step 2, written BEFORE the state of step 3
    trainer.save_checkpoint(tmp_path / "old.ckpt")
    time.sleep(0.05)  # distinct modification times
    trainer_for(tmp_path, [track], max_steps=4).fit(model, ckpt_path=tmp_path / "old.ckpt")
    state = saved["state"]
    monkeypatch.setenv(FT_JIT_RESUME_ENV_VAR, state.payload_path)
    monkeypatch.setenv(FT_JIT_RESUME_STEP_ENV_VAR, str(state.step))
    return state, saved["hash"]


@pytest.mark.parametrize("user_path", [None, "old.ckpt", "last"])
def test_fit_resumes_from_the_state_whatever_ckpt_path_the_user_passes(tmp_path, jit_env, user_path, caplog):
    state, expected = jit_env
    arm = ArmRestore()
    trainer = trainer_for(tmp_path, [arm], max_steps=5)
    ckpt_path = tmp_path / user_path if user_path == "old.ckpt" else user_path
    with caplog.at_level(logging.INFO):
        trainer.fit(Model(), ckpt_path=ckpt_path)
    assert arm.steps == [3] and arm.hash == expected and trainer.global_step == 5
    assert arm.restore.restored == state
    assert "resuming from the just-in-time state of step 3" in caplog.text
    assert "_restore_modules_and_callbacks" not in vars(trainer._checkpoint_connector)  # unwrapped
    # A second fit in the same process does not go back to it.
    arm2 = ArmRestore()
    trainer_for(tmp_path, [arm2], max_steps=1).fit(Model())
    assert arm2.steps == [0] and arm2.restore.restored is None


def test_a_user_checkpoint_written_after_the_state_wins(tmp_path, jit_env, caplog):
    trainer = trainer_for(tmp_path, [], max_steps=1)
    trainer.fit(Model())
    trainer.save_checkpoint(tmp_path / "newer.ckpt")  # step 1, but written after the state of step 3
    arm = ArmRestore()
    with caplog.at_level(logging.INFO):
        trainer_for(tmp_path, [arm], max_steps=2).fit(Model(), ckpt_path=tmp_path / "newer.ckpt")
    assert arm.steps == [1] and arm.restore.restored is None
    assert "was written after the just-in-time state of step 3: resuming from it" in caplog.text


@pytest.mark.parametrize("damage", ["corrupt", "wrong_step", "no_manifest"])
def test_a_broken_state_falls_back_to_the_users_checkpoint_with_one_line(tmp_path, jit_env, damage, monkeypatch,
                                                                           caplog):
    state, _ = jit_env
    if damage == "corrupt":
        with open(state.payload_path, "r+b") as stream:
            stream.seek(100)
            stream.write(b"\0" * 16)
        os.utime(state.payload_path)  # keep it the newest file
    elif damage == "wrong_step":
        monkeypatch.setenv(FT_JIT_RESUME_STEP_ENV_VAR, "4")
    else:
        os.unlink(os.path.splitext(state.payload_path)[0] + ".json")
    arm = ArmRestore()
    with caplog.at_level(logging.INFO):
        trainer_for(tmp_path, [arm], max_steps=3).fit(Model(), ckpt_path=tmp_path / "old.ckpt")
    assert arm.steps == [2] and arm.restore.restored is None
    lines = [r.getMessage() for r in caplog.records if "just-in-time state" in r.getMessage()]
    expected = {"corrupt": "fails its checksum", "wrong_step": "FT_JIT_RESUME_STEP=4",
                "no_manifest": "has no valid manifest"}[damage]
    assert any(expected in line for line in lines), lines
    assert any("resum" in line and "old.ckpt" in line for line in lines), lines


# ---------------------------------------------------------------------- resumable data loaders


class ResumableLoader:
    """12 samples (sample i is a (1, 4) tensor of i), one a batch; its state: how many it yielded."""

    def __init__(self) -> None:
        self.start = self.yielded = 0

    def __len__(self) -> int:
        return 12

    def __iter__(self):
        self.yielded, self.start = self.start, 0
        while self.yielded < 12:
            self.yielded += 1
            yield torch.full((1, 4), float(self.yielded - 1))

    def state_dict(self) -> dict:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.start = state["yielded"]


class SeenModel(Model):
    """Records (epoch, batch_idx, sample, global_step) of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.loader = ResumableLoader()
        self.seen: list[tuple[int, int, int, int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.trainer.current_epoch, batch_idx, int(batch[0, 0]), self.trainer.global_step))
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return self.loader


@pytest.mark.parametrize("step", [5, 12])
def test_a_resumable_loader_replays_the_batch_in_flight_like_lightnings_own_resume(tmp_path, step):
    """A copy taken inside batch ``step`` (5: mid-epoch; 12: the first batch of epoch 1) redoes the
    batch in flight and then goes on as the run would have: the same as Lightning's own checkpoint
    of the batch end before it (mid-epoch), a fresh pass over the data (first batch of an epoch)."""
    track, model = Track(), SeenModel()
    paths = {"jit": tmp_path / "jit.ckpt", "lightning": tmp_path / "lightning.ckpt"}

    class SaveBatchEnd(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == step:
                trainer.save_checkpoint(paths["lightning"])

    def capture(at: int) -> None:
        if at == step:
            torch.save(track.provider.capture(), paths["jit"])

    model.in_step = capture
    trainer_for(tmp_path, [track, SaveBatchEnd()], max_steps=-1, max_epochs=2).fit(model)
    resumed = {}
    for name, path in paths.items():
        again = SeenModel()
        trainer_for(tmp_path, [], max_steps=-1, max_epochs=2).fit(again, ckpt_path=path)
        resumed[name] = again.seen
    if step == 5:  # Lightning's own checkpoint at the end of batch 4 resumes the same way
        assert resumed["jit"] == resumed["lightning"]
    assert resumed["jit"][0] == ((0, 5, 5, 5) if step == 5 else (1, 0, 0, 12))
    assert [sample for _, _, sample, _ in resumed["jit"]] == list(range(step % 12, 12)) + list(range(12 * (step < 12)))


@pytest.mark.parametrize("call", ["keyword", "positional", "none"])
def test_the_update_starts_when_the_closure_returns_however_step_is_called(tmp_path, call):
    track, model = Track(), Model()
    trainer_for(tmp_path, [track], max_steps=1).fit(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    provider = LightningProvider.__new__(LightningProvider)
    provider._updating = provider._stepped = provider._accumulating = False
    handle = optimizer.register_step_pre_hook(provider._step_starts)
    during: list[bool] = []

    def closure():
        during.append(provider.in_update())
        loss = model.layer(torch.ones(1, 4)).sum()
        loss.backward()
        return loss

    {"keyword": lambda: optimizer.step(closure=closure), "positional": lambda: optimizer.step(closure),
     "none": lambda: (closure(), optimizer.step())}[call]()
    handle.remove()
    assert during == [False] and provider.in_update() and provider._stepped


def test_a_sharded_strategy_is_refused_with_one_line_and_nothing_is_saved(tmp_path, caplog):
    from lightning.pytorch.strategies import FSDPStrategy

    from ft_core.client.jit_state import JitState

    provider = LightningProvider.__new__(LightningProvider)  # what __init__ computes for an FSDP Trainer
    provider._refusal = sharding_reason(object.__new__(FSDPStrategy))
    provider._updating = provider._accumulating = False
    provider._trainer = type("T", (), {"global_step": 7})()
    state = JitState(state_dir=str(tmp_path / "state"), monitor_socket="")
    with caplog.at_level(logging.INFO):
        assert state.attach(provider)
        state.attach(provider)  # a second fit of the same process: no second line
        result = state.save_now("exception")
    state.detach()
    lines = [r.getMessage() for r in caplog.records if "just-in-time state" in r.getMessage()]
    assert lines == ["just-in-time state is off for this job: the FSDPStrategy strategy shards parameters, "
                     "gradients and optimizer state across ranks; it needs a replicated job (DDP), so restarts "
                     "resume from the periodic checkpoints"], lines
    assert not result.ok and "FSDPStrategy" in result.reason
    assert not list(tmp_path.rglob("*.pt"))


def test_with_the_feature_on_but_no_state_every_rank_still_takes_part_and_nothing_is_said(tmp_path, monkeypatch,
                                                                                          caplog):
    """A node without a state must run the same collectives as one with a state."""
    from ft_core.wire.env import FT_JIT_STATE_DIR_ENV_VAR

    monkeypatch.setattr(_jit_restore, "_used_in_process", False)
    monkeypatch.delenv(FT_JIT_RESUME_ENV_VAR, raising=False)
    monkeypatch.setenv(FT_JIT_STATE_DIR_ENV_VAR, str(tmp_path / "state"))
    arm = ArmRestore()
    with caplog.at_level(logging.DEBUG, logger="test.jit"):
        trainer_for(tmp_path, [arm], max_steps=1).fit(Model())
    assert arm.restore._connector is None and arm.steps == [0] and arm.restore.restored is None
    assert _jit_restore._used_in_process  # it did run the choice (and its broadcast)
    assert not [r for r in caplog.records if r.name == "test.jit"]


# ---------------------------------------------------------------------- a requeued job


@pytest.fixture
def requeue_env(tmp_path, jit_env, monkeypatch):
    """jit_env's state of step 3 as a previous job left it in ``<ModelCheckpoint dirpath>/ft_jit_state``;
    a new job: no FT_JIT_RESUME, just-in-time state on."""
    state, expected = jit_env
    shared = tmp_path / "ckpt" / saved_state.JIT_SUBDIR
    shared.mkdir(parents=True)
    for path in (state.payload_path, state.manifest_path):
        shutil.copyfile(path, shared / os.path.basename(path))
    monkeypatch.delenv(FT_JIT_RESUME_ENV_VAR)
    monkeypatch.delenv(FT_JIT_RESUME_STEP_ENV_VAR)
    monkeypatch.setenv(FT_JIT_STATE_DIR_ENV_VAR, str(tmp_path / "new_run_state"))
    return shared / os.path.basename(state.payload_path), expected


def test_a_requeued_fit_resumes_from_the_previous_jobs_copy(tmp_path, requeue_env, caplog):
    payload, expected = requeue_env
    arm = ArmRestore()
    with caplog.at_level(logging.INFO):
        trainer_for(tmp_path, [arm, ModelCheckpoint(dirpath=tmp_path / "ckpt")], enable_checkpointing=True,
                    max_steps=4).fit(Model(), ckpt_path=tmp_path / "old.ckpt")
    assert arm.steps == [3] and arm.hash == expected
    assert arm.restore.restored is not None and arm.restore.restored.payload_path == str(payload)
    assert arm.restore.from_shared
    assert "that a previous job copied to" in caplog.text


def test_a_user_checkpoint_written_after_the_previous_jobs_copy_wins(tmp_path, requeue_env, caplog):
    trainer = trainer_for(tmp_path, [], max_steps=1)
    trainer.fit(Model())
    time.sleep(0.05)
    trainer.save_checkpoint(tmp_path / "newer.ckpt")  # step 1, written after the copy of step 3
    arm = ArmRestore()
    with caplog.at_level(logging.INFO):
        trainer_for(tmp_path, [arm, ModelCheckpoint(dirpath=tmp_path / "ckpt")], enable_checkpointing=True,
                    max_steps=2).fit(Model(), ckpt_path=tmp_path / "newer.ckpt")
    assert arm.steps == [1] and arm.restore.restored is None and not arm.restore.from_shared
    assert "was written after the just-in-time state of step 3" in caplog.text


def test_without_a_model_checkpoint_nothing_is_read(tmp_path, requeue_env):
    arm = ArmRestore()
    trainer_for(tmp_path, [arm], max_steps=3).fit(Model(), ckpt_path=tmp_path / "old.ckpt")
    assert arm.steps == [2] and arm.restore.restored is None
