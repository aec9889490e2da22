"""The node check reads $TMPDIR itself: a read-only temp dir keeps the node out (a real launcher).

Python's ``tempfile.gettempdir()`` skips a ``$TMPDIR`` it cannot write to and returns ``/tmp``;
the node check used it, so a node whose temp file system had gone read-only passed and joined
(exit 0 here) while its workers were still told to use that dir. Needs a read-only mount (root);
skipped where mounting is not allowed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.exit_codes import EXIT_NODE_EXCLUDED
from tests.launcher_util import WORKER, events_of, read_events, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ro"
    path.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True, capture_output=True, timeout=30)
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True, capture_output=True, timeout=30)


def test_a_read_only_tmpdir_fails_the_node_check(tmp_path: Path, read_only_dir: Path) -> None:
    log = tmp_path / "events.jsonl"
    done = run_launcher(["--standalone", "--nproc-per-node", "1", "--ft-event-log", str(log), WORKER,
                         "--record-dir", str(tmp_path), "--steps", "2"], env={"TMPDIR": str(read_only_dir)})
    assert done.returncode == EXIT_NODE_EXCLUDED, done.stderr[-3000:]
    [record] = events_of(read_events(log), "node_check")
    [failed] = [c for c in record["checks"] if not c["ok"]]
    assert failed["name"] == f"disk {read_only_dir}" and "Read-only file system" in failed["detail"], record
