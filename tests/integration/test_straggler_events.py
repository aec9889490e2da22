"""A rank's straggler report reaches its launcher's event log and ft_report (issue 24 item 5).

Real ft_launcher, real worker: the worker hands a flagged rank and its node to the launcher with
:func:`ft_core.client.straggler_channel.report_to_launcher`; the launcher writes one
``straggler`` record per entry, refuses a malformed report with the reason, and ft_report shows
the stragglers on its timeline and its plot.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ft_core.client.straggler_channel import report_to_launcher
from tests.launcher_util import events_of, launcher_env, read_events, run_launcher

FT_REPORT = Path(sys.executable).parent / "ft_report"

WORKER = """
import json, os, socket, sys
from ft_core.client.connection import send_to_launcher
from ft_core.client.straggler_channel import report_to_launcher

node = socket.gethostname()
rank = int(os.environ["RANK"])
entries = [
    {"scope": "rank", "rank": rank, "node": node, "relative": 0.71, "individual": 0.74, "consecutive": 2,
     "action": "report"},
    {"scope": "node", "rank": None, "node": node, "relative": 0.71, "individual": None, "consecutive": 2,
     "action": "report"},
]
delivered = report_to_launcher(entries, 30.0)
# what a buggy sender gets: the reason, and no record
refused = send_to_launcher(os.environ["FT_LAUNCHER_IPC_SOCKET"], {
    "type": "straggler_report", "interval_s": 30.0,
    "entries": [{"scope": "rank", "rank": -3, "node": node, "relative": 0.5, "individual": None}]})
json.dump({"delivered": delivered, "refused": refused}, open(sys.argv[1], "w"))
"""


def test_a_straggler_report_becomes_records_and_timeline_lines(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    events = tmp_path / "ft_events.jsonl"
    outcome = tmp_path / "outcome.json"
    out = run_launcher(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1",
                        "--ft-event-log", str(events), str(script), str(outcome)], timeout=90)
    assert out.returncode == 0, out.stderr
    sent = json.loads(outcome.read_text())
    assert sent["delivered"] is True
    assert sent["refused"]["type"] == "error" and "a rank entry needs a rank" in sent["refused"]["error"]

    records = events_of(read_events(events), "straggler")
    assert [(r["scope"], r["rank"], r["relative"], r["individual"], r["consecutive"], r["interval_s"])
            for r in records] == [("rank", 0, 0.71, 0.74, 2, 30.0), ("node", None, 0.71, None, 2, 30.0)]
    assert all(r["cycle"] == 0 and "reported_node" not in r for r in records)  # the launcher's own node
    assert "straggler: rank 0 on node" in out.stderr

    report = subprocess.run([str(FT_REPORT), str(events)], capture_output=True, text=True, timeout=60,
                            env=launcher_env())
    assert report.returncode == 0, report.stderr
    assert ("straggler: rank 0 is slow (relative score 0.71, individual score 0.74 over 30 s, flagged 2 "
            "report(s) in a row; action: report)") in report.stdout, report.stdout
    assert "straggler: node is slow (relative score 0.71 over 30 s" in report.stdout, report.stdout
    pytest.importorskip("matplotlib")
    plot = tmp_path / "timeline.png"
    drawn = subprocess.run([str(FT_REPORT), str(events), "--plot", str(plot)], capture_output=True, text=True,
                           timeout=60, env=launcher_env())
    assert drawn.returncode == 0 and plot.stat().st_size > 0, drawn.stderr


def test_outside_ft_launcher_a_report_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FT_LAUNCHER_IPC_SOCKET", raising=False)
    entry = {"scope": "rank", "rank": 0, "node": "n", "relative": 0.5, "individual": None}
    assert report_to_launcher([entry], 10.0) is False
    with pytest.raises(ValueError, match="interval_s must be a positive number"):
        report_to_launcher([entry], 0)
