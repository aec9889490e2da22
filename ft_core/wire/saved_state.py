"""Just-in-time training state on disk: the format, the one-saver claim, and the scan.

A rank that survived a peer's failure saves its full training state (model and optimizer, see
:mod:`ft_core.client.jit_state`) into a state directory, one pair of files per completed step::

    <dir>/state-0000000137.pt      the payload (written by the rank with torch.save)
    <dir>/state-0000000137.json    the manifest, written LAST and atomically
    <dir>/state-0000000137.claim   the one-saver-per-node-and-step claim (O_EXCL)

A payload without a manifest is incomplete (a saver killed half-way) and is never used. The
manifest holds the payload's size and SHA-256, so a reader can tell a truncated or corrupt
payload (:func:`verify`) before it hands it to ``torch.load``. Files are 0600, the directory 0700.

Standard library only: the launcher reads it without torch, and the rank's side imports torch
only where it writes the payload (the caller passes the writing function).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ft_core.wire.atomic import atomic_write_text

FORMAT = 1
"""Version of the manifest; a reader refuses other versions."""

KINDS = ("lightning", "plain")
SOURCES = ("exception", "blocked")
JIT_SUBDIR = "ft_jit_state"
"""Name of the state directory under a user's checkpoint directory (the copy a requeued job reads)."""

CLAIMED_BY_ANOTHER = "another rank of this node saves step"
"""How a rank that lost the claim declines (the launcher then waits for the winner's manifest)."""

_NAME = re.compile(r"state-(\d{10})\.json")
_CHUNK = 4 << 20


def payload_name(step: int) -> str:
    """File name of the payload of completed step ``step``."""
    return f"state-{step:010d}.pt"


def manifest_name(step: int) -> str:
    """File name of the manifest of completed step ``step``."""
    return f"state-{step:010d}.json"


def claim_name(step: int) -> str:
    """File name of the claim of completed step ``step``."""
    return f"state-{step:010d}.claim"


@dataclass(frozen=True)
class SavedState:
    """One complete saved state, as its manifest describes it.

    Attributes:
        step: Completed optimizer steps the state holds.
        payload_path: The payload file (for ``torch.load``).
        sha256: Hex digest of the payload.
        bytes: Size of the payload.
        kind: ``lightning`` or ``plain`` (which loader understands the payload).
        source: ``exception`` (saved by the rank's own exception path) or ``blocked`` (copied by
            the rank's state thread while its main thread was blocked in a collective).
        rank, local_rank, node, world_size: Who saved it.
        cycle: The launcher cycle in which it was saved (-1 outside ft_launcher).
        saved_at: When the manifest was written (epoch seconds).
        seconds: How long the save took (copy + write + checksum).
        shared_path: The payload of this state's copy in the user's checkpoint directory ("" if none).
    """

    step: int
    payload_path: str
    sha256: str
    bytes: int
    kind: str
    source: str
    rank: int = -1
    local_rank: int = -1
    node: str = ""
    cycle: int = -1
    saved_at: float = 0.0
    seconds: float = 0.0
    world_size: int = -1
    shared_path: str = ""

    @property
    def manifest_path(self) -> str:
        """The manifest next to the payload."""
        return os.path.join(os.path.dirname(self.payload_path), manifest_name(self.step))

    def manifest(self) -> dict[str, Any]:
        """The manifest's JSON object."""
        fields = dataclasses.asdict(self)
        fields.pop("payload_path")
        return {"format": FORMAT, **fields}


def ensure_dir(path: str) -> str:
    """Create the state directory ``path`` (0700) if missing; return it.

    Raises:
        OSError: It cannot be created.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask
    return path


def claim(directory: str, step: int) -> bool:
    """Claim the save of ``step`` in ``directory``: True for the first caller on this node only.

    Several ranks of a node may be asked at once (the exception path of one and the state thread
    of another); the claim file (created with ``O_EXCL``) makes one of them the saver.
    """
    try:
        fd = os.open(os.path.join(directory, claim_name(step)), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    return True


def release(directory: str, step: int) -> None:
    """Remove the claim of ``step`` (after a failed save, so that another rank may try)."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, claim_name(step)))


class StateChanged(Exception):
    """Raised by :func:`write` when its ``still_valid`` check fails: nothing was kept."""


