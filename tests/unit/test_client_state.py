"""The client's state dict as pure functions (no monitor): layout, parsing, what is restored."""

import pytest

from ft_core.client import state as client_state
from ft_core.wire.data import HeartbeatTimeouts, SectionTimeouts

CONFIGURED = SectionTimeouts(section={"setup": 600.0, "step": 60.0}, out_of_section=300.0)


def test_a_state_dict_parses_back_to_the_same_timeouts():
    hb = HeartbeatTimeouts(120.0, 30.0, were_calculated=True)
    sections = SectionTimeouts(section={"step": 12.0}, out_of_section=40.0, calculated_sections=["step"],
                               is_out_of_section_calculated=True)
    state = client_state.make_state_dict(hb, sections)
    assert state["version"] == client_state.STATE_DICT_VERSION
    loaded = client_state.parse_state_dict(state)
    assert loaded.hb.to_dict() == hb.to_dict() and loaded.sections.to_dict() == sections.to_dict()


@pytest.mark.parametrize("state, fragment", [
    ([], "must be a dict"),
    ({"version": 2}, "unsupported state version 2"),
    ({"current_timeouts": {}, "version": 1}, "no other key"),
    ({"current_timeouts": [1]}, "must be a mapping"),
])
def test_a_wrong_schema_is_a_value_error_naming_it(state, fragment):
    with pytest.raises(ValueError, match=fragment):
        client_state.parse_state_dict(state)


@pytest.mark.parametrize("saved, expected", [
    # nothing calculated: nothing restored
    (SectionTimeouts(section={"step": 5.0}), None),
    # a calculated section replaces the configured one; the others stay
    (SectionTimeouts(section={"step": 5.0}, calculated_sections=["step"]),
     ({"setup": 600.0, "step": 5.0}, 300.0, {"step"}, False)),
    # a section the monitor does not know is left out; a calculated out-of-section time is taken
    (SectionTimeouts(section={"other": 5.0}, out_of_section=7.0, calculated_sections=["other"],
                     is_out_of_section_calculated=True),
     ({"setup": 600.0, "step": 60.0}, 7.0, set(), True)),
])
def test_only_calculated_timeouts_of_known_sections_are_restored(saved, expected):
    loaded = client_state.LoadedState(HeartbeatTimeouts(), saved)
    restored = client_state.restored_section_timeouts(loaded, CONFIGURED, {"setup", "step"})
    if expected is None:
        assert restored is None
    else:
        section, out_of_section, calculated, oos_calculated = expected
        assert (restored.section, restored.out_of_section) == (section, out_of_section)
        assert (set(restored.calculated_sections), restored.is_out_of_section_calculated) == (calculated,
                                                                                             oos_calculated)


def test_heartbeat_timeouts_are_restored_only_when_calculated():
    configured = client_state.LoadedState(HeartbeatTimeouts(100.0, 10.0), SectionTimeouts())
    calculated = client_state.LoadedState(HeartbeatTimeouts(100.0, 10.0, were_calculated=True), SectionTimeouts())
    assert client_state.restored_hb_timeouts(configured) is None
    assert client_state.restored_hb_timeouts(calculated) is calculated.hb
