"""launcher.node.worker_stop: what the agent's _stop_workers and _shutdown hooks do, in order."""

from __future__ import annotations

import signal

import pytest

from launcher.events.records import LeftoversKilled
from launcher.node import worker_stop
from launcher.node.worker_stop import StopSettings, WorkerStop
from launcher.torch_compat import torch_shutdown_kwargs


class FakeWorkers:
    """The worker table's side of a stop, with what happened in ``calls``."""

    def __init__(self, calls: list, killed: set[int], statuses: dict[int, int | None]) -> None:
        self.calls, self._killed, self._statuses = calls, killed, statuses
        self.pids = [10, 11]
        self.all_pids = [10, 11, 20]

    def terminate(self, pids, grace, sig=signal.SIGTERM, already_signalled=False):
        self.calls.append(("terminate", list(pids), grace, sig, already_signalled))
        return self._killed

    def exit_statuses(self):
        return self._statuses

    def close(self):
        self.calls.append(("close",))


class FakeMonitors:
    def pids(self):
        return [30, 31]


class FakeStarts:
    def __init__(self, pid: int | None) -> None:
        self.pid = pid


class FakeEvents:
    def __init__(self) -> None:
        self.records: list = []

    def record_event(self, record):
        self.records.append(record)
        return record


def make(monkeypatch, *, killed=frozenset(), statuses=None, delivered=None, template_pid=None, leftovers=()):
    calls: list = []
    monkeypatch.setattr(worker_stop.processes, "kill_leftovers",
                        lambda **kwargs: calls.append(("kill_leftovers", kwargs)) or set(leftovers))
    settings = StopSettings(
        term_timeout=2.5, workers_stop_timeout=1.0,
        reassert_signal_handlers=lambda: calls.append(("reassert",)),
        stop_signal_delivered=None if delivered is None else (lambda sig: sig in delivered),
        helper_pids=[40])
    events = FakeEvents()
    workers = FakeWorkers(calls, set(killed), statuses if statuses is not None else {10: 0, 11: 0})
    stop = WorkerStop(settings, workers, FakeMonitors(), FakeStarts(template_pid), events)  # type: ignore[arg-type]
    return stop, calls, events


def torch_shutdown(calls: list):
    return lambda death_sig, **kwargs: calls.append(("torch_shutdown", death_sig, kwargs))


def test_between_cycles_is_term_timeout_or_sigkill_at_once_for_a_node_that_leaves(monkeypatch):
    stop, _, _ = make(monkeypatch)
    assert stop.between_cycles(leaving=False) == (signal.SIGTERM, 2.5)
    assert stop.between_cycles(leaving=True) == (signal.SIGKILL, 0.0)


def test_a_stop_in_order_handlers_workers_torch_then_leftovers(monkeypatch):
    stop, calls, events = make(monkeypatch, template_pid=50)
    assert stop.stop(torch_shutdown(calls), signal.SIGTERM, 0.25, cycle=3) is True
    assert [c[0] for c in calls] == ["reassert", "terminate", "torch_shutdown", "close", "kill_leftovers"]
    assert calls[1] == ("terminate", [10, 11], 0.25, signal.SIGTERM, False)
    assert calls[2] == ("torch_shutdown", signal.SIGTERM, torch_shutdown_kwargs(0.25))
    assert calls[4][1] == {"worker_pids": [10, 11, 20], "keep": {30, 31}, "keep_alone": {50, 40}}
    assert events.records == []


def test_no_timeout_is_term_timeout_and_no_template_is_not_kept(monkeypatch):
    stop, calls, _ = make(monkeypatch, template_pid=None)
    stop.stop(torch_shutdown(calls), signal.SIGTERM, None, cycle=0)
    assert calls[1][2] == 2.5
    assert calls[4][1]["keep_alone"] == {40}


def test_a_stop_signal_the_workers_got_themselves_is_not_sent_again(monkeypatch):
    stop, calls, _ = make(monkeypatch, delivered={signal.SIGTERM})
    stop.stop(torch_shutdown(calls), signal.SIGTERM, 1.0, cycle=0)
    stop.stop(torch_shutdown(calls), signal.SIGINT, 1.0, cycle=0)
    assert [c[4] for c in calls if c[0] == "terminate"] == [True, False]


@pytest.mark.parametrize(("killed", "statuses"), [({11}, {10: 0, 11: -9}), (set(), {10: 0, 11: 1})])
def test_a_stop_is_clean_only_when_every_worker_exited_0_in_time(monkeypatch, killed, statuses):
    stop, calls, _ = make(monkeypatch, killed=killed, statuses=statuses)
    assert stop.stop(torch_shutdown(calls), signal.SIGTERM, 1.0, cycle=0) is False


def test_leftovers_killed_are_recorded_for_the_cycle(monkeypatch):
    stop, calls, events = make(monkeypatch, leftovers={77, 66})
    stop.stop(torch_shutdown(calls), signal.SIGTERM, 1.0, cycle=4)
    assert events.records == [LeftoversKilled(cycle=4, pids=[66, 77])]
