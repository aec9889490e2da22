"""Drivers and checks of the fault matrix's signal cases (``tests/faults/test_fault_matrix.py``).

The workers are ``tests/workers/signal_worker.py``: one line per handler run in
``cycle<C>_rank<R>.signals``, so a count is exactly how often a worker's handler ran.

Signals are sent from a separate process (never the launcher's parent), in two ways:

- **job-wide**, as SLURM's step daemon does (``scancel -s``, ``--signal`` without ``B:``, the time
  limit): to every live process of the case (found by the case's marker variable, as a step's
  cgroup holds them), the launcher first or last;
- **launcher only**, as a terminal, ``kill PID`` or ``scripts/autoresume.sh`` do.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.faults.runner import CaseRun, live_case_processes, wait_for

SIGNAL_WORKER = str(Path(__file__).resolve().parent.parent / "workers" / "signal_worker.py")
_SENDER = ("import os, sys\n"
           "for pid in sys.argv[2:]:\n"
           "    try:\n"
           "        os.kill(int(pid), int(sys.argv[1]))\n"
           "    except ProcessLookupError:\n"
           "        pass\n")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            raw = stream.read()
    except OSError:  # gone (also between the open and the read)
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X")


def send(run: CaseRun, sig: signal.Signals, delivery: str, order: str = "launcher-first") -> list[int]:
    """Send ``sig`` job-wide (every process of the case) or to the launcher only; return the pids."""
    launcher = run.launchers["a"].proc.pid
    if delivery == "launcher":
        pids = [launcher]
    else:
        others = sorted(int(entry.split(":", 1)[0]) for entry in live_case_processes(run.case_id))
        others = [pid for pid in others if pid != launcher]
        pids = [launcher, *others] if order == "launcher-first" else [*others, launcher]
    subprocess.run([sys.executable, "-c", _SENDER, str(int(sig)), *map(str, pids)], check=True, timeout=30)
    return pids


def record(run: CaseRun, cycle: int, rank: int) -> dict | None:
    return run.record(cycle, rank)


def handled(run: CaseRun, cycle: int, rank: int) -> list[str]:
    """The signal names the worker's handler ran for, one per run."""
    path = run.dir / f"cycle{cycle}_rank{rank}.signals"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def started(run: CaseRun, cycle: int) -> bool:
    return all(record(run, cycle, rank) for rank in (0, 1))


def is_warm(case) -> bool:
    return "--no-warm-restarts" not in case.launcher


def template_ready(run: CaseRun) -> bool:
    """The warm template listens (it does once its imports are done)."""
    return bool(list(run.tmp.glob("ft-*/warm.sock")))


def start_and_restart(case, run: CaseRun) -> int:
    """Start the launcher; with ``extra['restart']``, restart once (warm where warm restarts are
    on: the crash is triggered once the template is ready). Returns the cycle now running."""
    run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: started(run, 0), 60, "both workers of cycle 0")
    if not case.extra.get("restart"):
        return 0
    if is_warm(case):
        run.wait_for(lambda: template_ready(run), 60, "the warm template")
    (run.dir / "crash").write_text("")
    run.wait_for(lambda: started(run, 1), 60, "both workers of cycle 1")
    return 1


def helper_pids(run: CaseRun, cycle: int) -> dict[str, int]:
    """The launcher's helper processes: sentinel, monitors, warm template, stand-ins."""
    launcher = run.launchers["a"]
    helpers = {"sentinel": launcher.events("launcher_start")[0]["sentinel_pid"]}
    for index, pid in enumerate(launcher.events("monitors_started")[0]["monitor_pids"]):
        helpers[f"monitor {index}"] = pid
    for event in launcher.events("warm_template_started"):
        helpers["warm template"] = event["pid"]
    stand_ins = launcher.events("cycle_start")[cycle].get("stand_in_pids") or {}
    for local_rank, pid in stand_ins.items():
        helpers[f"stand-in {local_rank}"] = pid
    return helpers


# ---------------------------------------------------------------------------- drivers


def signal_run(case, run: CaseRun) -> None:
    """Relayed signals one after the other, then a stop signal; all delivered as the case says."""
    delivery, order = case.extra["delivery"], case.extra.get("order", "launcher-first")
    cycle = start_and_restart(case, run)
    run.info["cycle"] = cycle
    for sig in case.extra["signals"]:
        send(run, sig, delivery, order)
        run.wait_for(lambda sig=sig: all(sig.name in handled(run, cycle, r) for r in (0, 1)), 20,
                     f"both workers to handle {sig.name}")
    helpers = helper_pids(run, cycle)
    run.info["helpers"] = {name: alive(pid) for name, pid in helpers.items()}
    sent = time.monotonic()
    send(run, case.extra["stop"], delivery, order)
    run.launchers["a"].finish(case.budget)
    run.info["stop_s"] = time.monotonic() - sent


