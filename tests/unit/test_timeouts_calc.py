"""TimeoutsCalc (the reference's API), the timeout value types, and the client's bounds.

Every expected number below is worked out by hand in the case's comment.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Sequence
from typing import Optional

import pytest

from ft_core.client.timeout_bounds import bound_calculated_timeout
from ft_core.client.timeouts_calc import UNOBSERVED, TimeoutsCalc, TimeoutsCalcError
from ft_core.wire.config import MAX_SECONDS
from ft_core.wire.data import HeartbeatTimeouts, SectionAction, SectionTimeouts

OPEN, CLOSE, CLOSE_ALL = SectionAction.OPEN, SectionAction.CLOSE, SectionAction.CLOSE_ALL


def replay(calc: TimeoutsCalc, events: Sequence[tuple]) -> TimeoutsCalc:
    """Apply ``(time, "hb")``, ``(time, "bump")`` and ``(time, action, section)`` events."""
    for event in events:
        if event[1] == "hb":
            calc.update_on_heartbeat(event[0])
        elif event[1] == "bump":
            calc.maybe_bump_oos_time(event[0])
        else:
            calc.update_on_section_event(event[2], event[1], event[0])
    return calc


# ---------------------------------------------------------------------- heartbeats

@pytest.mark.parametrize(("start", "factor", "heartbeats", "expected"), [
    # initial = 5 x (2 - 0) = 10; subsequent = 5 x max(3 - 2, 7 - 3) = 20
    pytest.param(0.0, 5.0, [2.0, 3.0, 7.0], (10.0, 20.0), id="reference-example"),
    # initial = 2 x 3 = 6; subsequent = 2 x max(1, 2.5, 0.5) = 5
    pytest.param(100.0, 2.0, [103.0, 104.0, 106.5, 107.0], (6.0, 5.0), id="longest-gap"),
    # a gap shorter than an earlier one does not lower the maximum: 3 x max(4, 1) = 12
    pytest.param(0.0, 3.0, [1.0, 5.0, 6.0], (3.0, 12.0), id="max-not-last"),
    # no floor: 5 x 0.002 = 0.01, 5 x 0.001 = 0.005
    pytest.param(0.0, 5.0, [0.002, 0.003], (0.01, 0.005), id="no-floor"),
])
def test_heartbeat_timeouts(start, factor, heartbeats, expected):
    calc = replay(TimeoutsCalc(start_time=start, safety_factor=factor), [(t, "hb") for t in heartbeats])
    assert calc.can_get_hb_timeouts()
    timeouts = calc.get_hb_timeouts()
    assert (timeouts.initial, timeouts.subsequent) == pytest.approx(expected)
    assert timeouts.were_calculated is True and timeouts.are_valid
    assert calc.count == len(heartbeats)


@pytest.mark.parametrize("heartbeats", [
    pytest.param([], id="none"),
    pytest.param([4.0], id="one"),  # an initial interval but no subsequent one
    pytest.param([1.0, 1.0], id="zero-gap"),  # would give a zero timeout
])
def test_heartbeat_timeouts_need_two_heartbeats(heartbeats):
    calc = replay(TimeoutsCalc(start_time=0.0), [(t, "hb") for t in heartbeats])
    assert not calc.can_get_hb_timeouts()
    with pytest.raises(TimeoutsCalcError, match="two heartbeats"):
        calc.get_hb_timeouts()


@pytest.mark.parametrize(("current", "expected"), [
    # observed: initial 5 x 2 = 10, subsequent 5 x 4 = 20
    pytest.param(None, (10.0, 20.0), id="no-current"),
    pytest.param(HeartbeatTimeouts(60.0, 30.0, False), (10.0, 20.0), id="configured-is-replaced"),
    pytest.param(HeartbeatTimeouts(None, None, False), (10.0, 20.0), id="infinite-is-replaced"),
    # EMA, alpha 0.5: (60 + 10) / 2 = 35, (30 + 20) / 2 = 25
    pytest.param(HeartbeatTimeouts(60.0, 30.0, True), (35.0, 25.0), id="calculated-is-averaged"),
])
def test_heartbeat_timeouts_merge_with_current(current, expected):
    calc = replay(TimeoutsCalc(start_time=0.0), [(2.0, "hb"), (3.0, "hb"), (7.0, "hb")])
    merged = calc.get_hb_timeouts(current=current)
    assert (merged.initial, merged.subsequent) == pytest.approx(expected)
    assert merged.were_calculated is True


def test_times_default_to_now():
    before = time.monotonic()
    assert before <= TimeoutsCalc().start_time <= time.monotonic()
    calc = TimeoutsCalc(start_time=time.monotonic() - 2.0)  # as if created 2 s ago
    calc.update_on_heartbeat()
    assert 2.0 <= calc.initial_max_time < 60.0
    calc.maybe_bump_oos_time()
    assert 2.0 <= calc.out_of_section_max_time < 60.0  # counted from start_time


# ---------------------------------------------------------------------- sections

SECTION_CASES = [
    # step: 2 x max(4 - 1, 7 - 6) = 6; out of section: 2 x max(1 - 0, 6 - 4) = 4
    pytest.param(["step"], 2.0, [(1, OPEN, "step"), (4, CLOSE, "step"), (6, OPEN, "step"), (7, CLOSE, "step")],
                 None, True, {"step": 6.0}, 4.0, id="one-section"),
    # nested: inner 1 x (4 - 3) = 1, outer 1 x (10.5 - 0.5) = 10; out of section only while
    # nothing is open (not 0..3 when inner opens): max(0.5 - 0, 12 - 10.5) = 1.5
    pytest.param(["outer", "inner"], 1.0,
                 [(0.5, OPEN, "outer"), (3, OPEN, "inner"), (4, CLOSE, "inner"), (10.5, CLOSE, "outer"),
                  (12, OPEN, "inner")],
                 None, True, {"outer": 10.0, "inner": 1.0}, 1.5, id="nested"),
    # overlapping: a = max(3 - 1, 11 - 10) = 2, b = 6 - 2 = 4; out of section max(1, 10 - 6) = 4
    pytest.param(["a", "b"], 1.0,
                 [(1, OPEN, "a"), (2, OPEN, "b"), (3, CLOSE, "a"), (6, CLOSE, "b"), (10, OPEN, "a"),
                  (11, CLOSE, "a")],
                 None, True, {"a": 2.0, "b": 4.0}, 4.0, id="overlapping"),
    # CLOSE_ALL at 5 closes a (5 - 1 = 4) and b (5 - 2 = 3); then a 8..9 (1);
    # a = 5 x 4 = 20, b = 5 x 3 = 15, out of section 5 x max(1, 8 - 5) = 15
    pytest.param(["a", "b"], 5.0,
                 [(1, OPEN, "a"), (2, OPEN, "b"), (5, CLOSE_ALL, None), (8, OPEN, "a"), (9, CLOSE, "a")],
                 None, True, {"a": 20.0, "b": 15.0}, 15.0, id="close-all"),
    # only the selected section: b comes back None (no current); out of section not calculated
    pytest.param(["a", "b"], 3.0,
                 [(1, OPEN, "a"), (2, CLOSE, "a")],
                 ["a"], False, {"a": 3.0, "b": None}, None, id="selected-only"),
    # an empty selection calculates nothing but the out-of-section time: 2 x 1 = 2
    pytest.param(["a"], 2.0, [(1, OPEN, "a")], [], True, {"a": None}, 2.0, id="out-of-section-only"),
    # no floor: 5 x 0.001 = 0.005
    pytest.param(["a"], 5.0, [(0.001, OPEN, "a"), (0.002, CLOSE, "a")], None, True,
                 {"a": 0.005}, 0.005, id="no-floor"),
]


@pytest.mark.parametrize(("sections", "factor", "events", "selected", "calc_oos", "expected", "oos"),
                         SECTION_CASES)
def test_section_timeouts(sections, factor, events, selected, calc_oos, expected, oos):
    calc = replay(TimeoutsCalc(sections, start_time=0.0, safety_factor=factor), events)
    assert calc.can_get_section_timeouts(selected, calc_oos)
    timeouts = calc.get_section_timeouts(selected, calc_oos)
    assert timeouts.section == pytest.approx(expected)
    assert timeouts.out_of_section == (None if oos is None else pytest.approx(oos))
    chosen = set(sections if selected is None else selected)
    assert timeouts.calculated_sections == chosen
    assert timeouts.is_out_of_section_calculated is calc_oos
    assert timeouts.were_calculated is (chosen == set(sections) and calc_oos)


@pytest.mark.parametrize(("events", "oos_max"), [
    # the running interval counts as if it ended at 10: max(1 - 0, 10 - 2) = 8
    pytest.param([(1, OPEN, "a"), (2, CLOSE, "a"), (10, "bump")], 8.0, id="after-last-close"),
    # a section is open: nothing to count; only 0..1 was out of section
    pytest.param([(1, OPEN, "a"), (50, "bump")], 1.0, id="while-open"),
    # the interval keeps running after a bump: 12 - 2 = 10 when a opens
    pytest.param([(1, OPEN, "a"), (2, CLOSE, "a"), (5, "bump"), (12, OPEN, "a")], 10.0, id="keeps-running"),
    # a later, shorter bump does not lower the maximum
    pytest.param([(9, "bump"), (4, "bump")], 9.0, id="max-kept"),
    # before any section: counted from start_time
    pytest.param([(4, "bump")], 4.0, id="from-start"),
])
def test_maybe_bump_oos_time(events, oos_max):
    calc = replay(TimeoutsCalc(["a"], start_time=0.0, safety_factor=1.0), events)
    assert calc.out_of_section_max_time == oos_max
    assert calc.get_section_timeouts([], calc_out_of_section=True).out_of_section == oos_max


# Observed with factor 1: a = 4 (0..4), c = 6 (5..11), out of section = 1 (4..5); b never.
MERGE_EVENTS = [(0, OPEN, "a"), (4, CLOSE, "a"), (5, OPEN, "c"), (11, CLOSE, "c")]
CURRENT = SectionTimeouts(section={"a": 10.0, "b": 20.0, "c": 30.0}, out_of_section=40.0,
                          calculated_sections={"a", "b"}, is_out_of_section_calculated=True)


@pytest.mark.parametrize(("selected", "calc_oos", "current", "expected", "calculated", "oos", "oos_calculated"), [
    # a: calculated in both -> (10 + 4) / 2 = 7; c: current configured -> replaced by 6;
    # b: calculated before, not now -> kept (20, still calculated); out of section (40 + 1) / 2
    pytest.param(["a", "c"], True, CURRENT, {"a": 7.0, "b": 20.0, "c": 6.0}, {"a", "b", "c"}, 20.5, True,
                 id="ema-replace-keep"),
    # out of section not recalculated: current's value and flag kept
    pytest.param(["c"], False, CURRENT, {"a": 10.0, "b": 20.0, "c": 6.0}, {"a", "b", "c"}, 40.0, True,
                 id="oos-kept"),
    # nothing calculated before: new values replace, the others are current's (configured)
    pytest.param(["a"], True, SectionTimeouts({"a": 600.0, "b": None, "c": 600.0}, 900.0),
                 {"a": 4.0, "b": None, "c": 600.0}, {"a"}, 1.0, True, id="configured-replaced"),
    # configured out-of-section value, not recalculated: kept, not calculated
    pytest.param(["a"], False, SectionTimeouts({"a": 600.0, "b": None, "c": 600.0}, 900.0),
                 {"a": 4.0, "b": None, "c": 600.0}, {"a"}, 900.0, False, id="configured-oos-kept"),
    # no current: unselected sections are None
    pytest.param(["c"], False, None, {"a": None, "b": None, "c": 6.0}, {"c"}, None, False, id="no-current"),
])
def test_section_timeouts_merge_with_current(selected, calc_oos, current, expected, calculated, oos,
                                             oos_calculated):
    calc = replay(TimeoutsCalc(["a", "b", "c"], start_time=0.0, safety_factor=1.0), MERGE_EVENTS)
    before = copy.deepcopy(current)
    merged = calc.get_section_timeouts(selected, calc_oos, current=current)
    assert current == before  # current is not modified
    assert merged.section == expected
    assert merged.calculated_sections == calculated
    assert merged.out_of_section == oos
    assert merged.is_out_of_section_calculated is oos_calculated


def test_were_calculated_once_every_value_was():
    calc = replay(TimeoutsCalc(["a", "b", "c"], start_time=0.0), MERGE_EVENTS)
    merged = calc.get_section_timeouts(["a", "c"], True, current=CURRENT)
    assert merged.were_calculated  # b was calculated before
    assert not calc.get_section_timeouts(["a", "c"], True).were_calculated  # b never


# ---------------------------------------------------------------------- errors

@pytest.mark.parametrize(("events", "message"), [
    pytest.param([(1, OPEN, "nope")], "unknown section 'nope'", id="open-unknown"),
    pytest.param([(1, CLOSE, "nope")], "unknown section 'nope'", id="close-unknown"),
    pytest.param([(1, CLOSE_ALL, "nope")], "unknown section 'nope'", id="close-all-unknown"),
    pytest.param([(1, OPEN, None)], "unknown section None", id="open-none"),
    pytest.param([(1, OPEN, "a"), (2, OPEN, "a")], "'a' is already open", id="open-open"),
    pytest.param([(1, CLOSE, "a")], "'a' is not open", id="close-never-opened"),
    pytest.param([(1, OPEN, "a"), (2, CLOSE, "a"), (3, CLOSE, "a")], "'a' is not open", id="close-closed"),
    pytest.param([(1, "open", "a")], "unknown section action", id="not-an-action"),
])
def test_section_event_errors(events, message):
    calc = TimeoutsCalc(["a"], start_time=0.0)
    with pytest.raises(TimeoutsCalcError, match=message):
        replay(calc, events)


def test_a_refused_event_changes_nothing():
    calc = replay(TimeoutsCalc(["a"], start_time=0.0), [(1, OPEN, "a")])
    with pytest.raises(TimeoutsCalcError):
        calc.update_on_section_event("a", OPEN, 2)
    assert calc.open_sections == {"a": 1}
    calc.update_on_section_event(None, CLOSE_ALL, 3)  # closes a: 3 - 1 = 2
    calc.update_on_section_event(None, CLOSE_ALL, 4)  # nothing open: does nothing
    assert calc.section_to_max_time == {"a": 2} and calc.last_section_close_time == 3


@pytest.mark.parametrize(("selected", "calc_oos", "message"), [
    pytest.param(["b"], False, "not enough data .*: b ", id="section"),
    pytest.param(["a", "b"], True, "not enough data .*: b, out-of-section ", id="section-and-oos"),
    pytest.param(None, False, "not enough data .*: b ", id="default-is-all"),
    pytest.param(["nope"], False, "unknown section 'nope'", id="unknown"),
    pytest.param("a", False, "collection of names", id="a-string"),
])
def test_section_timeouts_need_data(selected, calc_oos, message):
    calc = replay(TimeoutsCalc(["a", "b"], start_time=0.0), [(0, OPEN, "a"), (1, CLOSE, "a")])
    with pytest.raises(TimeoutsCalcError, match=message):
        calc.get_section_timeouts(selected, calc_oos)
    if message.startswith("not enough"):
        assert calc.can_get_section_timeouts(selected, calc_oos) is False
    else:
        with pytest.raises(TimeoutsCalcError, match=message):
            calc.can_get_section_timeouts(selected, calc_oos)


# ---------------------------------------------------------------------- all ranks

class ThreadRanks:
    """A :class:`~ft_core.client.collectives.Collectives` over threads of this process, one per rank:
    every rank's ``all_max`` waits for all ranks, then returns the element-wise maximum."""

    def __init__(self, world_size: int) -> None:
        self._barrier = threading.Barrier(world_size, timeout=10)
        self._values: dict[int, list[float]] = {}

    def for_rank(self, rank: int) -> _RankView:
        return _RankView(self, rank)


