"""The tests .ci/run leaves out (tests/conftest.py CI_LEAVES_OUT) exist and carry the marker.

A renamed test or parameter would otherwise drop out of the list silently and run in CI again, or
an entry would name nothing. pytest collects exactly the listed ids.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CI_LEAVES_OUT

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def test_every_test_ci_leaves_out_exists_and_is_marked_extended():
    ids = sorted(CI_LEAVES_OUT)
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "extended", *ids], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = sorted(line for line in result.stdout.splitlines() if "::" in line)
    assert collected == ids, result.stdout[-3000:]
