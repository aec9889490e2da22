"""The on-disk format of just-in-time state (ft_core/wire/saved_state.py): write, scan, verify,
claim, prune; a partial, corrupt or foreign state is never offered."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ft_core.wire import saved_state


def _write(directory: str, step: int, payload: bytes = b"payload", **fields: object) -> saved_state.SavedState:
    def writer(path: str) -> None:
        with open(path, "wb") as stream:
            stream.write(payload)

    args = {"kind": "plain", "source": "blocked", "cycle": 0, **fields}
    return saved_state.write(directory, step, writer, **args)  # type: ignore[arg-type]


def test_write_then_newest_and_verify(tmp_path):
    directory = str(tmp_path / "state")
    state = _write(directory, 137, b"x" * 1000, rank=1, local_rank=1, world_size=2)
    assert os.path.basename(state.payload_path) == "state-0000000137.pt"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for path in (state.payload_path, state.manifest_path):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    manifest = json.loads(open(state.manifest_path).read())
    assert manifest["format"] == 1 and manifest["step"] == 137 and manifest["bytes"] == 1000
    assert manifest["kind"] == "plain" and manifest["source"] == "blocked" and manifest["rank"] == 1
    found = saved_state.newest(directory)
    assert found == state
    assert saved_state.verify(found)


def test_newest_is_the_highest_step_and_cycle_filters(tmp_path):
    directory = str(tmp_path)
    _write(directory, 100, cycle=0)
    _write(directory, 99, cycle=1)
    assert saved_state.newest(directory).step == 100
    assert saved_state.newest(directory, cycle=1).step == 99
    assert saved_state.newest(directory, cycle=2) is None
    assert saved_state.newest(str(tmp_path / "missing")) is None


def test_payload_without_manifest_is_not_offered(tmp_path):
    directory = str(tmp_path)
    _write(directory, 5)
    (tmp_path / saved_state.payload_name(6)).write_bytes(b"half written")
    assert saved_state.newest(directory).step == 5


def test_truncated_payload_is_skipped_by_scan(tmp_path):
    directory = str(tmp_path)
    _write(directory, 5)
    state = _write(directory, 6, b"0123456789")
    with open(state.payload_path, "r+b") as stream:
        stream.truncate(4)
    assert saved_state.newest(directory).step == 5


def test_corrupt_payload_fails_verify(tmp_path):
    state = _write(str(tmp_path), 7, b"0123456789")
    with open(state.payload_path, "r+b") as stream:
        stream.write(b"X")  # same size, other bytes
    assert saved_state.newest(str(tmp_path)) == state  # scan reads sizes only
    assert not saved_state.verify(state)


@pytest.mark.parametrize("manifest", [
    "not json", "[]", '{"format": 2, "step": 1, "sha256": "", "bytes": 7, "kind": "plain", "source": "blocked"}',
    '{"format": 1, "step": -1, "sha256": "", "bytes": 7, "kind": "plain", "source": "blocked"}',
    '{"format": 1, "step": 1, "sha256": "", "bytes": 7, "kind": "other", "source": "blocked"}',
    '{"format": 1, "step": 1, "bytes": 7, "kind": "plain", "source": "blocked"}',
])
def test_malformed_or_foreign_manifest_is_ignored(tmp_path, manifest):
    (tmp_path / saved_state.payload_name(1)).write_bytes(b"payload")
    (tmp_path / saved_state.manifest_name(1)).write_text(manifest)
    assert saved_state.newest(str(tmp_path)) is None


def test_failed_writer_leaves_nothing(tmp_path):
    def writer(path: str) -> None:
        with open(path, "wb") as stream:
            stream.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        saved_state.write(str(tmp_path), 3, writer, kind="plain", source="exception")
    assert os.listdir(tmp_path) == []


def test_bad_fields_are_refused(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        saved_state.write(str(tmp_path), 3, lambda path: None, kind="zero", source="exception")


def test_claim_is_once_per_step(tmp_path):
    directory = str(tmp_path)
    assert saved_state.claim(directory, 10)
    assert not saved_state.claim(directory, 10)
    assert saved_state.claim(directory, 11)
    saved_state.release(directory, 10)
    assert saved_state.claim(directory, 10)


def test_prune_keeps_the_newest(tmp_path):
    directory = str(tmp_path)
    for step in (1, 2, 3, 4):
        saved_state.claim(directory, step)
        _write(directory, step)
    (tmp_path / f".{saved_state.payload_name(2)}.123.tmp").write_bytes(b"dead writer")
    (tmp_path / saved_state.payload_name(9)).write_bytes(b"a save in progress")
    saved_state.prune(directory, keep=2)
    assert [s.step for s in saved_state.scan(directory)] == [4, 3]
    left = sorted(os.listdir(directory))
    assert not any(name.startswith(("state-0000000001", "state-0000000002", ".state-0000000002")) for name in left)
    assert saved_state.payload_name(9) in left