class _RankView:
    def __init__(self, ranks: ThreadRanks, rank: int) -> None:
        self._ranks, self._rank = ranks, rank

    def world_size(self) -> int:
        return self._ranks._barrier.parties

    def rank(self) -> int:
        return self._rank

    def all_true(self, flags: Sequence[bool]) -> list[bool]:
        raise AssertionError("the calculator only needs all_max")

    def broadcast_text(self, text: Optional[str]) -> Optional[str]:
        raise AssertionError("the calculator only needs all_max")

    def all_max(self, values: Sequence[float]) -> list[float]:
        ranks = self._ranks
        ranks._values[self._rank] = list(values)
        ranks._barrier.wait()
        result = [max(column) for column in zip(*ranks._values.values(), strict=True)]
        ranks._barrier.wait()  # nobody overwrites its values before all have read them
        return result


def synchronize(calcs: list[TimeoutsCalc]) -> None:
    ranks = ThreadRanks(len(calcs))
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            calcs[rank].synchronize_all(ranks.for_rank(rank))
        except BaseException as err:  # reported below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(calcs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not errors and not any(t.is_alive() for t in threads)


def test_synchronize_all_gives_every_rank_the_longest_intervals():
    sections = ["a", "b", "never"]
    # rank 0: initial 1, subsequent 3, a 2, out of section 4 (2..6)
    rank0 = replay(TimeoutsCalc(sections, start_time=0.0, safety_factor=2.0),
                   [(1, "hb"), (4, "hb"), (0, OPEN, "a"), (2, CLOSE, "a"), (6, OPEN, "b"), (7, CLOSE, "b")])
    # rank 1: initial 2, subsequent 1, b 5, out of section 1 (0..1)
    rank1 = replay(TimeoutsCalc(sections, start_time=0.0, safety_factor=2.0),
                   [(2, "hb"), (3, "hb"), (1, OPEN, "b"), (6, CLOSE, "b")])
    # rank 2 observed nothing at all
    rank2 = TimeoutsCalc(sections, start_time=0.0, safety_factor=2.0)
    calcs = [rank0, rank1, rank2]
    synchronize(calcs)
    for calc in calcs:
        hb = calc.get_hb_timeouts()
        assert (hb.initial, hb.subsequent) == (4.0, 6.0)  # 2 x max(1, 2), 2 x max(3, 1)
        st = calc.get_section_timeouts(["a", "b"], True)
        assert st.section == {"a": 4.0, "b": 10.0, "never": None}  # 2 x 2, 2 x max(1, 5)
        assert st.out_of_section == 8.0  # 2 x max(4, 1)
        # observed on no rank: still not observed
        assert calc.section_to_max_time["never"] == UNOBSERVED
        assert not calc.can_get_section_timeouts(["never"], False)


def test_synchronize_all_when_no_rank_observed_anything():
    calcs = [TimeoutsCalc(["a"], start_time=0.0) for _ in range(2)]
    synchronize(calcs)
    for calc in calcs:
        assert not calc.can_get_hb_timeouts()
        assert not calc.can_get_section_timeouts(["a"], False)
        assert not calc.can_get_section_timeouts([], True)


def test_synchronize_all_without_a_process_group_keeps_local_values():
    calc = replay(TimeoutsCalc(start_time=0.0), [(1.0, "hb"), (3.0, "hb")])
    calc.synchronize_all()  # the default collectives: no process group, nothing to do
    assert (calc.initial_max_time, calc.subsequent_max_time) == (1.0, 2.0)


# ---------------------------------------------------------------------- value types

def test_timeout_value_types():
    assert HeartbeatTimeouts() == HeartbeatTimeouts(None, None, False)
    assert not HeartbeatTimeouts(10.0, None).are_valid and HeartbeatTimeouts(10.0, 1.0).are_valid
    st = SectionTimeouts({"step": 5.0, "setup": None}, 30.0, ["step", "step"], True)
    assert st.calculated_sections == {"step"}  # any collection becomes a set
    assert not st.are_valid and not st.were_calculated
    assert SectionTimeouts({"step": 5.0}, 1.0).are_valid
    assert SectionTimeouts({"step": 5.0}, 1.0, {"step"}, True).were_calculated
    assert not SectionTimeouts({"step": 5.0}, 1.0, {"step"}, False).were_calculated
    assert SectionTimeouts({}, 1.0, (), True).were_calculated
    with pytest.raises(TypeError, match="collection of names"):
        SectionTimeouts({"step": 5.0}, calculated_sections="step")


