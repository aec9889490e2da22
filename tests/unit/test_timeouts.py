"""TimeoutsCalc arithmetic and the (de)serialisation of timeout state."""

import pytest

from ft_core.errors import TimeoutsCalcError
from ft_core.timeouts import (
    MIN_CALCULATED_TIMEOUT,
    HeartbeatTimeouts,
    SectionTimeouts,
    TimeoutsCalc,
    blend,
)


def test_heartbeat_timeouts_need_two_heartbeats():
    calc = TimeoutsCalc(safety_factor=2.0, start_time=100.0)
    assert not calc.can_get_hb_timeouts()
    calc.on_heartbeat(103.0)
    assert not calc.can_get_hb_timeouts()
    with pytest.raises(TimeoutsCalcError, match="two heartbeats"):
        calc.heartbeat_timeouts()
    calc.on_heartbeat(104.0)
    calc.on_heartbeat(106.5)
    calc.on_heartbeat(107.0)
    assert calc.heartbeat_timeouts() == (6.0, 5.0)


def test_section_and_out_of_section_maxima():
    calc = TimeoutsCalc(["setup", "step"], safety_factor=3.0, start_time=0.0)
    calc.on_section_start(1.0, first_open=True)  # 1 s out of section before setup
    calc.on_section_end("setup", 9.0, 10.0, last_closed=True)
    calc.on_section_start(14.0, first_open=True)  # 4 s out of section
    calc.on_section_end("step", 2.0, 16.0, last_closed=True)
    calc.on_section_start(16.5, first_open=True)
    calc.on_section_end("step", 1.0, 17.5, last_closed=True)
    sections, oos = calc.section_timeouts(["setup", "step"], calc_out_of_section=True)
    assert sections == {"setup": 27.0, "step": 6.0}
    assert oos == 12.0


def test_nested_sections_do_not_count_as_out_of_section():
    calc = TimeoutsCalc(["outer", "inner"], start_time=0.0)
    calc.on_section_start(0.5, first_open=True)
    calc.on_section_start(1.0, first_open=False)
    calc.on_section_end("inner", 1.0, 2.0, last_closed=False)
    calc.on_section_end("outer", 10.0, 10.5, last_closed=True)
    assert calc.out_of_section_max == 0.5


def test_missing_sections_are_named():
    calc = TimeoutsCalc(["setup", "step"], start_time=0.0)
    assert calc.missing_sections(["step"], calc_out_of_section=True) == ["step", "out-of-section"]
    with pytest.raises(TimeoutsCalcError, match="step"):
        calc.section_timeouts(["step"], calc_out_of_section=False)


def test_synchronize_without_process_group_is_local():
    calc = TimeoutsCalc(start_time=0.0)
    calc.on_heartbeat(1.0)
    assert calc.synchronize_all() is False
    assert calc.initial_max == 1.0


def test_blend_is_an_ema_only_over_calculated_values():
    assert blend(None, 10.0, previous_was_calculated=False) == 10.0
    assert blend(100.0, 10.0, previous_was_calculated=False) == 10.0
    assert blend(20.0, 10.0, previous_was_calculated=True) == 15.0


def test_calculated_timeouts_have_a_floor():
    assert blend(None, 0.004, previous_was_calculated=False) == MIN_CALCULATED_TIMEOUT
    assert blend(0.5, 0.1, previous_was_calculated=True) == MIN_CALCULATED_TIMEOUT


def test_timeouts_state_round_trip():
    hb = HeartbeatTimeouts(12.0, 3.0, True)
    st = SectionTimeouts({"step": 5.0, "setup": None}, 30.0, ["step"], True)
    assert HeartbeatTimeouts.from_dict(hb.to_dict()) == hb
    assert SectionTimeouts.from_dict(st.to_dict()) == st
    assert hb.are_valid and not st.are_valid
    assert SectionTimeouts({"step": 5.0}, 1.0).are_valid


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([], "mapping"),
        ({"initial": "12"}, "hb_timeouts.initial"),
        ({"subsequent": -1}, "positive"),
        ({"were_calculated": "yes"}, "were_calculated"),
    ],
)
def test_heartbeat_state_schema_errors(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        HeartbeatTimeouts.from_dict(data)


def test_section_state_schema_errors():
    with pytest.raises(ValueError, match="section_timeouts.section"):
        SectionTimeouts.from_dict({"section": [1]})
    with pytest.raises(ValueError, match="calculated_sections"):
        SectionTimeouts.from_dict({"calculated_sections": "step"})
