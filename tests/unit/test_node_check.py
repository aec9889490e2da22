"""launcher.node.check: each check on this machine's real disks and processes."""

from __future__ import annotations

import os
import time

from launcher.node import check as node_check
from launcher.node.check import NodeCheckSettings, check_command, check_disk, check_gpus, run_checks


def test_a_disk_with_room_passes_and_leaves_nothing(tmp_path):
    result = check_disk(str(tmp_path), min_free_mb=1, max_write_seconds=30)
    assert result.ok and "1 MiB written and synced" in result.detail
    assert os.listdir(tmp_path) == []


def test_too_little_space_or_a_missing_dir_fails(tmp_path):
    full = check_disk(str(tmp_path), min_free_mb=1e12, max_write_seconds=30)
    assert not full.ok and "MiB free <" in full.detail
    missing = check_disk(str(tmp_path / "gone"), min_free_mb=1, max_write_seconds=30)
    assert not missing.ok and "cannot read its free space" in missing.detail


def test_a_slow_write_fails(tmp_path):
    result = check_disk(str(tmp_path), min_free_mb=1, max_write_seconds=0.0)
    assert not result.ok and "> 0 s" in result.detail


def test_the_users_command_counts_by_its_exit_status_and_keeps_its_output():
    assert check_command("echo fine", timeout=30).ok
    bad = check_command("echo 'disk /scratch is read-only' >&2; exit 3", timeout=30)
    assert not bad.ok and bad.detail == "exit status 3" and bad.output == "disk /scratch is read-only"
    started = time.monotonic()
    slow = check_command("echo started; sleep 30", timeout=0.5)
    assert not slow.ok and "did not finish within 0.5 s" in slow.detail and time.monotonic() - started < 10
    long = check_command("yes x | head -c 10000", timeout=30)
    assert long.ok and len(long.output) == node_check.MAX_OUTPUT_CHARS


def test_gpus_are_skipped_without_nvml():
    result = check_gpus("libnvidia-ml-that-does-not-exist.so.1")
    assert result.ok and result.skipped and "skipped: no NVML" in result.detail


def test_a_check_that_hangs_is_bounded():
    started = time.monotonic()
    result = node_check._bounded("disk /hung", 0.3, lambda: time.sleep(5) or None)
    assert not result.ok and "did not finish within 0.3 s" in result.detail and time.monotonic() - started < 3


def test_run_checks_runs_the_disks_the_gpus_and_the_command(tmp_path):
    results = run_checks(NodeCheckSettings(dirs=[str(tmp_path)], command="exit 1"))
    assert [r.name for r in results] == [f"disk {tmp_path}", "gpus", "command"]
    assert [r.name for r in node_check.failures(results)] == ["command"]
    assert node_check.default_dirs()[0] and all(os.path.isabs(d) for d in node_check.default_dirs())
