"""The shared-memory slot through which a rank reports progress to its monitor.

A heartbeat or a section change is one or two 8-byte stores into memory shared with the
monitor: no system call, no message, no waiting. The monitor reads the slot only when one of its
deadlines is due, so a busy rank costs it nothing.

Layout (native byte order, all times are ``time.monotonic()`` seconds, which is
``CLOCK_MONOTONIC`` and therefore shared by all processes on the host; 0.0 means "not set")::

    0   u32  magic            8   f64  last section open/close time
    4   u32  section count    16  f64  last heartbeat time
                              24  u64  heartbeat count
                              32  f64  out-of-section since (0.0 while a section is open)
                              40  u64  training step + 1 (0: the front end never said)
    64 + 8*i  f64  section i open since (0.0 when closed)

Each field is an aligned 8-byte store, which is atomic on the platforms we support. The writer
orders its stores so that a reader between two stores sees only fresh timestamps: a race can
delay a detection by one deadline, never cause a false one.

The monitor creates the memory with ``memfd_create`` and passes the descriptor over the Unix
socket, so nothing is ever left on disk.
"""

from __future__ import annotations

import mmap
import os
import struct

MAGIC = 0x46545331  # "FTS1"
HEADER_BYTES = 64
_HEADER = struct.Struct("=II")
_F64 = struct.Struct("=d")
_U64 = struct.Struct("=Q")

OFF_LAST_SECTION_ACTIVITY = 8
OFF_LAST_HEARTBEAT = 16
OFF_HEARTBEAT_COUNT = 24
OFF_OUT_OF_SECTION_SINCE = 32
OFF_STEP = 40


def section_offset(index: int) -> int:
    """Byte offset of section ``index``'s open-since field."""
    return HEADER_BYTES + 8 * index


def slot_size(section_count: int) -> int:
    """Bytes needed for a slot with ``section_count`` sections, rounded up to a page."""
    raw = HEADER_BYTES + 8 * section_count
    page = mmap.PAGESIZE
    return max(page, (raw + page - 1) // page * page)


class ProgressSlot:
    """A mapped progress slot; the monitor creates it, the rank attaches to it."""

    def __init__(self, buffer: mmap.mmap, section_count: int) -> None:
        self._mm = buffer
        self.section_count = section_count

    @classmethod
    def create(cls, section_count: int) -> tuple[ProgressSlot, int]:
        """Create a zeroed slot in anonymous memory.

        Returns:
            The slot and a file descriptor for it, to pass to the rank. The caller owns the fd.
        """
        fd = os.memfd_create("ft-progress-slot", os.MFD_CLOEXEC)
        try:
            size = slot_size(section_count)
            os.ftruncate(fd, size)
            buffer = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        _HEADER.pack_into(buffer, 0, MAGIC, section_count)
        return cls(buffer, section_count), fd

    @classmethod
    def attach(cls, fd: int, section_count: int) -> ProgressSlot:
        """Map a slot received from the monitor. The fd may be closed afterwards.

        Raises:
            ValueError: The memory is not a progress slot of the expected shape.
        """
        size = os.fstat(fd).st_size
        if size < slot_size(section_count):
            raise ValueError(f"progress slot of {size} bytes is too small")
        buffer = mmap.mmap(fd, size)
        magic, count = _HEADER.unpack_from(buffer, 0)
        if magic != MAGIC or count != section_count:
            buffer.close()
            raise ValueError("shared memory is not a progress slot of the expected layout")
        return cls(buffer, section_count)

    @property
    def buffer(self) -> mmap.mmap:
        """The mapped memory (writers use it with precompiled ``struct`` packers)."""
        return self._mm

    def close(self) -> None:
        """Unmap the slot."""
        self._mm.close()

    # Readers (monitor side) -------------------------------------------------------

    def last_heartbeat(self) -> float:
        return _F64.unpack_from(self._mm, OFF_LAST_HEARTBEAT)[0]

    def last_section_activity(self) -> float:
        return _F64.unpack_from(self._mm, OFF_LAST_SECTION_ACTIVITY)[0]

    def heartbeat_count(self) -> int:
        return _U64.unpack_from(self._mm, OFF_HEARTBEAT_COUNT)[0]

    def out_of_section_since(self) -> float:
        return _F64.unpack_from(self._mm, OFF_OUT_OF_SECTION_SINCE)[0]

    def section_open_since(self, index: int) -> float:
        return _F64.unpack_from(self._mm, section_offset(index))[0]

    def step(self) -> int | None:
        """The training step the rank last announced (``set_step``), or None if it never did."""
        stored = _U64.unpack_from(self._mm, OFF_STEP)[0]
        return stored - 1 if stored else None

    # Writer (monitor side, at the handshake; the client inlines its hot-path stores) ----

    def set_out_of_section_since(self, when: float) -> None:
        _F64.pack_into(self._mm, OFF_OUT_OF_SECTION_SINCE, when)
