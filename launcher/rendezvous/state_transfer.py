"""Healing a node from a peer: one node's just-in-time state sent to the nodes that lack it,
through the round's rendezvous store (docs/jit-state.md, "Healing a node from a peer").

Why the store and not a direct connection: the store is the one endpoint every node of the job is
known to reach (the rendezvous needs it), and only members of the job talk to it. A direct TCP
connection would be faster but needs a port open between any two nodes, an address each node can
be reached at, and its own authentication. Every byte here passes through the store's host, so
the memory it holds for a transfer is bounded: at most :data:`WINDOW` chunks of
:data:`CHUNK_BYTES` wait there at a time (the sender deletes each chunk once every receiver has
acknowledged it).

Keys, all under :data:`HEAL_PREFIX` in the round's store (torch prefixes them with the round, so a
later round never sees them)::

    <step>/manifest        the sender's manifest (JSON, at most MAX_MANIFEST_BYTES)
    <step>/chunk/<i>       the payload's i-th chunk (raw bytes; never pickled)
    <step>/ack/<i>         counter: receivers that wrote chunk i
    <step>/abort           why a side gave up (the other side stops waiting)

A receiver hashes what it writes, and only a payload of the manifest's size and SHA-256 is
renamed into its node-local state directory (0600) with the manifest written last (atomically),
the same layout a rank's own save has (:mod:`ft_core.wire.saved_state`). Both sides are bounded by
one deadline (:func:`heal_timeout`). Store failures never raise: they are a failed transfer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from ft_core.wire import saved_state
from ft_core.wire.atomic import atomic_write_text
from launcher.rendezvous.store_channel import STORE_ERRORS, STORE_PREFIX

logger = logging.getLogger(__name__)

HEAL_PREFIX = STORE_PREFIX + "jit_heal/"
CHUNK_BYTES = 4 << 20
"""Bytes per store value (torch's libuv store refuses values over 8 MiB)."""
WINDOW = 4
"""Chunks the sender may have in the store at a time: the store host holds at most 16 MiB."""
MAX_MANIFEST_BYTES = 64 * 1024
POLL_INTERVAL = 0.005
"""How often a side that waits looks at the store (a 4 MiB chunk takes tens of ms to pass)."""
BASE_TIMEOUT = 10.0
BYTES_PER_SECOND = 10_000_000
"""Default bound: :data:`BASE_TIMEOUT` plus 1 s per 10 MB. Measured (bench/heal_transfer.py) through
a loopback store with three processes: 27 MB/s on a 2-core machine at load average 16, about
50 MB/s unloaded; the margin covers a slower network (every byte crosses it twice, in and out of
the store's host)."""


class TransferError(Exception):
    """A transfer failed; the message says why (for the log line and the record)."""


@dataclass(frozen=True)
class Transfer:
    """What a transfer did.

    Attributes:
        ok: The payload arrived complete and verified (receiver), or every receiver acknowledged
            every chunk (sender).
        step: The state's completed step.
        bytes: Payload bytes sent or received.
        seconds: How long it took.
        reason: Why it failed (empty when ok).
        path: The receiver's verified payload (empty otherwise).
    """

    ok: bool
    step: int
    bytes: int = 0
    seconds: float = 0.0
    reason: str = ""
    path: str = ""


def heal_timeout(configured: float | None, nbytes: int) -> float:
    """The bound of a transfer: ``jit_heal_timeout`` when set, else sized from the state's bytes."""
    if configured is not None:
        return float(configured)
    return BASE_TIMEOUT + max(0, nbytes) / BYTES_PER_SECOND


def chunk_count(nbytes: int) -> int:
    """Chunks of a payload of ``nbytes`` (an empty payload still sends one empty chunk)."""
    return max(1, -(-nbytes // CHUNK_BYTES))


def _key(step: int, *parts: object) -> str:
    return HEAL_PREFIX + "/".join([str(step), *(str(p) for p in parts)])


def send(store: Any, state: saved_state.SavedState, receivers: int, timeout: float) -> Transfer:
    """Send ``state`` to ``receivers`` nodes through ``store`` (see the module docstring).

    Args:
        store: The round's store (torch ``Store``).
        state: This node's verified state.
        receivers: How many nodes read it (each acknowledges every chunk).
        timeout: Seconds the whole transfer may take.
    """
    started = time.monotonic()
    deadline = started + timeout
    count = chunk_count(state.bytes)
    sent = 0
    try:
        store.set(_key(state.step, "manifest"), json.dumps(state.manifest(), sort_keys=True))
        with open(state.payload_path, "rb") as stream:
            for index in range(count):
                if index >= WINDOW:
                    _await_acks(store, state.step, index - WINDOW, receivers, deadline)
                chunk = stream.read(CHUNK_BYTES)
                store.set(_key(state.step, "chunk", index), chunk)
                sent += len(chunk)
        for index in range(max(0, count - WINDOW), count):
            _await_acks(store, state.step, index, receivers, deadline)
        if sent != state.bytes:
            raise TransferError(f"the payload has {sent} bytes, its manifest says {state.bytes}")
    except (TransferError, OSError, *STORE_ERRORS) as err:
        abort(store, state.step, f"the sender failed: {err}")
        _cleanup(store, state.step, count)
        return Transfer(False, state.step, sent, _since(started), str(err))
    _cleanup(store, state.step, count)
    return Transfer(True, state.step, sent, _since(started))


def receive(store: Any, directory: str, step: int, timeout: float) -> Transfer:
    """Receive the state of ``step`` into ``directory`` (node-local, created 0700).

    The payload goes to a temporary file while it is hashed; only a complete payload whose size
    and SHA-256 are the manifest's is renamed into place, then the manifest is written (atomically).
    """
    started = time.monotonic()
    deadline = started + timeout
    tmp = ""
    received = 0
    try:
        manifest = _read_manifest(store, step, deadline)
        expected, digest_expected = manifest["bytes"], manifest["sha256"]
        saved_state.ensure_dir(directory)
        tmp = os.path.join(directory, f".{saved_state.payload_name(step)}.{os.getpid()}.heal.tmp")
        digest = hashlib.sha256()
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as out:
            for index in range(chunk_count(expected)):
                key = _key(step, "chunk", index)
                _await_key(store, step, key, deadline)
                chunk = store.get(key)
                if len(chunk) > CHUNK_BYTES or received + len(chunk) > expected:
                    raise TransferError(f"chunk {index} overruns the manifest's {expected} bytes")
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                store.add(_key(step, "ack", index), 1)
        if received != expected:
            raise TransferError(f"received {received} bytes, the manifest says {expected}")
        if digest.hexdigest() != digest_expected:
            raise TransferError("the payload's SHA-256 differs from its manifest's (corrupt in transfer or at the "
                                "sender)")
        payload = os.path.join(directory, saved_state.payload_name(step))
        os.replace(tmp, payload)
        tmp = ""
        manifest_path = os.path.join(directory, saved_state.manifest_name(step))
        atomic_write_text(manifest_path, json.dumps({**manifest, "shared_path": ""}, sort_keys=True) + "\n",
                          mode=0o600)
        if saved_state.read_manifest(manifest_path) is None:
            for path in (manifest_path, payload):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise TransferError("the sender's manifest is not a valid one")
    except (TransferError, OSError, *STORE_ERRORS) as err:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        abort(store, step, f"a receiver failed: {err}")
        return Transfer(False, step, received, _since(started), str(err))
    return Transfer(True, step, received, _since(started), path=payload)


def _read_manifest(store: Any, step: int, deadline: float) -> dict[str, Any]:
    key = _key(step, "manifest")
    _await_key(store, step, key, deadline)
    raw = store.get(key)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise TransferError(f"the sender's manifest is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise TransferError(f"the sender's manifest is not JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("step") != step:
        raise TransferError(f"the sender's manifest is not one of step {step}")
    size, digest = manifest.get("bytes"), manifest.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(digest, str):
        raise TransferError("the sender's manifest has no valid bytes and sha256")
    return manifest


def _await_key(store: Any, step: int, key: str, deadline: float) -> None:
    # polled with check(): a store wait() that times out logs a C++ warning per call
    while not store.check([key]):
        _checkabort(store, step)
        if time.monotonic() >= deadline:
            raise TransferError(f"the sender sent nothing more within the bound ({key.rsplit('/', 2)[-2:]})")
        time.sleep(POLL_INTERVAL)


def _await_acks(store: Any, step: int, index: int, receivers: int, deadline: float) -> None:
    key = _key(step, "ack", index)
    while store.add(key, 0) < receivers:
        _checkabort(store, step)
        if time.monotonic() >= deadline:
            raise TransferError(f"the receivers did not take chunk {index} within the bound")
        time.sleep(POLL_INTERVAL)
    store.delete_key(_key(step, "chunk", index))


def _checkabort(store: Any, step: int) -> None:
    key = _key(step, "abort")
    if store.check([key]):
        raise TransferError(store.get(key)[:1024].decode("utf-8", "replace"))


def abort(store: Any, step: int, reason: str) -> None:
    with contextlib.suppress(*STORE_ERRORS):
        if not store.check([_key(step, "abort")]):
            store.set(_key(step, "abort"), reason)


def _cleanup(store: Any, step: int, count: int) -> None:
    """Delete the chunks and counters left (the round's store outlives the transfer)."""
    with contextlib.suppress(*STORE_ERRORS):
        for index in range(count):
            store.delete_key(_key(step, "chunk", index))
            store.delete_key(_key(step, "ack", index))
        store.delete_key(_key(step, "manifest"))


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)
