"""ft_core.client.state_file: reading (bounded, UTF-8, a JSON object, one part), the merge-write that
keeps the other front end's timeouts, and the lock that makes it safe between two processes."""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ft_core import RankMonitorClient
from ft_core.client.collectives import default_collectives
from ft_core.client.state_file import (
    MAX_STATE_FILE_BYTES,
    PART_HEARTBEATS,
    PART_SECTIONS,
    STATE_FILE_NAME,
    StateFile,
    state_file_path,
    unusable_location,
)
from ft_core.wire.atomic import atomic_write_text

LOGGER = "tests.state_file"
HB = {"initial": 60.0, "subsequent": 30.0, "were_calculated": True}
SECTIONS = {"section": {"setup": 20.0, "step": 5.0, "checkpointing": 9.0}, "out_of_section": 7.0,
            "calculated_sections": ["checkpointing", "setup", "step"], "is_out_of_section_calculated": True}
CONFIGURED_HB = {"initial": 3600.0, "subsequent": 2700.0, "were_calculated": False}
CONFIGURED_SECTIONS = {"section": {"setup": 600.0, "step": 180.0, "checkpointing": 420.0}, "out_of_section": 300.0,
                       "calculated_sections": [], "is_out_of_section_calculated": False}


def state_file(tmp_path: Path, part: str) -> StateFile:
    return StateFile(state_file_path(tmp_path / "exp"), part, logging.getLogger(LOGGER))


def write(sf: StateFile, content: bytes) -> None:
    Path(sf.path).parent.mkdir(parents=True, exist_ok=True)
    Path(sf.path).write_bytes(content)


def test_path_and_part():
    assert state_file_path("/x/exp") == f"/x/exp/{STATE_FILE_NAME}"
    with pytest.raises(ValueError, match="part must be one of hb_timeouts, section_timeouts, got 'both'"):
        StateFile("/x/state.json", "both")


# ---------------------------------------------------------------------- reading


@pytest.mark.parametrize("content, level, message", [
    (b"{not json", logging.WARNING, "not valid JSON"),
    (b"[1, 2]", logging.WARNING, "expected a JSON object, got list"),
    (b"\xff\xfe", logging.WARNING, "not UTF-8 text"),
    (b" " * (MAX_STATE_FILE_BYTES + 1), logging.WARNING, f"larger than {MAX_STATE_FILE_BYTES} bytes"),
    (json.dumps({"version": 1, "hb_timeouts": HB}).encode(), logging.INFO, "has no section_timeouts yet"),
    (None, logging.INFO, "no fault tolerance state file at"),
], ids=["json", "list", "utf8", "too-large", "other-part-only", "missing"])
def test_an_unusable_file_is_one_log_line_and_no_state(tmp_path, caplog, content, level, message):
    sf = state_file(tmp_path, PART_SECTIONS)
    if content is not None:
        write(sf, content)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sf.read_agreed(default_collectives()) is None
    assert [r.levelno for r in caplog.records] == [level]
    assert message in caplog.text and sf.path in caplog.text


def test_an_unreadable_file_is_a_warning(tmp_path, caplog):
    sf = state_file(tmp_path, PART_SECTIONS)
    os.makedirs(sf.path)  # a directory where the file should be
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sf.read_text() is None
    assert "cannot read fault tolerance state file" in caplog.text


def test_each_front_end_reads_only_its_part(tmp_path):
    content = {"version": 1, "hb_timeouts": HB, "section_timeouts": SECTIONS}
    write(state_file(tmp_path, PART_SECTIONS), json.dumps(content).encode())
    collectives = default_collectives()  # no process group: rank 0 reads, nothing to broadcast
    assert state_file(tmp_path, PART_SECTIONS).read_agreed(collectives) == {"version": 1, "section_timeouts": SECTIONS}
    assert state_file(tmp_path, PART_HEARTBEATS).read_agreed(collectives) == {"version": 1, "hb_timeouts": HB}


