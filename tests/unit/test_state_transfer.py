"""Healing a node from a peer, the transfer (launcher/rendezvous/state_transfer.py): chunking,
the window the store holds, checksum and size checks, the bound, the abort, the keys removed."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading

import pytest
from torch.distributed import HashStore

from ft_core.wire import saved_state
from launcher.rendezvous import state_transfer
from launcher.rendezvous.state_transfer import HEAL_PREFIX, Transfer


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(state_transfer, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(state_transfer, "WINDOW", 3)


def _state(directory, step: int, payload: bytes) -> saved_state.SavedState:
    def writer(path: str) -> None:
        with open(path, "wb") as stream:
            stream.write(payload)

    return saved_state.write(str(directory), step, writer, kind="plain", source="blocked", cycle=0)


class CountingStore:
    """A HashStore that records the most chunk keys present at once."""

    def __init__(self) -> None:
        self.store = HashStore()
        self.present: set[str] = set()
        self.most = 0
        self.lock = threading.Lock()

    def set(self, key, value):
        if "/chunk/" in key:
            with self.lock:
                self.present.add(key)
                self.most = max(self.most, len(self.present))
        return self.store.set(key, value)

    def delete_key(self, key):
        with self.lock:
            self.present.discard(key)
        return self.store.delete_key(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _transfer(store, state, receivers_dirs, timeout=20.0):
    results: dict[int, Transfer] = {}

    def receive(index, directory):
        results[index] = state_transfer.receive(store, str(directory), state.step, timeout)

    threads = [threading.Thread(target=receive, args=(i, d)) for i, d in enumerate(receivers_dirs)]
    for thread in threads:
        thread.start()
    sent = state_transfer.send(store, state, len(receivers_dirs), timeout)
    for thread in threads:
        thread.join(timeout + 5)
    return sent, [results[i] for i in range(len(receivers_dirs))]


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 12_345])
def test_a_payload_arrives_whole_in_chunks_to_every_receiver(tmp_path, size):
    payload = os.urandom(size)
    state = _state(tmp_path / "holder", 137, payload)
    store = CountingStore()
    sent, received = _transfer(store, state, [tmp_path / "a", tmp_path / "b"])
    assert sent.ok and sent.bytes == size, sent
    for result, name in zip(received, "ab", strict=True):
        assert result.ok and result.bytes == size and result.step == 137, result
        found = saved_state.newest(str(tmp_path / name))
        assert found is not None and found.step == 137 and saved_state.verify(found)
        assert open(found.payload_path, "rb").read() == payload
        assert found.sha256 == state.sha256 and found.shared_path == ""
        for path in (found.payload_path, found.manifest_path):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o700
    # the store held at most WINDOW chunks at a time, and nothing of the payload is left in it
    assert store.most <= 3
    assert state_transfer.chunk_count(size) == max(1, -(-size // 1000))
    for index in range(state_transfer.chunk_count(size)):
        assert not store.check([f"{HEAL_PREFIX}137/chunk/{index}"])
    assert not store.check([f"{HEAL_PREFIX}137/manifest"])


def test_a_corrupt_payload_is_refused_and_nothing_is_left(tmp_path):
    state = _state(tmp_path / "holder", 5, b"x" * 4321)
    with open(state.payload_path, "r+b") as stream:  # a byte flipped after the manifest was written
        stream.seek(2000)
        stream.write(b"y")
    sent, (received,) = _transfer(HashStore(), state, [tmp_path / "r"])
    assert not received.ok and "SHA-256 differs" in received.reason
    assert os.listdir(tmp_path / "r") == []
    assert saved_state.newest(str(tmp_path / "r")) is None
    assert sent.bytes == 4321  # the sender sent it all; the receiver's checksum decides


def test_a_chunk_beyond_the_manifests_size_is_refused(tmp_path):
    state = _state(tmp_path / "holder", 5, b"x" * 1500)
    with open(state.payload_path, "ab") as stream:  # grown after its manifest: 2 chunks, more bytes
        stream.write(b"z" * 400)
    store = HashStore()
    store.set(f"{HEAL_PREFIX}5/manifest", json.dumps(state.manifest()))
    store.set(f"{HEAL_PREFIX}5/chunk/0", b"x" * 1000)
    store.set(f"{HEAL_PREFIX}5/chunk/1", b"x" * 900)
    result = state_transfer.receive(store, str(tmp_path / "r"), 5, 5.0)
    assert not result.ok and "overruns" in result.reason
    assert os.listdir(tmp_path / "r") == []
    assert store.check([f"{HEAL_PREFIX}5/abort"])  # the sender stops waiting for its acks


def test_a_receiver_without_sender_gives_up_at_the_bound(tmp_path):
    result = state_transfer.receive(HashStore(), str(tmp_path / "r"), 9, 0.3)
    assert not result.ok and "within the bound" in result.reason
    assert 0.3 <= result.seconds < 5


def test_a_sender_without_receivers_gives_up_at_the_bound_and_cleans_up(tmp_path):
    state = _state(tmp_path / "holder", 9, b"q" * 5000)
    store = HashStore()
    result = state_transfer.send(store, state, 1, 0.3)
    assert not result.ok and "did not take chunk 0" in result.reason
    assert not any(store.check([f"{HEAL_PREFIX}9/chunk/{i}"]) for i in range(5))


def test_an_abort_stops_the_other_side_at_once(tmp_path):
    store = HashStore()
    state_transfer.abort(store, 3, "the state is no longer in the state directory")
    result = state_transfer.receive(store, str(tmp_path / "r"), 3, 30.0)
    assert not result.ok and result.reason == "the state is no longer in the state directory"
    assert result.seconds < 5


@pytest.mark.parametrize("manifest", [b"not json", json.dumps({"step": 4}).encode(),
                                      json.dumps({"step": 3, "bytes": -1, "sha256": "x"}).encode(),
                                      json.dumps([1]).encode(), b"{" * 70_000])
def test_a_bad_manifest_is_refused(tmp_path, manifest):
    store = HashStore()
    store.set(f"{HEAL_PREFIX}3/manifest", manifest)
    result = state_transfer.receive(store, str(tmp_path / "r"), 3, 5.0)
    assert not result.ok and "manifest" in result.reason


def test_a_manifest_that_is_not_a_saved_state_leaves_nothing(tmp_path):
    payload = b"abc"
    store = HashStore()
    store.set(f"{HEAL_PREFIX}3/manifest", json.dumps({"step": 3, "bytes": 3, "sha256": hashlib.sha256(payload)
                                                      .hexdigest(), "format": 99}))
    store.set(f"{HEAL_PREFIX}3/chunk/0", payload)
    result = state_transfer.receive(store, str(tmp_path / "r"), 3, 5.0)
    assert not result.ok and "not a valid one" in result.reason
    assert os.listdir(tmp_path / "r") == []


def test_the_default_bound_grows_with_the_bytes():
    assert state_transfer.heal_timeout(None, 0) == 10.0
    assert state_transfer.heal_timeout(None, 200_000_000) == 30.0
    assert state_transfer.heal_timeout(3.5, 10**12) == 3.5
