"""JitState (ft_core/client/jit_state.py): a save is accepted only when consistent; it is off
without a state directory; a repeated request is answered from memory."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ft_core.client.jit_state import JitState, StateProvider
from ft_core.wire import saved_state

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _keep_excepthook(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # attach() chains its hook


class Provider:
    kind = "plain"

    def __init__(self) -> None:
        self.step = 7
        self.updating = False
        self.during_capture = lambda: None
        self.sharded = ""

    def completed_step(self) -> int:
        return self.step

    def in_update(self) -> bool:
        return self.updating

    def replicated(self) -> tuple[bool, str]:
        return (not self.sharded, self.sharded)

    def capture(self) -> Any:
        self.during_capture()
        return {"w": torch.arange(4.0), "step": self.step}

    def approx_bytes(self) -> int:
        return 16


def test_provider_satisfies_the_protocol():
    assert isinstance(Provider(), StateProvider)


def test_consistent_save_is_written_and_loadable(tmp_path):
    jit = JitState(state_dir=str(tmp_path), monitor_socket="")
    assert jit.attach(Provider())
    result = jit.save_now("exception")
    assert result.ok and result.step == 7 and result.source == "exception"
    state = saved_state.newest(str(tmp_path))
    assert state is not None and state.payload_path == result.path and saved_state.verify(state)
    assert torch.load(result.path)["step"] == 7
    assert jit.save_now("blocked") == result  # from memory, not a second write


def test_inside_update_declines(tmp_path):
    provider = Provider()
    provider.updating = True
    jit = JitState(state_dir=str(tmp_path), monitor_socket="")
    jit.attach(provider)
    result = jit.save_now("blocked")
    assert not result.ok and "optimizer update" in result.reason
    assert saved_state.newest(str(tmp_path)) is None


def test_step_moving_during_copy_declines_and_releases_the_claim(tmp_path):
    provider = Provider()

    def advance() -> None:
        provider.step += 1

    provider.during_capture = advance
    jit = JitState(state_dir=str(tmp_path), monitor_socket="")
    jit.attach(provider)
    result = jit.save_now("blocked")
    assert not result.ok and "changed during the copy" in result.reason
    assert saved_state.newest(str(tmp_path)) is None
    assert saved_state.claim(str(tmp_path), 7)


def test_sharded_declines(tmp_path):
    provider = Provider()
    provider.sharded = "FSDP shards the state"
    jit = JitState(state_dir=str(tmp_path), monitor_socket="")
    jit.attach(provider)
    assert jit.save_now().reason == "FSDP shards the state"


def test_off_without_a_state_dir(monkeypatch):
    monkeypatch.delenv("FT_JIT_STATE_DIR", raising=False)
    jit = JitState(monitor_socket="")
    assert not jit.attach(Provider())
    assert not jit.save_now().ok


def test_claimed_step_declines(tmp_path):
    saved_state.claim(str(tmp_path), 7)
    jit = JitState(state_dir=str(tmp_path), monitor_socket="")
    jit.attach(Provider())
    assert "another rank" in jit.save_now().reason


def test_copy_to_the_checkpoint_dir(tmp_path):
    jit = JitState(state_dir=str(tmp_path / "local"), monitor_socket="")
    jit.attach(Provider(), checkpoint_dir=str(tmp_path / "ckpt"))
    assert jit.save_now().ok
    shared = saved_state.newest(str(tmp_path / "ckpt" / saved_state.JIT_SUBDIR))
    assert shared is not None and shared.step == 7 and saved_state.verify(shared)


def test_step_moving_during_the_write_declines(tmp_path, monkeypatch):
    provider = Provider()
    jit = JitState(state_dir=str(tmp_path), monitor_socket="")
    jit.attach(provider)
    real_save = torch.save

    def save_then_advance(obj, path):
        real_save(obj, path)
        provider.step += 1  # the main thread completed an update meanwhile

    monkeypatch.setattr(torch, "save", save_then_advance)
    result = jit.save_now("blocked")
    assert not result.ok and "changed during the save" in result.reason
    assert saved_state.newest(str(tmp_path)) is None and os.listdir(tmp_path) == []


def test_plain_loop_round_trip(tmp_path, monkeypatch):
    from ft_core.client import jit_state, plain_state

    monkeypatch.setenv("FT_JIT_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", "")
    monkeypatch.setattr(jit_state, "_default", None)
    monkeypatch.setattr(plain_state, "_provider", None)
    monkeypatch.setattr(plain_state, "_restored_step", None)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters())
    assert plain_state.track_state(model, optimizer, extra=lambda: {"epoch": 3})
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    result = jit_state.save_now("exception")
    assert result.ok and result.step == 2
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    fresh_optimizer = torch.optim.Adam(fresh.parameters())
    monkeypatch.setenv("FT_JIT_RESUME", result.path)
    extras = []
    assert plain_state.load_jit_state(fresh, fresh_optimizer, newer_than=2) is None  # not newer
    assert plain_state.load_jit_state(fresh, fresh_optimizer, newer_than=1, load_extra=extras.append) == 2
    assert extras == [{"epoch": 3}]
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 2
    with open(result.path, "r+b") as stream:  # corrupt: a warning, and None
        stream.seek(50)
        stream.write(b"\x00\x01\x02")
    assert plain_state.load_jit_state(fresh, fresh_optimizer) is None


def test_a_plain_loop_of_a_new_job_loads_the_previous_jobs_shared_copy(tmp_path, monkeypatch, caplog):
    import logging

    from ft_core.client import jit_state, plain_state

    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("FT_JIT_STATE_DIR", str(tmp_path / "job1"))
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", "")
    monkeypatch.delenv("FT_JIT_RESUME", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(jit_state, "_default", None)
    monkeypatch.setattr(plain_state, "_provider", None)
    monkeypatch.setattr(plain_state, "_restored_step", None)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    assert plain_state.track_state(model, optimizer, checkpoint_dir=str(ckpt))
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    assert jit_state.save_now("exception").ok
    # the next job: a new run directory, no FT_JIT_RESUME; the same checkpoint directory
    monkeypatch.setenv("FT_JIT_STATE_DIR", str(tmp_path / "job2"))
    monkeypatch.setattr(jit_state, "_default", None)
    fresh = torch.nn.Linear(4, 4)
    fresh_optimizer = torch.optim.Adam(fresh.parameters())
    assert plain_state.track_state(fresh, fresh_optimizer, checkpoint_dir=str(ckpt))
    assert plain_state.load_jit_state(fresh, fresh_optimizer, newer_than=3) is None  # not newer
    assert plain_state.load_jit_state(fresh, fresh_optimizer, newer_than=1) == 3
    assert plain_state.restored_source() == "jit_shared"
    assert torch.equal(model.weight, fresh.weight)
    # several ranks but no process group to agree through: not used, one warning
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.WARNING):
        assert plain_state.load_jit_state(fresh, fresh_optimizer) is None
    assert "needs the process group" in caplog.text and plain_state.restored_source() is None
    # just-in-time state off (--ft-jit-state false): nothing is read
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("FT_JIT_STATE_DIR")
    monkeypatch.setattr(jit_state, "_default", None)
    assert plain_state.load_jit_state(fresh, fresh_optimizer, checkpoint_dir=str(ckpt)) is None


def test_the_local_manifest_appears_only_once_the_shared_copy_is_complete(tmp_path, monkeypatch):
    """The launcher counts a local manifest as saved and may stop the rank at once: the copy a
    requeued job reads must be complete by then."""
    from ft_core.client import jit_state as module

    jit = JitState(state_dir=str(tmp_path / "local"), monitor_socket="")
    jit.attach(Provider(), checkpoint_dir=str(tmp_path / "ckpt"))
    seen = []
    real_copy = module.shutil.copyfile

    def copy(source, target):
        seen.append(saved_state.newest(str(tmp_path / "local")))
        return real_copy(source, target)

    monkeypatch.setattr(module.shutil, "copyfile", copy)
    assert jit.save_now().ok
    assert seen == [None]
    local = saved_state.newest(str(tmp_path / "local"))
    assert local is not None and local.shared_path.startswith(str(tmp_path / "ckpt"))
    assert saved_state.verify(saved_state.newest(str(tmp_path / "ckpt" / saved_state.JIT_SUBDIR)))


def test_plain_loop_counts_on_from_its_checkpoint_step(tmp_path, monkeypatch):
    """A loop restored from its periodic checkpoint of step 100 (no just-in-time state to use):
    a save two updates later is the state of step 102, not 2 (which the next restart's
    ``newer_than=100`` would reject, falling back to step 100)."""
    from ft_core.client import jit_state, plain_state

    monkeypatch.setenv("FT_JIT_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", "")
    monkeypatch.delenv("FT_JIT_RESUME", raising=False)
    monkeypatch.setattr(jit_state, "_default", None)
    monkeypatch.setattr(plain_state, "_provider", None)
    monkeypatch.setattr(plain_state, "_restored_step", None)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert plain_state.track_state(model, optimizer)
    assert plain_state.load_jit_state(model, optimizer, newer_than=100) is None  # first start: no agreed state
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    result = jit_state.save_now("exception")
    assert result.ok and result.step == 102, result
    # load_jit_state before track_state: the same count
    monkeypatch.setattr(plain_state, "_provider", None)
    assert plain_state.load_jit_state(model, optimizer, newer_than=40) is None
    assert plain_state.track_state(model, optimizer)
    assert jit_state.get_jit_state().provider.completed_step() == 40