def test_restore_loads_the_part_or_warns_about_invalid_values(tmp_path, caplog):
    sf = state_file(tmp_path, PART_SECTIONS)
    write(sf, json.dumps({"version": 1, "section_timeouts": SECTIONS}).encode())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sf.restore(RankMonitorClient(), default_collectives()) is True
    assert "loaded calculated timeouts (section_timeouts)" in caplog.text
    write(sf, json.dumps({"version": 1, "section_timeouts": {"section": {"step": -1}}}).encode())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sf.restore(RankMonitorClient(), default_collectives()) is False
    assert "ignoring fault tolerance state file" in caplog.text and "section_timeouts.section[step]" in caplog.text


# ---------------------------------------------------------------------- writing


def state(hb: dict, sections: dict) -> dict:
    return {"version": 1, "hb_timeouts": hb, "section_timeouts": sections}


def test_save_creates_the_directory_and_leaves_no_temporary_file(tmp_path, caplog):
    sf = state_file(tmp_path, PART_SECTIONS)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sf.save(state(CONFIGURED_HB, SECTIONS)) is True
    assert json.loads(Path(sf.path).read_text()) == state(CONFIGURED_HB, SECTIONS)
    assert sorted(os.listdir(Path(sf.path).parent)) == [STATE_FILE_NAME, STATE_FILE_NAME + ".lock"]
    assert "saved calculated timeouts to" in caplog.text


def test_runs_of_both_kinds_keep_each_others_timeouts(tmp_path):
    # A heartbeats run saves, then a sections run in the same directory, then the heartbeats run again.
    hb_file, sections_file = state_file(tmp_path, PART_HEARTBEATS), state_file(tmp_path, PART_SECTIONS)
    hb_file.save(state(HB, CONFIGURED_SECTIONS))
    sections_file.save(state(CONFIGURED_HB, SECTIONS))
    assert json.loads(Path(hb_file.path).read_text()) == state(HB, SECTIONS)
    later_hb = {**HB, "subsequent": 40.0}
    hb_file.save(state(later_hb, CONFIGURED_SECTIONS))
    assert json.loads(Path(hb_file.path).read_text()) == state(later_hb, SECTIONS)


@pytest.mark.parametrize("content", [b"{broken", json.dumps({"version": 99, "hb_timeouts": "?"}).encode()],
                         ids=["unusable", "other-version"])
def test_save_replaces_a_file_it_cannot_merge_with(tmp_path, content):
    sf = state_file(tmp_path, PART_SECTIONS)
    write(sf, content)
    assert sf.save(state(CONFIGURED_HB, SECTIONS)) is True
    assert json.loads(Path(sf.path).read_text()) == state(CONFIGURED_HB, SECTIONS)


