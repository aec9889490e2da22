"""ft_launcher's stop bounds on every supported torch, those before 2.12 included (their agent has none).

torch < 2.12 builds its agent without a shutdown timeout and calls the agent's ``_shutdown(death_sig)``
without one; ``FaultTolerantAgent._shutdown`` then applies ``--term-timeout`` itself
(``launcher/torch_compat.py``). ``make test-torch-oldest`` runs this file on torch 2.8, CI on the
installed torch: the same behaviour is expected from both.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.launcher_util import HEARTBEAT_ARGS, records, start_launcher, wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "workers" / "signal_worker.py")
TORCH_DEFAULT_STOP = 30.0
"""Seconds torch itself gives workers from SIGTERM to SIGKILL (any release): a stop bounded by
``--term-timeout 1`` must end well before."""


@pytest.mark.timeout(120)
def test_term_timeout_bounds_the_stop_after_a_signal_to_the_launcher(tmp_path):
    # Both workers keep running 60 s after SIGTERM: only the SIGKILL after --term-timeout ends them.
    proc = start_launcher(["--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
                           "--term-timeout", "1", *HEARTBEAT_ARGS, WORKER, "--dir", str(tmp_path),
                           "--stop-delay", "60"])
    try:
        wait_for(lambda: len(records(tmp_path)) == 2 or proc.poll() is not None, 60, "both workers running")
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TORCH_DEFAULT_STOP + 30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Exit 1: the workers did not exit 0 within --term-timeout (launcher/exit_codes.py).
    assert proc.returncode == 1 and "result: signal SIGTERM" in err, err[-4000:]
    # Killed after about 1 s (plus the launcher's own teardown), not after torch's 30 s.
    assert took < TORCH_DEFAULT_STOP / 2, f"the stop took {took:.1f} s; stderr:\n{err[-4000:]}"
    assert not list(tmp_path.glob("*.stopped")), "a worker finished its 60 s stop: it was not killed"
    for (_, rank), record in records(tmp_path).items():
        assert not Path(f"/proc/{record['pid']}").exists() or _is_zombie(record["pid"]), f"rank {rank} still runs"


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"