def write(directory: str, step: int, write_payload: Callable[[str], None], *, kind: str, source: str,
          rank: int = -1, local_rank: int = -1, cycle: int = -1, world_size: int = -1,
          started: float | None = None, durable: bool = False,
          still_valid: Callable[[], bool] | None = None, publish: bool = True) -> SavedState:
    """Write one state: the payload (through ``write_payload``), then its manifest, atomically.

    The payload goes to a temporary name, is checksummed by reading it back in chunks (faster
    than hashing every small write of ``torch.save``: it is still in the page cache), renamed
    into place, and only then is the manifest written (atomically). Anything that fails removes
    what this call wrote.

    Args:
        directory: The state directory (created 0700 if missing).
        step: The completed step the state holds.
        write_payload: Writes the payload to the path it is given (e.g. ``torch.save(obj, path)``).
        kind, source, rank, local_rank, cycle, world_size: Manifest fields (see :class:`SavedState`).
        started: ``time.monotonic()`` when the save began (the copy included); default: now.
        durable: fsync the payload (off for node-local state: a lost node loses it anyway).
        still_valid: Asked after the payload is written, before the manifest: False discards the
            payload (the state changed while it was written) and raises :class:`StateChanged`.
        publish: Write the manifest; False leaves that to the caller (:func:`rewrite_manifest`),
            e.g. once a copy elsewhere is complete: readers see the state only from then on.

    Returns:
        The saved state.

    Raises:
        ValueError: ``kind`` or ``source`` is not one of the known values, or ``step`` < 0.
        OSError: The directory or a file could not be written.
    """
    if kind not in KINDS or source not in SOURCES or step < 0:
        raise ValueError(f"bad saved state: kind {kind!r} (one of {KINDS}), source {source!r} (one of {SOURCES}), "
                         f"step {step!r} (>= 0)")
    started = time.monotonic() if started is None else started
    ensure_dir(directory)
    payload = os.path.join(directory, payload_name(step))
    tmp = os.path.join(directory, f".{payload_name(step)}.{os.getpid()}.tmp")
    try:
        write_payload(tmp)
        os.chmod(tmp, 0o600)
        digest, size = _checksum(tmp, durable)
        if still_valid is not None and not still_valid():
            raise StateChanged(f"the state of step {step} changed while it was written")
        os.replace(tmp, payload)
        state = SavedState(step=step, payload_path=payload, sha256=digest, bytes=size, kind=kind, source=source,
                           rank=rank, local_rank=local_rank, node=socket.gethostname(), cycle=cycle,
                           saved_at=time.time(), seconds=0.0, world_size=world_size)
        state = dataclasses.replace(state, seconds=round(time.monotonic() - started, 4))
        if publish:
            atomic_write_text(state.manifest_path, json.dumps(state.manifest(), sort_keys=True) + "\n", mode=0o600)
    except BaseException:
        for path in (tmp, payload):
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    return state


def _checksum(path: str, durable: bool) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as stream:
        if durable:
            os.fsync(stream.fileno())
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def rewrite_manifest(state: SavedState) -> None:
    """Write ``state``'s manifest again (atomically), e.g. with its shared copy's path added."""
    atomic_write_text(state.manifest_path, json.dumps(state.manifest(), sort_keys=True) + "\n", mode=0o600)


def read_manifest(path: str) -> SavedState | None:
    """The state a manifest file describes, or None if it is unreadable, malformed or of
    another format version (a manifest is written atomically, so a bad one is foreign or old)."""
    try:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        names = {f.name for f in dataclasses.fields(SavedState)} - {"payload_path"}
        fields = {k: v for k, v in data.items() if k in names}
        step = fields.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return None
        if not isinstance(fields.get("sha256"), str) or not isinstance(fields.get("bytes"), int):
            return None
        if fields.get("kind") not in KINDS or fields.get("source") not in SOURCES:
            return None
        if not isinstance(fields.get("shared_path", ""), str):
            return None
        payload = os.path.join(os.path.dirname(path), payload_name(step))
        return SavedState(payload_path=payload, **fields)
    except (OSError, ValueError, TypeError):
        return None


def scan(directory: str) -> list[SavedState]:
    """Every state in ``directory`` whose manifest is valid and whose payload has the size the
    manifest says, newest step first (the checksum is not read: see :func:`verify`)."""
    try:
        names = [entry.name for entry in os.scandir(directory) if _NAME.fullmatch(entry.name)]
    except OSError:
        return []
    found = []
    for name in names:
        state = read_manifest(os.path.join(directory, name))
        if state is None or manifest_name(state.step) != name:
            continue
        try:
            if os.stat(state.payload_path).st_size != state.bytes:
                continue
        except OSError:
            continue
        found.append(state)
    return sorted(found, key=lambda s: s.step, reverse=True)


def newest(directory: str, cycle: int | None = None) -> SavedState | None:
    """The newest complete state in ``directory`` (of launcher cycle ``cycle`` if given), or None."""
    for state in scan(directory):
        if cycle is None or state.cycle == cycle:
            return state
    return None


def verify(state: SavedState) -> bool:
    """Whether the payload's size and SHA-256 are the manifest's (reads it in chunks)."""
    try:
        digest, size = _checksum(state.payload_path, durable=False)
    except OSError:
        return False
    return size == state.bytes and digest == state.sha256


def prune(directory: str, keep: int = 2) -> list[str]:
    """Remove all but the ``keep`` newest complete states, and payloads, claims and temporary
    files of older steps (a payload newer than the kept ones may be a save in progress: kept).

    Returns:
        The paths removed.
    """
    states = scan(directory)
    if len(states) <= keep:
        return []
    oldest_kept = states[keep - 1].step if keep > 0 else None
    removed = []
    try:
        names = [entry.name for entry in os.scandir(directory)]
    except OSError:
        return removed
    for name in names:
        match = re.fullmatch(r"\.?state-(\d{10})\.(?:json|pt|claim)(?:\.\d+\.tmp)?", name)
        if match is None:
            continue
        step = int(match.group(1))
        if oldest_kept is not None and step >= oldest_kept:
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


BASE_TIMEOUT = 10.0
"""Seconds a save may take before the survivors are stopped anyway, plus 1 s per
:data:`BYTES_PER_SECOND` bytes of state (``jit_state_timeout`` null)."""
BYTES_PER_SECOND = 100_000_000


def save_timeout(configured: float | None, approx_bytes: int) -> float:
    """The bound of a save: ``jit_state_timeout`` when set, else sized from the state's bytes."""
    if configured is not None:
        return float(configured)
    return BASE_TIMEOUT + max(0, approx_bytes) / BYTES_PER_SECOND
