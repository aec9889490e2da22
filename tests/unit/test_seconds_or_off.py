"""One validator for "seconds, 0 means off" (issue 20.7): ft_core.wire.config_values.parse_seconds_or_off.

The launcher's ``--term-timeout``-style options (0: at once) and ``store_lost_timeout`` (0: off)
take the same values as the monitor's ``stack_capture_budget`` (0: off): this validator says
which, with the same words, whoever calls it.
"""

from __future__ import annotations

import pytest

from ft_core.wire.config_values import (
    MAX_SECONDS,
    ConfigError,
    parse_seconds_or_off,
    seconds_or_off_bounds,
)


@pytest.mark.parametrize(("raw", "expected"), [(0, 0.0), ("0", 0.0), ("0.0", 0.0), (" 2.5 ", 2.5), (7, 7.0),
                                               (MAX_SECONDS, MAX_SECONDS)])
def test_zero_and_positive_seconds_up_to_the_common_maximum(raw, expected):
    assert parse_seconds_or_off("--term-timeout", raw) == expected


@pytest.mark.parametrize("raw", [-1, "-0.5", "nan", "inf", None, True, "soon", MAX_SECONDS * 2])
def test_anything_else_names_the_field_echoes_the_value_and_says_what_zero_does(raw):
    with pytest.raises(ConfigError) as caught:
        parse_seconds_or_off("--term-timeout", raw, zero_means="at once")
    assert str(caught.value) == (f"--term-timeout must be 0 (at once) or seconds > 0 and <= {MAX_SECONDS:g}, "
                                 f"got {raw!r}")


def test_the_bounds_in_words_default_to_off():
    assert seconds_or_off_bounds(60) == "0 (off) or seconds > 0 and <= 60"
    with pytest.raises(ConfigError, match=r"store_lost_timeout must be 0 \(off\) or seconds > 0 and <= 86400"):
        parse_seconds_or_off("store_lost_timeout", "90000", maximum=86400)
