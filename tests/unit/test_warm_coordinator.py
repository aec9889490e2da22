"""WarmCoordinator with a real warm template (no preloads, so it is ready at once): when it starts
the template, how it notices readiness and death, and the records it writes."""

from __future__ import annotations

import io
import os
import signal
import sys
import time

import pytest
from torch.distributed.elastic.agent.server.api import WorkerSpec

from ft_core.wire.env import FT_WARM_TEMPLATE_SOCKET_ENV_VAR
from launcher.events.log import EventLog
from launcher.warm.coordinator import TRAMPOLINE, WarmCoordinator, WarmTemplate


def kinds(events: EventLog) -> list[str]:
    return [r["event"] for r in events.records]


@pytest.fixture
def coordinator(run_dir):
    events = EventLog(None, node="n", stream=io.StringIO())
    coordinator = WarmCoordinator(WarmTemplate(os.path.join(run_dir, "warm.sock"), []), events, start_delay=30.0)
    yield coordinator, events
    coordinator.stop()


def wait_ready(coordinator: WarmCoordinator) -> None:
    assert coordinator.template.poll_ready(timeout=30) is not None, "the template did not become ready"


def test_started_once_the_workers_are_up_not_before(coordinator):
    coordinator, events = coordinator
    now = time.monotonic()
    coordinator.workers_started(now)
    assert not coordinator.maybe_start(0, workers_up=False, now=now + 29)
    assert coordinator.pid is None and kinds(events) == []
    assert coordinator.maybe_start(0, workers_up=True, now=now + 1)
    assert events.records[-1]["event"] == "warm_template_started"
    assert events.records[-1]["pid"] == coordinator.pid and coordinator.pid is not None
    assert not coordinator.maybe_start(0, workers_up=True)  # started once


def test_started_after_the_delay_even_if_workers_are_not_up(coordinator):
    coordinator, events = coordinator
    now = time.monotonic()
    coordinator.workers_started(now)
    assert coordinator.maybe_start(0, workers_up=False, now=now + 30)
    assert kinds(events) == ["warm_template_started"]


def test_readiness_is_recorded_once_and_makes_the_next_cycle_warm(coordinator):
    coordinator, events = coordinator
    assert coordinator.before_cycle(0) is False  # nothing started yet
    coordinator.maybe_start(0, workers_up=True)
    deadline = time.monotonic() + 30
    while not coordinator.before_cycle(1):  # the template imports nothing: ready at once
        assert time.monotonic() < deadline, "the template did not become ready"
        time.sleep(0.02)
    assert coordinator.before_cycle(2) is True
    ready = [r for r in events.records if r["event"] == "warm_template_ready"]
    assert len(ready) == 1 and ready[0]["cycle"] == 1 and ready[0]["pid"] == coordinator.pid
    assert ready[0]["ready"] is True and ready[0]["failed_preloads"] == [] and ready[0]["cuda_initialized"] is False
    assert coordinator.worker_env() == {FT_WARM_TEMPLATE_SOCKET_ENV_VAR: coordinator.template.socket_path}


def test_a_dead_template_is_recorded_forgotten_and_started_again(coordinator):
    coordinator, events = coordinator
    coordinator.maybe_start(0, workers_up=True)
    wait_ready(coordinator)
    first = coordinator.pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while coordinator.template.alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert coordinator.before_cycle(1) is False  # this cycle starts cold
    assert coordinator.cold_reason == "the warm template had exited (code -9); a new one is started"
    replaced = [r for r in events.records if r["event"] == "warm_template_replaced"]
    assert [(r["cycle"], r["exit_code"]) for r in replaced] == [(1, -signal.SIGKILL)]
    # a restart is under way: the new template starts at once, for the next restart
    assert coordinator.pid not in (None, first)
    assert events.records[-1]["event"] == "warm_template_started" and events.records[-1]["cycle"] == 1
    assert not coordinator.maybe_start(1, workers_up=True)


