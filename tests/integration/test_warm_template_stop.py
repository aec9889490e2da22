"""A job-wide SIGTERM while the warm template still imports stops the job at once (issue 21.13).

The template blocks the step signals and takes them with ``sigwaitinfo``; it leaves on a SIGTERM
sent by its launcher. A job-wide SIGTERM (SLURM's step daemon signals every process) that arrived
while the template was importing used to stay pending, and the launcher's own SIGTERM to the
template merged with it (a standard signal pends once, with the first sender's pid): the template
ignored the stop and was SIGKILLed 5 s later, so the stop took 5.2-5.4 s instead of 0.2 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.launcher_util import events_of, live_descendants, read_events, start_launcher, wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "ft_worker.py")
# Slow to import, so the signal lands while the template imports (it runs at the lowest priority).
SLOW_PRELOAD = "torch,torch.distributed,lightning.pytorch"

pytestmark = pytest.mark.timeout(180)


def test_a_job_wide_sigterm_while_the_template_imports_stops_the_launcher_promptly(tmp_path):
    scratch = tmp_path / "t"
    scratch.mkdir()
    events = tmp_path / "events.jsonl"
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.05",
            "--warm-preload", SLOW_PRELOAD, "--ft-event-log", str(events),
            WORKER, "--record-dir", str(tmp_path), "--steps", "4000", "--step-time", "0.05"]
    proc = start_launcher(args, env={"TMPDIR": str(scratch), "FT_LAUNCHER_WARM_START_DELAY": "0"})
    try:
        started = wait_for(lambda: events.exists() and events_of(read_events(events), "warm_template_started"),
                           90, "the warm template to start")
        template = started[0]["pid"]
        time.sleep(0.5)  # a moment into its imports
        assert not list(scratch.glob("ft-*/warm.sock")), "the template finished importing too soon"
        pids = [proc.pid, *live_descendants(proc.pid)]
        assert template in pids
        sent = time.monotonic()
        for pid in pids:  # as slurmstepd: every process of the job
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert not list(scratch.glob("ft-*/warm.sock"))  # the template never got to serve
    assert not os.path.exists(f"/proc/{template}")
    assert took < 2.0, f"the launcher took {took:.2f} s to stop"
    print(json.dumps({"stop_seconds": round(took, 2)}))