def test_a_file_that_cannot_be_written_is_an_error_line(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    sf = StateFile(state_file_path(blocker), PART_SECTIONS, logging.getLogger(LOGGER))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sf.save(state(CONFIGURED_HB, SECTIONS)) is False
    assert "cannot save calculated timeouts to" in caplog.text
    assert blocker.read_text() == "not a directory\n"


WRITER = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from ft_core.client.state_file import StateFile
sys.exit(0 if StateFile(sys.argv[1], sys.argv[2]).save(json.loads(sys.argv[3])) else 1)
"""


def test_two_processes_updating_different_parts_both_keep_theirs(tmp_path):
    """The race the lock prevents: A reads, B writes its part, A writes its merge: B's part lost.

    This process is writer A: it holds the lock while it updates the sections part (after reading
    the file), and starts writer B, a second process that saves the heartbeat part. B must wait
    for the lock (it says so), then merge into A's result. Without the lock B would write at once
    and A's write, built on its earlier read, would wipe B's heartbeat timeouts.
    """
    sf = state_file(tmp_path, PART_SECTIONS)
    sf.save(state(CONFIGURED_HB, CONFIGURED_SECTIONS))
    with sf.locked():
        before = json.loads(Path(sf.path).read_text())  # A's read
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, sf.path, PART_HEARTBEATS, json.dumps(state(HB, CONFIGURED_SECTIONS))],
            stderr=subprocess.PIPE, text=True,
        )
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in writer.stderr], daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        seen = []
        try:
            while not any("waiting for" in line for line in seen):
                remaining = deadline - time.monotonic()
                assert remaining > 0 and writer.poll() is None, f"writer B did not wait for the lock: {seen}"
                try:
                    seen.append(lines.get(timeout=min(remaining, 0.5)))
                except queue.Empty:
                    pass
            # B is blocked on the lock: A completes its read-merge-write.
            atomic_write_text(sf.path, json.dumps({**before, "section_timeouts": SECTIONS}))
        except BaseException:
            writer.kill()
            writer.wait(10)
            raise
    assert writer.wait(timeout=30) == 0
    reader.join(10)
    assert json.loads(Path(sf.path).read_text()) == state(HB, SECTIONS)


# ---------------------------------------------------------------------- an unusable location (issue 29.5)


@pytest.mark.parametrize("where", ["a-file", "a-file/sub/deeper"], ids=["is-a-file", "under-a-file"])
def test_an_unusable_directory_is_one_warning_at_setup_and_saves_are_skipped_quietly(tmp_path, caplog, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    sf = StateFile(state_file_path(tmp_path / where), PART_HEARTBEATS, logging.getLogger(LOGGER))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert sf.read_agreed(default_collectives()) is None
        assert sf.save(state(HB, CONFIGURED_SECTIONS)) is False
        assert sf.save(state(HB, CONFIGURED_SECTIONS)) is False
    above_debug = [r for r in caplog.records if r.levelno > logging.DEBUG]
    assert [r.levelno for r in above_debug] == [logging.WARNING], caplog.text
    text = above_debug[0].getMessage()
    assert sf.path in text and f"{blocker} is a file" in text
    assert "writable directory" in text and "exp_dir" in text  # how to fix it
    assert blocker.read_text() == "not a directory\n"


def test_a_location_that_became_usable_is_saved_again(tmp_path):
    blocker = tmp_path / "exp"
    blocker.write_text("in the way\n")
    sf = state_file(tmp_path, PART_HEARTBEATS)
    assert sf.read_agreed(default_collectives()) is None and sf.unusable is not None
    blocker.unlink()
    assert sf.save(state(HB, CONFIGURED_SECTIONS)) is True
    assert json.loads(Path(sf.path).read_text())["hb_timeouts"] == HB


AS_NOBODY_CHECK = """
import os, sys
from ft_core.client.state_file import unusable_location  # before: nobody may not read the interpreter's files
os.setgid(65534); os.setuid(65534)
print(unusable_location(sys.argv[1]))
"""


def _unusable_as_another_user(path: str) -> str:
    """unusable_location(path) as a user who does not own the test's directories."""
    if os.getuid() != 0:
        return str(unusable_location(path))
    out = subprocess.run([sys.executable, "-c", AS_NOBODY_CHECK, path], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_directory_another_user_cannot_write_or_reach_is_named(tmp_path):
    # Root writes anywhere (mode bits do not apply): the check then runs as nobody. /var/tmp, not the
    # session's private (0700) TMPDIR, so that nobody can reach the directory and find it read-only.
    with tempfile.TemporaryDirectory(dir="/var/tmp") as top:
        os.chmod(top, 0o755)
        locked = Path(top) / "locked"
        locked.mkdir()
        if os.getuid() != 0:
            locked.chmod(0o555)
        reason = _unusable_as_another_user(state_file_path(locked))
        assert reason.startswith(f"the directory {locked} is not writable by this user"), reason
        reason = _unusable_as_another_user(state_file_path(locked / "new"))  # save would create it
        assert reason.startswith(f"the directory {locked / 'new'} does not exist and cannot be created"), reason
        os.chmod(locked, 0o700)
        if os.getuid() == 0:
            reason = _unusable_as_another_user(state_file_path(locked / "deeper"))
            assert reason.startswith(f"the directory {locked / 'deeper'} cannot be reached by this user"), reason
        os.chmod(locked, 0o755)
    assert unusable_location(state_file_path(tmp_path / "new" / "dir")) is None  # save creates it
