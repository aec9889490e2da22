"""The ranks of a requeued job agree on a previous job's just-in-time state (ft_core/client/requeue_state.py).

Two "ranks" run in two threads over a tiny in-memory process group; their shared directories are
given separately, so a copy one rank lacks (or holds with other bytes) can be set up."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Optional

import pytest

from ft_core.client import requeue_state
from ft_core.wire import saved_state


class _Group:
    """Lockstep collectives for ``size`` threads (the :class:`Collectives` interface, per rank)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots: list = [None] * size

    def member(self, rank: int) -> _Member:
        return _Member(self, rank)


class _Member:
    def __init__(self, group: _Group, rank: int) -> None:
        self.group, self._rank = group, rank

    def world_size(self) -> int:
        return self.group.size

    def rank(self) -> int:
        return self._rank

    def _exchange(self, value):
        self.group.slots[self._rank] = value
        self.group.barrier.wait()
        values = list(self.group.slots)
        self.group.barrier.wait()
        return values

    def broadcast_text(self, text: Optional[str]) -> Optional[str]:
        return self._exchange(text)[0]

    def all_true(self, flags):
        return [all(column) for column in zip(*self._exchange(list(flags)), strict=True)]

    def all_max(self, values):
        return [max(column) for column in zip(*self._exchange(list(values)), strict=True)]


def _save(directory: Path, step: int, content: bytes = b"", kind: str = "plain") -> saved_state.SavedState:
    return saved_state.write(str(directory), step, lambda path: Path(path).write_bytes(content or b"x%d" % step * 64),
                             kind=kind, source="exception")


def _agree(dirs: list[Optional[Path]], accept=lambda _s: True) -> list[Optional[int]]:
    group = _Group(len(dirs))
    found: list = [None] * len(dirs)

    def rank(index: int) -> None:
        directory = str(dirs[index]) if dirs[index] else None
        state = requeue_state.agree_on_shared_state(directory, "plain", group.member(index), accept)
        found[index] = state.step if state is not None else None

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(dirs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return found


def test_the_newest_state_every_rank_holds_is_chosen_on_every_rank(tmp_path):
    for rank in (0, 1):
        _save(tmp_path / f"r{rank}", 100)
        _save(tmp_path / f"r{rank}", 137)
    assert _agree([tmp_path / "r0", tmp_path / "r1"]) == [137, 137]


def test_a_state_one_rank_lacks_is_not_used_the_older_common_one_is(tmp_path, caplog):
    for rank in (0, 1):
        _save(tmp_path / f"r{rank}", 100)
    _save(tmp_path / "r0", 137)
    assert _agree([tmp_path / "r0", tmp_path / "r1"]) == [100, 100]
    with caplog.at_level(logging.WARNING):
        assert _agree([tmp_path / "r0", tmp_path / "r1"], accept=lambda s: s.step > 100) == [None, None]
    assert "step 137" in caplog.text and "not readable on every rank" in caplog.text


def test_the_same_step_with_other_bytes_is_never_mixed(tmp_path):
    _save(tmp_path / "r0", 137, b"a" * 64)
    _save(tmp_path / "r1", 137, b"b" * 64)
    assert _agree([tmp_path / "r0", tmp_path / "r1"]) == [None, None]


def test_a_corrupt_copy_is_skipped_with_one_warning(tmp_path, caplog):
    for rank in (0, 1):
        _save(tmp_path / f"r{rank}", 100)
        _save(tmp_path / f"r{rank}", 137)
    payload = tmp_path / "r1" / saved_state.payload_name(137)
    payload.write_bytes(b"y" * len(payload.read_bytes()))  # same size, other bytes
    with caplog.at_level(logging.WARNING):
        assert _agree([tmp_path / "r0", tmp_path / "r1"]) == [100, 100]
    corrupt = [r for r in caplog.records if "is corrupt" in r.getMessage()]
    assert len(corrupt) == 1 and "step 137" in corrupt[0].getMessage()


def test_nothing_is_chosen_without_a_directory_an_accepted_state_or_the_right_kind(tmp_path):
    _save(tmp_path / "r0", 137)
    _save(tmp_path / "r1", 137)
    assert _agree([tmp_path / "r0", None]) == [None, None]
    assert _agree([None, tmp_path / "r1"]) == [None, None]
    assert _agree([tmp_path / "r0", tmp_path / "r1"], accept=lambda s: s.step > 137) == [None, None]
    _save(tmp_path / "l0", 150, kind="lightning")
    assert _agree([tmp_path / "l0", tmp_path / "l0"]) == [None, None]
    assert _agree([tmp_path / "missing", tmp_path / "missing"]) == [None, None]


def test_a_payload_of_another_user_is_not_used(tmp_path, monkeypatch, caplog):
    state = _save(tmp_path / "r0", 137)
    monkeypatch.setattr(requeue_state.os, "getuid", lambda: 12345)
    with caplog.at_level(logging.WARNING):
        assert requeue_state.verified_states(str(tmp_path / "r0"), "plain") == []
    assert "not owned by this user" in caplog.text and state.payload_path


@pytest.mark.parametrize("checkpoint_dir", [None, ""])
def test_no_checkpoint_directory_no_shared_directory(checkpoint_dir):
    assert requeue_state.shared_state_dir(checkpoint_dir) is None
    assert requeue_state.shared_state_dir("/ckpt") == "/ckpt/ft_jit_state"
