"""The rank monitor's deadline rules (ft_core.monitor.deadlines), without a monitor process."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ft_core.monitor.deadlines import (
    MIN_LOOK_AGAIN,
    SECTIONS_ARE_NOT_HEARTBEATS,
    Deadline,
    HangKind,
    RankTimeouts,
    SlotReading,
    check,
    describe_hang,
    earliest_deadline,
)

NAMES = ("setup", "step")


def timeouts(initial=None, hb=None, setup=None, step=None, oos=None, hb_set=0.0, sections_set=0.0) -> RankTimeouts:
    return RankTimeouts(connected_at=100.0, initial_heartbeat=initial, heartbeat=hb, section_names=NAMES,
                        sections=[setup, step], out_of_section=oos, heartbeat_set_at=hb_set,
                        sections_set_at=sections_set)


def reading(hb=0.0, activity=0.0, oos=0.0, setup=0.0, step=0.0) -> SlotReading:
    return SlotReading(last_heartbeat=hb, last_section_activity=activity, out_of_section_since=oos,
                       sections_open_since=(setup, step))


INIT, HB, SEC, OOS = HangKind.INITIAL_HEARTBEAT, HangKind.HEARTBEAT, HangKind.SECTION, HangKind.OUT_OF_SECTION

EARLIEST = [
    pytest.param(timeouts(), reading(oos=100), None, id="no-timeouts"),
    pytest.param(timeouts(initial=10, hb=5), reading(oos=100), (INIT, 100, 10, None), id="initial-from-connection"),
    pytest.param(timeouts(initial=10, hb=5), reading(hb=105, oos=100), (HB, 105, 5, None), id="heartbeat-after-first"),
    pytest.param(timeouts(initial=10, hb=None), reading(hb=105, oos=100), None, id="first-heartbeat-ends-initial"),
    pytest.param(timeouts(initial=10, hb=5), reading(activity=110, oos=110), (INIT, 100, 10, None),
                 id="section-activity-is-not-a-heartbeat"),
    pytest.param(timeouts(hb=5), reading(hb=120, activity=130, oos=130), (HB, 120, 5, None),
                 id="a-later-section-change-does-not-move-the-heartbeat-deadline"),
    pytest.param(timeouts(hb=5, hb_set=130), reading(hb=120, oos=100), (HB, 130, 5, None),
                 id="heartbeat-update-restarts-the-clock"),
    pytest.param(timeouts(initial=10, hb_set=130), reading(oos=100), (INIT, 130, 10, None),
                 id="initial-update-restarts-the-clock"),
    pytest.param(timeouts(oos=5), reading(oos=101), (OOS, 101, 5, None), id="out-of-section"),
    pytest.param(timeouts(oos=5, step=60), reading(step=101), (SEC, 101, 60, "step"),
                 id="no-oos-while-a-section-is-open"),
    pytest.param(timeouts(setup=None, step=2), reading(setup=100, step=101), (SEC, 101, 2, "step"),
                 id="open-section-without-timeout-is-ignored"),
    pytest.param(timeouts(setup=9, step=2), reading(setup=100), (SEC, 100, 9, "setup"), id="closed-section-is-ignored"),
    pytest.param(timeouts(setup=3, step=2, sections_set=110), reading(setup=100, step=101), (SEC, 110, 2, "step"),
                 id="section-update-restarts-open-sections"),
    pytest.param(timeouts(oos=3, sections_set=110), reading(oos=100), (OOS, 110, 3, None),
                 id="section-update-restarts-out-of-section"),
    pytest.param(timeouts(hb=10, oos=5), reading(hb=100, oos=105), (HB, 100, 10, None),
                 id="a-tie-keeps-the-first-considered"),
]


@pytest.mark.parametrize(("limits", "slot", "expected"), EARLIEST)
def test_earliest_deadline(limits, slot, expected):
    deadline = earliest_deadline(limits, slot)
    if expected is None:
        assert deadline is None
    else:
        kind, started, timeout, section = expected
        note = SECTIONS_ARE_NOT_HEARTBEATS if kind is INIT and slot.last_section_activity else None
        assert deadline == Deadline(started + timeout, kind, started, timeout, section, note)


def test_a_sections_only_rank_hung_for_its_initial_heartbeat_is_told_why():
    limits = timeouts(initial=10, hb=5, step=60)
    deadline = earliest_deadline(limits, reading(activity=108, step=108))
    assert deadline.kind is INIT and deadline.when == 110.0
    text = deadline.describe(112.5)
    assert text.startswith("hang: no initial heartbeat for 12.50 s > timeout 10.00 s (")
    assert "sections, which are not heartbeats" in text and "initial_rank_heartbeat_timeout" in text
    # a rank that used no section gets the plain description
    assert earliest_deadline(limits, reading(oos=100)).describe(112.5) == (
        "hang: no initial heartbeat for 12.50 s > timeout 10.00 s")


def test_the_earliest_of_several_deadlines_wins():
    limits = timeouts(hb=5, setup=1, step=4, oos=2)
    assert earliest_deadline(limits, reading(hb=100, activity=103, setup=103, step=101)).section == "setup"
    assert earliest_deadline(limits, reading(hb=100, activity=100, oos=100)).kind is HangKind.OUT_OF_SECTION
    assert earliest_deadline(limits, reading(hb=102, activity=102, step=102)).kind is HangKind.SECTION
    # a section change does not postpone the heartbeat deadline
    assert earliest_deadline(limits, reading(hb=100, activity=102, step=102)).kind is HangKind.HEARTBEAT
    assert earliest_deadline(timeouts(hb=5, step=9), reading(hb=100, step=100)).kind is HangKind.HEARTBEAT


CHECKS = [
    pytest.param(timeouts(), reading(oos=100), 150.0, None, None, id="nothing-to-watch"),
    pytest.param(timeouts(initial=10), reading(oos=100), 101.0, None, 110.0, id="sleep-until-the-deadline"),
    pytest.param(timeouts(initial=100, hb=2), reading(oos=100), 101.0, None, 103.0,
                 id="look-again-within-the-heartbeat-timeout"),
    pytest.param(timeouts(initial=100, step=3), reading(oos=100), 101.0, None, 104.0,
                 id="look-again-within-a-section-timeout"),
    pytest.param(timeouts(oos=4, hb=60), reading(hb=100, step=100), 101.0, None, 105.0,
                 id="look-again-within-the-out-of-section-timeout"),
    pytest.param(timeouts(initial=10), reading(oos=100), 110.0, (INIT, 100, 10, None), None,
                 id="due-exactly-at-the-deadline"),
    pytest.param(timeouts(hb=5), reading(hb=100), 107.5, (HB, 100, 5, None), None, id="past-the-deadline"),
    pytest.param(timeouts(initial=10, hb=1e-6), reading(oos=100), 101.0, None, 101.0 + MIN_LOOK_AGAIN,
                 id="look-again-never-spins"),
]


@pytest.mark.parametrize(("limits", "slot", "now", "hang", "wake_at"), CHECKS)
def test_check(limits, slot, now, hang, wake_at):
    verdict = check(limits, slot, now)
    if hang is None:
        assert verdict.hang is None
        assert verdict.wake_at == pytest.approx(wake_at) if wake_at is not None else verdict.wake_at is None
    else:
        kind, started, timeout, section = hang
        assert verdict.hang == Deadline(started + timeout, kind, started, timeout, section)
        assert verdict.wake_at is None


@pytest.mark.parametrize(
    ("kind", "section", "text"),
    [(HangKind.INITIAL_HEARTBEAT, None, "hang: no initial heartbeat for 12.35 s > timeout 10.00 s"),
     ("heartbeat", None, "hang: no heartbeat for 12.35 s > timeout 10.00 s"),
     (HangKind.SECTION, "step", "hang: section 'step' open 12.35 s > timeout 10.00 s"),
     ("out_of_section", None, "hang: out of any section for 12.35 s > timeout 10.00 s")],
)
def test_hang_descriptions_are_unchanged(kind, section, text):
    assert describe_hang(kind, 12.3456, 10.0, section) == text
    assert Deadline(110.0, HangKind(kind), 100.0, 10.0, section).describe(112.3456) == text


def test_hang_kind_values_are_the_event_strings():
    assert [k.value for k in HangKind] == ["initial_heartbeat", "heartbeat", "section", "out_of_section"]
    assert HangKind("section") is HangKind.SECTION


def test_timeout_updates():
    limits = timeouts(initial=10, hb=5, setup=1, step=2, oos=3)
    limits.set_heartbeat(None, 7.0, now=120.0)
    assert (limits.initial_heartbeat, limits.heartbeat, limits.heartbeat_set_at) == (None, 7.0, 120.0)
    limits.set_sections({"step": None}, 130.0)
    assert (limits.sections, limits.out_of_section, limits.sections_set_at) == ([1, None], 3, 130.0)
    limits.set_sections({}, 140.0, out_of_section=None)
    assert limits.out_of_section is None and limits.sections_set_at == 140.0
    with pytest.raises(ValueError, match="unknown section.*nope.*configured: setup, step"):
        limits.set_sections({"nope": 1, "step": 9}, 150.0)
    assert limits.sections == [1, None] and limits.sections_set_at == 140.0  # unchanged


# ---------------------------------------------------------------------- exactness


times = st.floats(min_value=0.0, max_value=1000.0)
limits_values = st.none() | st.floats(min_value=MIN_LOOK_AGAIN, max_value=500.0)


@st.composite
def states(draw):
    limits = RankTimeouts(
        connected_at=draw(st.floats(min_value=1.0, max_value=500.0)), initial_heartbeat=draw(limits_values),
        heartbeat=draw(limits_values), section_names=NAMES, sections=[draw(limits_values), draw(limits_values)],
        out_of_section=draw(limits_values), heartbeat_set_at=draw(st.just(0.0) | times),
        sections_set_at=draw(st.just(0.0) | times),
    )
    now = draw(st.floats(min_value=limits.connected_at, max_value=limits.connected_at + 500.0))
    before_now = st.floats(min_value=limits.connected_at, max_value=now)
    opened = (draw(st.just(0.0) | before_now), draw(st.just(0.0) | before_now))
    slot = SlotReading(
        last_heartbeat=draw(st.just(0.0) | before_now),
        last_section_activity=max(opened) if any(opened) else draw(st.just(0.0) | before_now),
        out_of_section_since=0.0 if any(opened) else draw(before_now),
        sections_open_since=opened,
    )
    return limits, slot, now


def _after(slot: SlotReading, event: str, t: float) -> SlotReading:
    if event == "heartbeat":
        return dataclasses.replace(slot, last_heartbeat=t)
    if event in ("open setup", "open step"):
        opened = list(slot.sections_open_since)
        opened[NAMES.index(event.split()[1])] = t
        return SlotReading(slot.last_heartbeat, t, 0.0, tuple(opened))
    # close every open section
    return SlotReading(slot.last_heartbeat, t, t if any(slot.sections_open_since) else slot.out_of_section_since,
                       (0.0, 0.0))


@settings(max_examples=500, deadline=None)
@given(states(), st.sampled_from(["heartbeat", "open setup", "open step", "close all"]), st.floats(0.0, 1.0))
def test_sleeping_until_wake_at_never_misses_a_deadline_the_rank_creates(state, event, fraction):
    """Whatever the rank does while the monitor sleeps, no deadline falls before the wake-up."""
    limits, slot, now = state
    verdict = check(limits, slot, now)
    if verdict.hang is not None:
        return
    horizon = verdict.wake_at if verdict.wake_at is not None else now + 1000.0
    t = now + fraction * (horizon - now)
    if t >= horizon:
        return
    new = earliest_deadline(limits, _after(slot, event, t))
    if new is not None and verdict.wake_at is not None:
        assert new.when >= verdict.wake_at
    if verdict.wake_at is None:
        assert new is None or new.when >= horizon
