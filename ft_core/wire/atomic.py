"""Atomic file writes: readers see the old file or the new one, never a partial one.

A write goes to a temporary file ``.<name>.XXXXXXXX.tmp`` next to the destination, which is then
renamed over it. A writer killed half-way (SIGKILL, a lost node) leaves its temporary file behind;
the next write of the same destination removes such stale files. It never touches a concurrent
writer's: each writer holds an exclusive ``flock`` on its temporary file until the rename, and a
file is stale only when nobody holds that lock and it is older than :data:`STALE_AFTER` seconds
(the age covers the instant between a file's creation and its writer's lock, and filesystems
whose locks do not reach other hosts' writers).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time

STALE_AFTER = 10.0
"""Seconds after which an unlocked temporary file of an atomic write is a dead writer's."""
_TMP_SUFFIX = ".tmp"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably.

    The data goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over ``path``. If anything fails, ``path`` keeps its old content and the temporary
    file is removed. Temporary files of earlier writes of ``path`` whose writers died are removed
    first (see the module docstring).

    Args:
        path: Destination file. Its directory must exist.
        data: The complete new content.
        mode: Permission bits of the new file.

    Raises:
        OSError: The directory is missing or not writable, the disk is full, etc.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    remove_stale_temporaries(directory, name)
    fd, tmp_path = tempfile.mkstemp(prefix=f".{name}.", suffix=_TMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as stream:
            # Held until the file is renamed (or removed) and closed: marks it as in use.
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
            os.chmod(tmp_path, mode)
            os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
    # Make the rename itself durable; not every filesystem supports fsync on a directory.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def remove_stale_temporaries(directory: str, name: str, now: float | None = None) -> list[str]:
    """Remove the temporary files that dead writers of ``directory/name`` left behind.

    A candidate (``.<name>.`` + mkstemp's 8 random characters + ``.tmp``) is removed only if it
    is older than :data:`STALE_AFTER` and no writer holds its lock; it is removed while this
    call holds that lock, after checking that the name still refers to the file locked.

    Returns:
        The paths removed.
    """
    pattern = re.compile(re.escape(f".{name}.") + r"[a-z0-9_]{8}" + re.escape(_TMP_SUFFIX))
    now = time.time() if now is None else now
    removed = []
    try:
        entries = [entry.name for entry in os.scandir(directory) if pattern.fullmatch(entry.name)]
    except OSError:
        return removed
    for entry in entries:
        candidate = os.path.join(directory, entry)
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if now - info.st_mtime < STALE_AFTER:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer
            current = os.stat(candidate, follow_symlinks=False)
            if (current.st_dev, current.st_ino) == (info.st_dev, info.st_ino):
                os.unlink(candidate)
                removed.append(candidate)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed
