"""Atomic file writes: readers see the old file or the new one, never a partial one."""

from __future__ import annotations

import contextlib
import os
import tempfile


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably.

    The data goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over ``path``. If anything fails, ``path`` keeps its old content and the temporary
    file is removed.

    Args:
        path: Destination file. Its directory must exist.
        data: The complete new content.
        mode: Permission bits of the new file.

    Raises:
        OSError: The directory is missing or not writable, the disk is full, etc.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as stream:
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
