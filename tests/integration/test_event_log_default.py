"""README: "the event log is kept by default". A plain ``ft_launcher`` (no ``--ft-event-log``,
``--log-dir`` or auto-resume) appends to ``ft_launcher_logs/ft_events.jsonl`` in its working
directory, says so at start, and ``ft_report`` reads that directory; several launchers started
in the same directory at once share the file (one whole line per record, each run's own
records); ``--ft-event-log none`` writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.launcher_util import events_of, launcher_env, read_events, start_launcher

FT_REPORT = Path(sys.executable).parent / "ft_report"
WORKER = "import sys; sys.exit(0)\n"


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    """Wait for a launcher started by :func:`start_launcher`; its exit code and stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"ft_launcher did not finish in {timeout} s:\n{err[-4000:]}") from None
    return proc.returncode, err


def test_plain_launchers_keep_their_event_log_in_the_working_directory(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    work = tmp_path / "job"
    work.mkdir()
    args = ["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1", "--no-warm-restarts", str(script)]
    # two launchers in the same directory at once (as the nodes of a job on a shared file system)
    procs = [start_launcher(args, cwd=work) for _ in range(2)]
    results = [finish(proc) for proc in procs]
    log = work / "ft_launcher_logs" / "ft_events.jsonl"
    for code, err in results:
        assert code == 0, err[-4000:]
        assert f"event log = {log}  (default)" in err, err[-4000:]
    events = read_events(log)  # every line whole JSON
    runs = {e["run_id"] for e in events_of(events, "launcher_start")}
    assert len(runs) == 2 and {e["run_id"] for e in events_of(events, "result")} == runs
    assert all(e["outcome"] == "succeeded" for e in events_of(events, "result"))

    report = subprocess.run([str(FT_REPORT), str(work / "ft_launcher_logs")], capture_output=True, text=True,
                            timeout=60, env=launcher_env())
    assert report.returncode == 0, report.stderr
    assert all(run in report.stdout for run in runs), report.stdout


def test_ft_event_log_none_keeps_it_in_memory(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    work = tmp_path / "job"
    work.mkdir()
    code, err = finish(start_launcher(["--standalone", "--nproc-per-node", "1", "--no-warm-restarts",
                                       "--ft-event-log", "none", str(script)], cwd=work))
    assert code == 0, err[-4000:]
    assert "event log: kept in memory only (--ft-event-log none)" in err
    assert list(work.iterdir()) == []