def signal_during_restart(case, run: CaseRun) -> None:
    """SIGUSR1 while rank 1 of cycle 0 is dead and rank 0 is being stopped: no worker can take
    it; it must reach both workers of cycle 1 once."""
    delivery = case.extra["delivery"]
    launcher = run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: started(run, 0), 60, "both workers of cycle 0")
    if is_warm(case):
        run.wait_for(lambda: template_ready(run), 60, "the warm template")
    (run.dir / "crash").write_text("")
    run.wait_for(lambda: "SIGTERM" in handled(run, 0, 0), 30, "rank 0 of cycle 0 to be stopped")
    send(run, signal.SIGUSR1, delivery)
    run.wait_for(lambda: started(run, 1), 60, "both workers of cycle 1")
    run.wait_for(lambda: all("SIGUSR1" in handled(run, 1, r) for r in (0, 1)), 30,
                 "the queued SIGUSR1 to reach both workers of cycle 1")
    send(run, signal.SIGTERM, delivery)
    launcher.finish(case.budget)


def repeated_stop_signals(case, run: CaseRun) -> None:
    """A second (and third) stop signal while the launcher cleans up.

    The warm template is stopped (SIGSTOP) first, so the clean-up waits for it (5 s) before it
    kills it: a window of seconds in which the launcher is known to be cleaning up (it closed its
    monitor links first, and the monitors have exited).
    """
    launcher = run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: started(run, 0) and template_ready(run), 60, "both workers and the warm template")
    run.info["monitors"] = launcher.events("monitors_started")[0]["monitor_pids"]
    run.info["template"] = launcher.events("warm_template_started")[0]["pid"]
    os.kill(run.info["template"], signal.SIGSTOP)
    send(run, signal.SIGTERM, "launcher")
    wait_for(lambda: not any(alive(pid) for pid in run.info["monitors"]) or launcher.proc.poll() is not None, 30,
             "the clean-up to begin")
    for sig in case.extra["more"]:
        send(run, sig, "launcher")
    launcher.finish(case.budget)


def launcher_sigkilled(case, run: CaseRun) -> None:
    """SIGKILL to the launcher while a worker's daemon (own session, re-parented) runs."""
    launcher = run.launch(case.launcher_args(run) + case.worker_args(run))
    run.wait_for(lambda: started(run, 0), 60, "both workers of cycle 0")
    run.info["daemons"] = [record(run, 0, rank)["daemon"] for rank in (0, 1)]
    assert all(alive(pid) for pid in run.info["daemons"])
    launcher.proc.kill()
    launcher.finish(10)
    killed = time.monotonic()
    wait_for(lambda: not live_case_processes(run.case_id), 15, "every process of the run to exit")
    run.info["gone_s"] = time.monotonic() - killed


def findable_workers(case, run: CaseRun) -> None:
    """After a warm restart: what ps/pgrep find, what a signal to that pid does, which pids the
    launcher's records name."""
    cycle = start_and_restart(case, run)
    pattern = f"signal_worker.py --dir {run.dir}"
    found = subprocess.run(["pgrep", "-f", re.escape(pattern)], capture_output=True, text=True, timeout=30)
    run.info["pgrep"] = sorted(int(pid) for pid in found.stdout.split())
    run.info["launcher_pid"] = run.launchers["a"].proc.pid
    run.info["helpers"] = helper_pids(run, cycle)
    worker = record(run, cycle, 0)["pid"]
    os.kill(worker, signal.SIGUSR1)  # the pid a user found: its handler runs
    run.wait_for(lambda: "SIGUSR1" in handled(run, cycle, 0), 20, "the worker to handle SIGUSR1")
    os.kill(worker, signal.SIGSTOP)
    run.wait_for(lambda: _state(worker) == "T", 20, "the worker to stop")
    run.info["stopped_state"] = _state(worker)
    os.kill(worker, signal.SIGCONT)
    run.wait_for(lambda: _state(worker) != "T", 20, "the worker to continue")
    # A failure of rank 1: its record names the worker, not the stand-in.
    (run.dir / f"exit-{record(run, cycle, 1)['pid']}").write_text("")
    run.launchers["a"].finish(case.budget)


