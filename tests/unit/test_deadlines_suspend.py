"""The deadline rules of a monitor that was suspended itself (issue 21.4), as plain values."""

from __future__ import annotations

from ft_core.monitor import deadlines
from ft_core.monitor.deadlines import HangKind, RankTimeouts, SlotReading


def timeouts() -> RankTimeouts:
    return RankTimeouts(connected_at=100.0, initial_heartbeat=60.0, heartbeat=5.0, section_names=("step",),
                        sections=[10.0], out_of_section=20.0)


def test_a_restart_gives_every_interval_its_full_timeout_from_the_resume():
    t = timeouts()
    reading = SlotReading(last_heartbeat=110.0, out_of_section_since=0.0, sections_open_since=(108.0,))
    assert deadlines.check(t, reading, 122.0).hang.kind is HangKind.HEARTBEAT  # 12 s stopped
    t.restart_clocks(122.0)
    verdict = deadlines.check(t, reading, 122.0)
    assert verdict.hang is None and verdict.wake_at == 127.0  # the heartbeat, 5 s after the resume
    assert deadlines.check(t, reading, 127.0).hang.started == 122.0
    # A heartbeat after the resume counts from itself.
    assert deadlines.check(t, SlotReading(123.0, 0.0, 0.0, (108.0,)), 127.5).hang is None


def test_a_restart_never_moves_a_clock_back():
    t = timeouts()
    t.restart_clocks(130.0)
    t.restart_clocks(125.0)
    assert t.resumed_at == 130.0


def test_suspended_means_a_sigcont_or_a_wake_up_far_later_than_asked():
    assert deadlines.was_suspended(10.0, 10.0, continued=True)
    assert deadlines.was_suspended(10.0, 10.0 + deadlines.SUSPENSION_MIN_GAP, continued=False)
    assert not deadlines.was_suspended(10.0, 10.5, continued=False)  # a busy host


def test_a_host_that_always_wakes_the_monitor_late_postpones_detection_only_once():
    late = deadlines.SUSPENSION_MIN_GAP + 1
    assert deadlines.was_suspended(10.0, 10.0 + late, continued=False, last_late_suspension=None)
    assert not deadlines.was_suspended(20.0, 20.0 + late, continued=False, last_late_suspension=10.0 + late)
    again = 10.0 + late + deadlines.LATE_SUSPENSION_INTERVAL
    assert deadlines.was_suspended(again - late, again, continued=False, last_late_suspension=10.0 + late)
    assert deadlines.was_suspended(20.0, 20.0, continued=True, last_late_suspension=19.0)  # a SIGCONT always
