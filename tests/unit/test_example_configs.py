"""The example config files (examples/configs/) keep a run quiet: issue 29 item 10.

With ``log_level: DEBUG`` in sections.yaml every rank printed a ~500-character "section timeouts
calculated, no significant change" line at every checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ft_core.wire.config import FaultToleranceConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "examples" / "configs").glob("*.yaml"))


def test_there_are_example_configs():
    assert {path.name for path in CONFIGS} >= {"heartbeats.yaml", "sections.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_an_example_config_logs_at_info(path):
    assert FaultToleranceConfig.from_yaml_file(path).log_level == logging.INFO


class RecordingLog:
    """Stands in for the rank logger: keeps (level, message) pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def rank_zero_info(self, message: str, *args: object) -> None:
        self.lines.append(("INFO", message % args))

    def debug(self, message: str, *args: object) -> None:
        self.lines.append(("DEBUG", message % args))


def test_the_no_change_line_after_a_calculation_is_short_and_debug():
    from ft_core.client.timeout_bounds import CalculatedMinimums, InForceLog
    from ft_core.wire.data import SectionTimeouts

    log = RecordingLog()
    in_force = InForceLog(log, CalculatedMinimums())
    sections = {f"section_{i}": 60.0 for i in range(8)}  # many sections: the full text is long
    for _ in range(2):  # the same timeouts twice: the second calculation changed nothing
        in_force.sections(SectionTimeouts(section=dict(sections), out_of_section=120.0,
                                          calculated_sections=set(sections)), {}, "calculated")
    (first_level, first), (level, line) = log.lines
    assert first_level == "INFO" and len(first) > 300  # what is in force: said once, in full
    assert level == "DEBUG" and len(line) < 100 and "no significant change" in line, line