def test_timeouts_state_round_trip():
    hb = HeartbeatTimeouts(12.0, 3.0, True)
    st = SectionTimeouts({"step": 5.0, "setup": None}, 30.0, {"step", "setup"}, True)
    assert HeartbeatTimeouts.from_dict(hb.to_dict()) == hb
    assert SectionTimeouts.from_dict(st.to_dict()) == st
    assert st.to_dict()["calculated_sections"] == ["setup", "step"]  # JSON: a sorted list
    # a state written by the earlier code (no optional keys)
    assert SectionTimeouts.from_dict({"section": {"step": 7}}) == SectionTimeouts({"step": 7.0})


@pytest.mark.parametrize(("data", "fragment"), [
    ([], "mapping"),
    ({"initial": "12"}, "hb_timeouts.initial must be a number of seconds or null, got '12'"),
    ({"subsequent": -1}, "hb_timeouts.subsequent must be a number of seconds > 0"),
    ({"subsequent": math.inf}, "hb_timeouts.subsequent"),
    ({"initial": 10**400}, "hb_timeouts.initial"),
    ({"initial": MAX_SECONDS * 2}, "<= 1e+06"),
    ({"were_calculated": "yes"}, "were_calculated"),
])
def test_heartbeat_state_schema_errors(data, fragment):
    with pytest.raises(ValueError, match=fragment.replace("+", r"\+")):
        HeartbeatTimeouts.from_dict(data)


def test_section_state_schema_errors():
    with pytest.raises(ValueError, match="section_timeouts.section"):
        SectionTimeouts.from_dict({"section": [1]})
    with pytest.raises(ValueError, match=r"section_timeouts.section\[step\]"):
        SectionTimeouts.from_dict({"section": {"step": 0}})
    with pytest.raises(ValueError, match="calculated_sections"):
        SectionTimeouts.from_dict({"calculated_sections": "step"})


# ---------------------------------------------------------------------- the client's bounds

@pytest.mark.parametrize(("seconds", "minimum", "expected"), [
    (0.004, 1.0, 1.0),
    (5.0, 1.0, 5.0),
    (3.0, 60.0, 60.0),
    (125.0, 60.0, 125.0),
    (2 * MAX_SECONDS, 1.0, MAX_SECONDS),
])
def test_the_client_bounds_calculated_timeouts(seconds, minimum, expected):
    assert bound_calculated_timeout(seconds, minimum) == expected
