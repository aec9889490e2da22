"""The argument checks every front end shares (ft_core.client.front_end): one wording everywhere."""

import pathlib

import pytest

from ft_core.client.front_end import require_bool, require_path
from ft_core.client.integration import FaultToleranceIntegration


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_require_bool_names_owner_argument_and_value(value):
    with pytest.raises(ValueError, match=rf"^Owner: flag must be True or False, got {value!r}$"):
        require_bool("Owner", "flag", value)
    require_bool("Owner", "flag", False)


def test_require_path_accepts_str_and_pathlike_and_says_when_none_is_allowed():
    require_path("Owner", "where", "/tmp")
    require_path("Owner", "where", pathlib.Path("/tmp"))
    require_path("Owner", "where", None, allow_none=True)
    with pytest.raises(ValueError, match=r"^Owner: where must be a path, got None$"):
        require_path("Owner", "where", None)
    with pytest.raises(ValueError, match=r"^Owner: where must be a path or None, got 3$"):
        require_path("Owner", "where", 3, allow_none=True)


def test_every_front_end_words_a_bad_flag_alike(tmp_path):
    from ptl_resiliency import FaultToleranceCallback, FaultToleranceSectionsCallback

    attempts = {
        "ft_core.client.integration.setup":
            lambda: FaultToleranceIntegration().setup(tmp_path, calculate_timeouts="yes"),
        "FaultToleranceCallback": lambda: FaultToleranceCallback(False, calculate_timeouts="yes"),
        "FaultToleranceSectionsCallback": lambda: FaultToleranceSectionsCallback(False, calculate_timeouts="yes"),
    }
    for owner, attempt in attempts.items():
        with pytest.raises(ValueError) as err:
            attempt()
        assert str(err.value) == f"{owner}: calculate_timeouts must be True or False, got 'yes'"
    with pytest.raises(ValueError, match=r"^FaultToleranceCallback: exp_dir must be a path or None, got 5$"):
        FaultToleranceCallback(False, False, exp_dir=5)
    with pytest.raises(ValueError, match=r"^ft_core.client.integration.setup: checkpoint_dir must be a path, got 5$"):
        FaultToleranceIntegration().setup(5)
