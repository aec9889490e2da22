"""A rank for the ft_report tests, under scripts/autoresume.sh and ft_launcher (2 ranks).

``report_worker.py`` runs 20 steps of 50 ms (``set_step``, a heartbeat), from where it "resumed"
(it tells its monitor with ``report_resumed``: from scratch, then a periodic checkpoint of step 15,
then a just-in-time state of step 30: what ft_report sets against each failure's step), except:

* autoresume attempt 1, cycle 0: rank 1 stops heartbeating (its monitor finds the hang);
* attempt 1, cycle 1: rank 0 raises ``ValueError("bad batch 7")``, recorded for the launcher as
  a front end does (``ft_core.client.run_errors.record_error_for_launcher``), and exits 1;
* attempt 2: both ranks finish; rank 0 creates the finished flag.

Standard library and ``ft_core`` (torch only to record the error).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from ft_core import RankMonitorClient
from ft_core.client.run_errors import record_error_for_launcher
from ft_core.wire.atomic import atomic_write_text


def main() -> int:
    rank = int(os.environ["RANK"])
    cycle = int(os.environ["FT_LAUNCHER_CYCLE"])
    attempt = int(os.environ["AUTORESUME_ATTEMPT"])
    client = RankMonitorClient()
    client.init_workload_monitoring()
    start, source = {(1, 0): (0, "scratch"), (1, 1): (15, "checkpoint")}.get((attempt, cycle), (30, "jit"))
    client.report_resumed(start, source)
    for step in range(start, start + 20):  # the hang is in step 19, the ValueError in step 34
        client.set_step(step)
        client.send_heartbeat()
        time.sleep(0.05)
    if attempt == 1 and cycle == 0 and rank == 1:
        time.sleep(60)  # hung: the monitor stops this rank
    if attempt == 1 and cycle == 1 and rank == 0:
        try:
            raise ValueError("bad batch 7")
        except ValueError as err:
            client.shutdown_workload_monitoring()  # first: importing torch to record may take seconds
            record_error_for_launcher(err, logging.getLogger("report_worker"))
            raise
    if attempt == 1 and cycle == 1:
        for _ in range(1200):  # rank 1 goes on, alive, until the launcher stops it
            client.send_heartbeat()
            time.sleep(0.05)
    client.shutdown_workload_monitoring()
    if rank == 0 and attempt >= 2:
        atomic_write_text(os.environ["FAULT_TOL_FINISHED_FLAG_FILE"], "finished\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
