"""What ``RankMonitorClient.state_dict()`` holds, and how ``load_state_dict()`` reads it.

Pure functions over plain values: the client's state is its calculated timeouts, as
``{"version": 1, "hb_timeouts": {...}, "section_timeouts": {...}}`` (the fields of
:class:`~ft_core.wire.data.HeartbeatTimeouts` and :class:`~ft_core.wire.data.SectionTimeouts`). A state
saved by the reference's client, ``{"current_timeouts": {"heartbeat": ..., "section": ...}}``,
is read too. Only calculated timeouts are restored: configured ones come from the config.

Where the state is stored between runs is :mod:`ft_core.client.state_file`'s concern.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple, Optional

from ft_core.wire.data import HeartbeatTimeouts, SectionTimeouts

STATE_DICT_VERSION = 1
HB_TIMEOUTS_KEY = "hb_timeouts"
SECTION_TIMEOUTS_KEY = "section_timeouts"
REFERENCE_STATE_KEY = "current_timeouts"  # where the reference's state_dict() keeps its timeouts


class LoadedState(NamedTuple):
    """A parsed state: the timeouts as saved (calculated or not)."""

    hb: HeartbeatTimeouts
    sections: SectionTimeouts


def make_state_dict(hb: HeartbeatTimeouts, sections: SectionTimeouts) -> dict[str, Any]:
    """The JSON-serialisable state of a client with these timeouts."""
    return {
        "version": STATE_DICT_VERSION,
        HB_TIMEOUTS_KEY: hb.to_dict(),
        SECTION_TIMEOUTS_KEY: sections.to_dict(),
    }


def parse_state_dict(state: Any) -> LoadedState:
    """Read a state saved by :func:`make_state_dict` (or by the reference's client).

    Raises:
        ValueError: The state has the wrong schema (the message names the key).
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict, got {type(state).__name__}")
    if REFERENCE_STATE_KEY in state:
        state = _from_reference_layout(state)
    version = state.get("version", STATE_DICT_VERSION)
    if version != STATE_DICT_VERSION:
        raise ValueError(f"unsupported state version {version!r}")
    return LoadedState(
        HeartbeatTimeouts.from_dict(state.get(HB_TIMEOUTS_KEY, {})),
        SectionTimeouts.from_dict(state.get(SECTION_TIMEOUTS_KEY, {})),
    )


def restored_hb_timeouts(loaded: LoadedState) -> Optional[HeartbeatTimeouts]:
    """The heartbeat timeouts to apply from ``loaded``, or None (nothing was calculated)."""
    return loaded.hb if loaded.hb.were_calculated else None


def restored_section_timeouts(
    loaded: LoadedState, current: SectionTimeouts, known_sections: Collection[str],
) -> Optional[SectionTimeouts]:
    """``current`` with the calculated timeouts of ``loaded`` in place, or None (nothing to restore).

    Only sections in ``known_sections`` (configured on the monitor) are taken; the out-of-section
    timeout only if it was calculated.
    """
    sections = loaded.sections
    calculated = [s for s in sections.calculated_sections if s in known_sections]
    if not calculated and not sections.is_out_of_section_calculated:
        return None
    merged = dict(current.section)
    for name in calculated:
        merged[name] = sections.section.get(name)
    return SectionTimeouts(
        section=merged,
        out_of_section=(sections.out_of_section if sections.is_out_of_section_calculated
                        else current.out_of_section),
        calculated_sections=calculated,
        is_out_of_section_calculated=sections.is_out_of_section_calculated,
    )


def _from_reference_layout(state: dict[str, Any]) -> dict[str, Any]:
    # Same fields under other keys; the reference writes only calculated timeouts.
    if set(state) != {REFERENCE_STATE_KEY}:
        raise ValueError(f"a state with {REFERENCE_STATE_KEY!r} must have no other key, got {sorted(state)}")
    timeouts = state[REFERENCE_STATE_KEY]
    if not isinstance(timeouts, dict):
        raise ValueError(f"{REFERENCE_STATE_KEY} must be a mapping, got {type(timeouts).__name__}")
    return {HB_TIMEOUTS_KEY: timeouts.get("heartbeat", {}), SECTION_TIMEOUTS_KEY: timeouts.get("section", {})}
