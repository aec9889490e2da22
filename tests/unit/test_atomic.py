"""ft_core.wire.atomic with real writer processes: a writer killed half-way leaves a temporary file,
the next write removes it, and a live writer's temporary file is never touched.

The writer is a real process running ``atomic_write_text``; its ``os.fsync`` waits for the test
(a line on stdin), which pauses it at the moment the temporary file is complete but not renamed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ft_core.wire.atomic import STALE_AFTER, atomic_write_text

WRITER = (
    "import os, sys\n"
    "from ft_core.wire.atomic import atomic_write_text\n"
    "real_fsync = os.fsync\n"
    "def paused_fsync(fd):\n"
    "    print('in fsync', flush=True)\n"
    "    sys.stdin.readline()\n"
    "    real_fsync(fd)\n"
    "os.fsync = paused_fsync\n"
    "atomic_write_text(sys.argv[1], sys.argv[2])\n"
)


def start_writer(path: Path, text: str) -> subprocess.Popen:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), text], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "in fsync"
    return writer


def temporaries(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".tmp"))


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_writer_killed_half_way_leaves_a_temporary_file_that_the_next_write_removes(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_text(target, "old")
    writer = start_writer(target, "lost")
    writer.kill()
    writer.wait(10)
    left = temporaries(tmp_path)
    assert len(left) == 1 and left[0].name.startswith(".state.json.")
    age(left[0], STALE_AFTER + 1)  # its writer died a while ago

    atomic_write_text(target, "new")

    assert temporaries(tmp_path) == []
    assert target.read_text() == "new"


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    target = tmp_path / "flag"
    writer = start_writer(target, "theirs")
    try:
        (theirs,) = temporaries(tmp_path)
        age(theirs, STALE_AFTER + 1)  # a slow writer: old, but its lock is held
        atomic_write_text(target, "ours")
        assert temporaries(tmp_path) == [theirs]
        assert target.read_text() == "ours"
    finally:
        writer.stdin.write("go\n")
        writer.stdin.close()
    assert writer.wait(30) == 0
    assert target.read_text() == "theirs"  # its rename came last
    assert temporaries(tmp_path) == []


def test_a_recent_unlocked_temporary_file_is_left_alone(tmp_path):
    # Between its creation and its lock a writer's file is unlocked for an instant: only age
    # tells it from a dead writer's. Also files of other names are never touched.
    target = tmp_path / "flag"
    fresh = tmp_path / ".flag.abcd1234.tmp"
    other = tmp_path / ".flag2.abcd1234.tmp"
    fresh.write_text("")
    other.write_text("")
    age(other, STALE_AFTER + 1)
    atomic_write_text(target, "x")
    assert temporaries(tmp_path) == [fresh, other]


def test_a_killed_writer_leaves_the_old_content_readable(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_text(target, "old")
    writer = start_writer(target, "half")
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(10)
    assert target.read_text() == "old"