def test_a_cold_cycle_says_why_and_a_restart_before_the_template_started_starts_it(coordinator):
    coordinator, events = coordinator
    assert coordinator.before_cycle(0) is False
    assert coordinator.cold_reason.startswith("first cycle")
    assert coordinator.pid is None  # the first cycle's workers import first
    # cycle 0 failed before its workers were up and before the start delay: no template yet
    assert coordinator.before_cycle(1) is False
    reason = coordinator.cold_reason
    # the setting it names is the one that exists (an environment variable: there is no such flag)
    assert "had not been started yet" in reason and "FT_LAUNCHER_WARM_START_DELAY (30 s)" in reason
    assert "--warm-start-delay" not in reason
    assert coordinator.pid is not None and kinds(events) == ["warm_template_started"]
    wait_ready(coordinator)
    assert coordinator.before_cycle(2) is True and coordinator.cold_reason is None


def test_adopt_rewrites_python_commands_only(coordinator):
    coordinator, _ = coordinator
    spec = WorkerSpec(role="t", local_world_size=1, rdzv_handler=None, entrypoint=sys.executable,
                      args=("-u", "train.py", "--lr", "1"))
    assert coordinator.adopt(spec)
    assert (spec.entrypoint, spec.args) == (sys.executable, ("-I", "-S", TRAMPOLINE, "-u", "train.py", "--lr", "1"))
    other = WorkerSpec(role="t", local_world_size=1, rdzv_handler=None, entrypoint="/bin/echo", args=("x",))
    assert not coordinator.adopt(other)
    assert (other.entrypoint, other.args) == ("/bin/echo", ("x",))


def test_cold_and_warm_starts_have_the_interface_the_agent_uses():
    import inspect

    from launcher.warm.cold import ColdStart, StartCoordinator

    names = [n for n in vars(StartCoordinator) if not n.startswith("_")]
    assert set(names) >= {"uses_stand_ins", "pid", "before_cycle", "workers_started", "maybe_start",
                          "resolve_workers", "worker_env"}
    for cls in (ColdStart, WarmCoordinator):
        for name in names:
            ours, theirs = getattr(StartCoordinator, name), getattr(cls, name)
            if callable(ours):
                wanted = list(inspect.signature(ours).parameters)
                assert list(inspect.signature(theirs).parameters)[: len(wanted)] == wanted, (cls, name)
    cold = ColdStart()
    assert (cold.uses_stand_ins, cold.pid, cold.before_cycle(3), cold.maybe_start(3, workers_up=True)) == \
        (False, None, False, False)
    assert cold.resolve_workers({0: 11, 1: 12}) == {0: 11, 1: 12} and cold.worker_env() == {}
    assert WarmCoordinator.uses_stand_ins is True


def test_a_rendezvous_that_ends_before_the_idle_start_starts_nothing(coordinator):
    coordinator, events = coordinator
    with coordinator.rendezvous_wait(0):
        pass
    assert coordinator.pid is None and kinds(events) == []
    assert coordinator.before_cycle(0) is False and coordinator.cold_reason.startswith("first cycle")


def test_a_long_rendezvous_starts_the_template_and_the_round_waits_for_its_imports(run_dir, tmp_path, monkeypatch):
    # A spare: its rendezvous waits past the idle start; the template it starts imports for about
    # 1.5 s (a module that sleeps); the workers of the round that admits it wait for that, warm.
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(1.5)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    events = EventLog(None, node="n", stream=io.StringIO())
    coordinator = WarmCoordinator(WarmTemplate(os.path.join(run_dir, "warm.sock"), ["slow_to_import"]), events,
                                  start_delay=30.0, idle_start_after=0.1)
    try:
        with coordinator.rendezvous_wait(3):
            deadline = time.monotonic() + 30
            while not coordinator.template.started:
                assert time.monotonic() < deadline, "the template was not started while the rendezvous waited"
                time.sleep(0.01)
        assert kinds(events) == ["warm_template_started"] and events.records[0]["cycle"] == 3
        assert coordinator.template.status is None  # still importing
        assert coordinator.before_cycle(3) is True and coordinator.cold_reason is None
        assert kinds(events) == ["warm_template_started", "warm_template_ready"]
        assert not coordinator.maybe_start(3, workers_up=True)  # started once
    finally:
        coordinator.stop()
