"""On-disk format of local checkpoints: one payload and one manifest per (iteration, owner rank).

A node keeps its checkpoints under ``<root>/<session_id>/<holder rank>/``::

    iter_0000012_3_local.pt      payload: rank 3's state at iteration 12 (torch.save bytes)
    iter_0000012_3_local.json    manifest: {"format", "iteration", "owner", "holder", "bytes", "sha256", ...}

The holder is the rank that wrote the files: the owner itself, or its peer on another node (a
replica). The payload is written first, atomically; the manifest last, atomically, so a file
without a manifest is a save that did not finish (a job-wide SIGTERM, a lost node) and is never
read. Files are 0600, directories 0700. Standard library only: the checksum and the scan need no
torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

from ft_core.wire.atomic import atomic_write_bytes, atomic_write_text

FORMAT = 1
_MANIFEST = re.compile(r"iter_(\d{7,})_(\d+)_local\.json")
_ANY = re.compile(r"\.?iter_(\d{7,})_(\d+)_local\.(?:json|pt)(?:\..*\.tmp)?")


def payload_name(iteration: int, owner: int) -> str:
    """File name of ``owner``'s payload of ``iteration``."""
    return f"iter_{iteration:07d}_{owner}_local.pt"


def manifest_name(iteration: int, owner: int) -> str:
    """File name of ``owner``'s manifest of ``iteration``."""
    return f"iter_{iteration:07d}_{owner}_local.json"


@dataclass(frozen=True)
class LocalFile:
    """One complete local checkpoint file, as its manifest describes it.

    Attributes:
        iteration: The training iteration (Lightning's global step) it holds.
        owner: The rank whose state it is.
        holder: The rank that wrote it (``owner``, or the owner's peer for a replica).
        bytes: Size of the payload.
        sha256: Hex digest of the payload.
        world_size: The world size of the job that saved it.
        path: The payload file.
    """

    iteration: int
    owner: int
    holder: int
    bytes: int
    sha256: str
    world_size: int
    path: str

    @property
    def is_replica(self) -> bool:
        """Whether another rank's state (a peer's replica)."""
        return self.owner != self.holder


def ensure_dir(path: str) -> str:
    """Create ``path`` and its missing parents, 0700; return it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask
    return path


def write(directory: str, iteration: int, owner: int, holder: int, world_size: int, payload: bytes,
          digest: str | None = None) -> LocalFile:
    """Write one checkpoint: the payload, then its manifest, each atomically (0600).

    Args:
        directory: The holder's directory (created 0700 if missing).
        iteration, owner, holder, world_size: See :class:`LocalFile`.
        payload: The serialized state.
        digest: The payload's SHA-256 when the caller has it (a received replica is checked
            against the sender's); computed otherwise.

    Raises:
        ValueError: ``digest`` is not the payload's (a replica corrupted in transit).
        OSError: A file could not be written.
    """
    actual = hashlib.sha256(payload).hexdigest()
    if digest is not None and digest != actual:
        raise ValueError(f"checksum mismatch for rank {owner}'s iteration {iteration}: the data changed in transit")
    ensure_dir(directory)
    path = os.path.join(directory, payload_name(iteration, owner))
    atomic_write_bytes(path, payload, mode=0o600)
    entry = LocalFile(iteration=iteration, owner=owner, holder=holder, bytes=len(payload), sha256=actual,
                      world_size=world_size, path=path)
    fields = asdict(entry)
    fields.pop("path")
    atomic_write_text(os.path.join(directory, manifest_name(iteration, owner)),
                      json.dumps({"format": FORMAT, **fields}, sort_keys=True) + "\n", mode=0o600)
    return entry


def _read_manifest(path: str) -> LocalFile | None:
    try:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        ints = [data.get(key) for key in ("iteration", "owner", "holder", "bytes", "world_size")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints[:4]):
            return None
        if not isinstance(data.get("sha256"), str) or not isinstance(ints[4], int):
            return None
        payload = os.path.join(os.path.dirname(path), payload_name(ints[0], ints[1]))
        return LocalFile(iteration=ints[0], owner=ints[1], holder=ints[2], bytes=ints[3], sha256=data["sha256"],
                         world_size=ints[4], path=payload)
    except (OSError, ValueError, TypeError):
        return None


def scan(session_dir: str) -> list[LocalFile]:
    """Every complete checkpoint file under ``session_dir`` (all holders' directories of this
    node): manifest valid and payload of the manifest's size. The checksum is not read (:func:`verify`)."""
    found = []
    try:
        holders = [entry.path for entry in os.scandir(session_dir) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for holder_dir in holders:
        try:
            names = [entry.name for entry in os.scandir(holder_dir) if _MANIFEST.fullmatch(entry.name)]
        except OSError:
            continue
        for name in names:
            entry = _read_manifest(os.path.join(holder_dir, name))
            if entry is None or manifest_name(entry.iteration, entry.owner) != name:
                continue
            try:
                if os.stat(entry.path).st_size != entry.bytes:
                    continue
            except OSError:
                continue
            found.append(entry)
    return sorted(found, key=lambda e: (-e.iteration, e.owner, e.holder))


def read_verified(entry: LocalFile) -> bytes | None:
    """The payload of ``entry`` if its size and SHA-256 are the manifest's, else None."""
    try:
        with open(entry.path, "rb") as stream:
            data = stream.read()
    except OSError:
        return None
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        return None
    return data


def prune(holder_dir: str, keep: int = 2) -> list[str]:
    """Remove the files of all but the ``keep`` newest complete iterations in ``holder_dir``
    (payloads, manifests and temporaries of older iterations; newer ones may be a save in progress).

    Returns:
        The paths removed.
    """
    try:
        names = [entry.name for entry in os.scandir(holder_dir)]
    except OSError:
        return []
    complete = sorted({int(m.group(1)) for n in names if (m := _MANIFEST.fullmatch(n))}, reverse=True)
    if len(complete) <= keep:
        return []
    oldest_kept = complete[keep - 1] if keep > 0 else None
    removed = []
    for name in names:
        match = _ANY.fullmatch(name)
        if match is None or (oldest_kept is not None and int(match.group(1)) >= oldest_kept):
            continue
        path = os.path.join(holder_dir, name)
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed
