"""The launcher's run directory (its sockets) goes under $TMPDIR only where no other user could
swap it (issue 13 item 11): else under /tmp, with one warning line; with no fit place at all, a
clear error. The attack this prevents is tests/faults/test_impersonation.py."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

import pytest

from launcher import launch


@pytest.fixture
def base(monkeypatch) -> Iterator[str]:
    """A fresh directory used as $TMPDIR for make_run_dir."""
    path = tempfile.mkdtemp(prefix="ftt-base-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def made_under(run_dir: str) -> str:
    try:
        info = os.stat(run_dir)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        return os.path.dirname(run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o1777])
def test_a_tmpdir_no_one_else_can_write_to_or_with_the_sticky_bit_is_used(base, mode, caplog):
    os.chmod(base, mode)
    with caplog.at_level(logging.WARNING, logger="launcher"):
        assert made_under(launch.make_run_dir()) == base
    assert not caplog.records


@pytest.mark.parametrize("mode, why", [(0o777, "writable by others"), (0o775, "writable by its group")])
def test_a_tmpdir_others_can_write_to_without_the_sticky_bit_is_avoided(base, mode, why, caplog):
    os.chmod(base, mode)
    with caplog.at_level(logging.WARNING, logger="launcher"):
        assert made_under(launch.make_run_dir()) == "/tmp"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert base in record.getMessage() and why in record.getMessage() and "using /tmp instead" in record.getMessage()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another uid")
def test_a_tmpdir_of_another_user_is_avoided(base, caplog):
    os.chown(base, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="launcher"):
        assert made_under(launch.make_run_dir()) == "/tmp"
    assert "belongs to uid 65534" in caplog.text


def test_with_no_fit_place_the_error_says_why_and_what_to_do(base, monkeypatch):
    os.chmod(base, 0o777)
    monkeypatch.setattr(launch, "FALLBACK_TMP", base)  # as if /tmp were unfit too
    with pytest.raises(launch.RunDirError, match="no safe directory for the launcher's sockets") as err:
        launch.make_run_dir()
    assert base in str(err.value) and "Set TMPDIR" in str(err.value)
    assert os.listdir(base) == []
