"""ft_core.client.run_errors.install_error_recording: a rank's uncaught exception reaches torch's
error file without ``@record`` (issue 31 item 10), in real interpreter processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from launcher.decision.failures import failure_records

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def run_script(tmp_path: Path, body: str, error_file: Path | None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)


PLAIN = """
    import logging
    from ft_core.client.run_errors import install_error_recording

    def load_shard(n):
        raise ValueError(f"bad shard {n}")

    def main():
        assert install_error_recording(logging.getLogger("t"))
        assert not install_error_recording(logging.getLogger("t"))  # once per process
        load_shard(17)

    main()
"""


def test_an_uncaught_exception_is_written_as_record_would_and_still_printed(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    done = run_script(tmp_path, PLAIN, error_file)
    assert done.returncode == 1
    # the previous hook still prints the traceback
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: bad shard 17" in done.stderr
    message = json.loads(error_file.read_text())["message"]
    assert message["message"] == "ValueError: bad shard 17"
    callstack = message["extraInfo"]["py_callstack"]
    assert "in load_shard" in callstack and "in main" in callstack, callstack
    # what the launcher makes of it: the exception in the cause, its frame in the fingerprint
    failure = ProcessFailure(local_rank=0, pid=100, exitcode=1, error_file=str(error_file))
    [record] = failure_records({0: failure}, local_ranks={0: 0}, hangs={}, stopped_by_us=set(), cycle=0, now=1.0)
    assert record.cause == "exit code 1: ValueError: bad shard 17"
    assert record.fingerprint is not None and record.fingerprint.where == "train.py load_shard"
    assert record.fingerprint.what == "exit code 1: ValueError: bad shard N"


def test_a_script_with_record_keeps_torchs_file_and_its_own_hook(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    done = run_script(tmp_path, """
        import logging, sys
        from torch.distributed.elastic.multiprocessing.errors import record
        from ft_core.client.run_errors import install_error_recording

        def own_hook(kind, value, tb):
            print("own hook:", kind.__name__, file=sys.stderr)
        sys.excepthook = own_hook

        @record
        def main():
            install_error_recording(logging.getLogger("t"))
            raise KeyError("lr")

        main()
    """, error_file)
    assert done.returncode == 1
    assert "own hook: KeyError" in done.stderr  # chained to the hook it found
    message = json.loads(error_file.read_text())["message"]
    assert message["message"] == "KeyError: 'lr'"
    assert "in main" in message["extraInfo"]["py_callstack"]


@pytest.mark.parametrize("raise_line", ["raise KeyboardInterrupt", "raise SystemExit(3)"])
def test_an_interrupt_or_exit_is_not_recorded(tmp_path: Path, raise_line: str) -> None:
    error_file = tmp_path / "error.json"
    done = run_script(tmp_path, f"""
        import logging
        from ft_core.client.run_errors import install_error_recording
        install_error_recording(logging.getLogger("t"))
        {raise_line}
    """, error_file)
    assert done.returncode != 0
    assert not error_file.exists()


def test_without_torchs_error_file_nothing_is_installed(tmp_path: Path) -> None:
    done = run_script(tmp_path, """
        import logging, sys
        from ft_core.client.run_errors import install_error_recording
        before = sys.excepthook
        assert install_error_recording(logging.getLogger("t")) is False
        assert sys.excepthook is before
    """, None)
    assert done.returncode == 0, done.stderr


def test_an_existing_error_file_is_left_as_it_is(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text('{"message": "written first"}')
    done = run_script(tmp_path, PLAIN, error_file)
    assert done.returncode == 1
    assert error_file.read_text() == '{"message": "written first"}'