def _state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3].decode()


# ---------------------------------------------------------------------------- checks


def check_signal_run(case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    cycle = run.info["cycle"]
    expected = collections.Counter(sig.name for sig in [*case.extra["signals"], case.extra["stop"]])
    for rank in (0, 1):
        # each worker's handler ran exactly once per signal sent, warm or cold, job-wide or not
        assert collections.Counter(handled(run, cycle, rank)) == expected, (rank, handled(run, cycle, rank))
        assert (run.dir / f"cycle{cycle}_rank{rank}.stopped").exists(), "the stop handler was cut short"
    # every helper survived the relayed signals (checked right before the stop signal)
    assert all(run.info["helpers"].values()), run.info["helpers"]
    assert not launcher.events("monitor_died") and not launcher.events("warm_template_replaced")
    if case.extra.get("restart"):
        assert launcher.events("cycle_start")[1]["warm_start"] is is_warm(case)
    received = launcher.events("signal_received")
    assert [(r["signal"], r["job_wide"]) for r in received] == [
        (sig.name, case.extra["delivery"] == "job") for sig in case.extra["signals"]], received


def check_term_timeout(case, run: CaseRun) -> None:
    """Job-wide SIGTERM: the workers' 2 s checkpoint-like handler finishes (warm as cold)."""
    check_signal_run(case, run)
    assert 2.0 <= run.info["stop_s"] < 15.0, run.info


def check_queued(case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    for rank in (0, 1):
        got = handled(run, 1, rank)
        assert collections.Counter(got) == {"SIGUSR1": 1, "SIGTERM": 1}, (rank, got)
    queued = [e for e in launcher.events("signal_forwarded") if e["queued"]]
    workers = {record(run, 1, rank)["pid"] for rank in (0, 1)}
    assert {pid for e in queued for pid in e["worker_pids"]} == workers, queued
    assert [e["cycle"] for e in launcher.events("cycle_start")] == [0, 1]


def check_second_signal(case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    assert "again while stopping" in launcher.log()
    result = launcher.events("result")
    assert [(r["outcome"], r["exit_code"]) for r in result] == [("signal SIGTERM", 0)], result
    assert not alive(run.info["template"])


def check_forced(case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    assert "a third time: forcing the stop" in launcher.log()
    result = launcher.events("result")
    assert [(r["outcome"], r["exit_code"]) for r in result] == [("forced stop (SIGTERM)", 128 + signal.SIGTERM)]
    assert not alive(run.info["template"])


def check_daemons_gone(case, run: CaseRun) -> None:
    assert run.info["gone_s"] <= 10.0, run.info
    assert not any(alive(pid) for pid in run.info["daemons"])
    log = run.launchers["a"].log()
    line = next(line for line in log.splitlines() if line.startswith("[ft_launcher sentinel]"))
    assert "exited without cleaning up" in line and all(str(pid) in line for pid in run.info["daemons"]), line


def check_findable(case, run: CaseRun) -> None:
    launcher = run.launchers["a"]
    workers = {rank: record(run, 1, rank)["pid"] for rank in (0, 1)}
    helpers = run.info["helpers"]
    # pgrep -f finds the workers under their script (and the launcher, whose arguments hold the
    # script's command line, as with torchrun) - neither a stand-in nor the template
    assert set(run.info["pgrep"]) - {run.info["launcher_pid"]} == set(workers.values()), (run.info, helpers)
    assert run.info["stopped_state"] == "T"
    cycle = launcher.events("cycle_start")[1]
    assert cycle["warm_start"] is True
    assert cycle["worker_pids"] == {str(rank): pid for rank, pid in workers.items()}, cycle
    assert set(cycle["stand_in_pids"].values()).isdisjoint(workers.values()), cycle
    failure = next(f for f in launcher.events("failure") if f["cycle"] == 1 and f["cause_kind"] != "terminated")
    assert (failure["rank"], failure["worker_pid"]) == (1, workers[1]), failure
    line = next(line for line in launcher.log().splitlines() if line.startswith("[ft_launcher] cycle 1: rank 1"))
    assert f"pid {workers[1]})" in line, line
    assert f"cycle 1: worker pid {workers[0]} started" in launcher.log()  # the monitor's line
    log = launcher.log()
    assert "failed (exitcode" not in log  # torch's own failure line is not printed: ours names the root
    for stand_in in cycle["stand_in_pids"].values():  # torch's other pid lines name the worker
        assert f"process {stand_in} " not in log and f"pid: {stand_in})" not in log, stand_in
