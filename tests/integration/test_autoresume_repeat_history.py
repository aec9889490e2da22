"""A launcher that stopped a crash loop (exit 66) leaves a failed attempt in ``node_history.tsv``.

``autoresume.sh`` stops on 66 without counting a failure; before, the attempt's row said
``clean`` and named no root node, so the node the failure came from had no record of it (a later
submission could not count it) and the stop counted as a clean attempt toward letting excluded
nodes back. Real ``autoresume.sh`` and ``launcher.resume`` with a scripted launcher.
"""

from __future__ import annotations

import pytest

from launcher import exit_codes
from launcher.resume.history import read_node_history
from tests.integration.test_autoresume_local import FP_A, LocalRun, local_run, scripted  # noqa: F401 (fixture)

pytestmark = [pytest.mark.timeout(120)]


def test_exit_66_is_recorded_as_a_failure_with_its_root_node(local_run: LocalRun) -> None:  # noqa: F811
    launcher = scripted(local_run, f"66 {FP_A} h1", "0 -")
    rc = local_run.run("--launcher", launcher, behaviour=["finish"])

    assert rc == exit_codes.EXIT_REPEATED_FAILURE, local_run.output()
    rows = [(r.attempt, r.node, r.kind, r.fingerprint) for r in read_node_history(str(local_run.run_dir))]
    assert rows == [(1, "-", "failed", FP_A), (1, "h1", "root", FP_A), (1, "-", "stop", "-")], rows
