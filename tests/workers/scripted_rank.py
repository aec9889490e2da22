"""A rank driven by a JSON script, for tests: ``python scripted_rank.py '<json steps>'``.

Each step is a list ``[op, *args]``; results are printed as JSON lines on stdout so the test
can follow along. Ops: init, hb N INTERVAL, start NAME, end NAME, sleep S, calc_hb,
calc_sections SELECTED CALC_OOS, save PATH, load PATH, shutdown, exit CODE, spin S, stop,
step N (set_step), gil S (a C call holding the GIL), on_term return|exit0 (a SIGTERM handler that
returns, or exits 0).
"""

import ctypes
import json
import os
import signal
import sys
import time

from ft_core import RankMonitorClient, RankMonitorClientError


def emit(**fields):
    print(json.dumps(fields), flush=True)


def busy_in_c(seconds):
    # PyDLL keeps the GIL for the call: no other Python thread runs, no Python signal handler.
    ctypes.PyDLL(None).sleep(int(seconds))


def on_term(mode):
    def handler(signum, frame):
        emit(op="sigterm")
        if mode == "exit0":
            sys.exit(0)
    signal.signal(signal.SIGTERM, handler)


def main() -> int:
    steps = json.loads(sys.argv[1])
    client = RankMonitorClient()
    for step in steps:
        op, args = step[0], step[1:]
        if op == "init":
            client.init_workload_monitoring()
            emit(op="init", hb=client.hb_timeouts.to_dict(), sections=client.section_timeouts.to_dict())
        elif op == "hb":
            count, interval = args
            for _ in range(count):
                client.send_heartbeat()
                time.sleep(interval)
        elif op == "start":
            client.start_section(args[0])
        elif op == "end":
            client.end_section(args[0])
        elif op == "sleep":
            emit(op="sleep", at=time.monotonic())
            time.sleep(args[0])
        elif op == "step":
            client.set_step(args[0])
        elif op == "gil":
            emit(op="gil", at=time.monotonic())
            busy_in_c(args[0])
        elif op == "on_term":
            on_term(args[0])
        elif op == "stop":
            emit(op="stop", at=time.monotonic())
            os.kill(os.getpid(), signal.SIGSTOP)
        elif op == "calc_hb":
            emit(op="calc_hb", ok=client.calculate_and_set_hb_timeouts(skip_if_not_ready=True),
                 hb=client.hb_timeouts.to_dict())
        elif op == "calc_sections":
            selected, calc_oos = args
            ok = client.calculate_and_set_section_timeouts(
                selected_sections=selected, calc_out_of_section=calc_oos, skip_if_not_ready=True)
            emit(op="calc_sections", ok=ok, sections=client.section_timeouts.to_dict())
        elif op == "save":
            with open(args[0], "w") as stream:
                json.dump(client.state_dict(), stream)
        elif op == "load":
            with open(args[0]) as stream:
                client.load_state_dict(json.load(stream))
            emit(op="load", hb=client.hb_timeouts.to_dict(), sections=client.section_timeouts.to_dict())
        elif op == "try":
            # ["try", op, *args]: run a call expected to fail, report the error text
            try:
                getattr(client, args[0])(*args[1:])
                emit(op="try", error=None)
            except RankMonitorClientError as err:
                emit(op="try", error=str(err))
        elif op == "shutdown":
            client.shutdown_workload_monitoring()
        elif op == "exit":
            return args[0]
        else:
            raise ValueError(f"unknown op {op!r}")
    emit(op="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
