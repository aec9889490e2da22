"""ft_report's cost of each failure: the step it failed in against the step the restart resumed from.

Real launchers write these records in tests/integration/test_report.py; here the arithmetic, the
sources, several nodes, and what is said when the ranks do not report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ft_core.wire import messages
from launcher.events import report
from launcher.events.failure_cost import failure_costs


def record(event: str, ts: float, node: str = "n1", **fields) -> dict:
    return {"event": event, "ts": ts, "node": node, "pid": 10, "run_id": "r1", **fields}


def failure(ts: float, cycle: int, rank: int, step: int, root: bool, kind: str = "exit", node: str = "n1") -> dict:
    fields = {"cause": "exit code 1", "cause_kind": kind} if root else \
        {"cause": "stopped after another worker failed", "cause_kind": "terminated"}
    if kind == "hang" and root:
        fields.update(cause="hang: no heartbeat", hang_kind="heartbeat")
    return record("failure", ts, node, cycle=cycle, rank=rank, local_rank=rank, role="root" if root else "collateral",
                  detected_at=ts, step=step, last_progress_at=ts, **fields)


def resumed(ts: float, cycle: int, rank: int, step: int, source: str, node: str = "n1") -> dict:
    return record("resumed", ts, node, cycle=cycle, rank=rank, local_rank=rank, step=step, source=source)


# cycle 0: 100 steps in 10 s, rank 1 crashes in step 100, rank 0 saves its state of step 100;
# cycle 1: resumes from it, 100 steps in 10 s, rank 1 hangs in step 200, nothing saved;
# cycle 2: resumes from the periodic checkpoint of step 150.
RUN = [
    record("launcher_start", 0.0, nnodes="1:1", nproc_per_node=2, max_restarts=3),
    record("cycle_start", 1.0, cycle=0), record("workers_ready", 2.0, cycle=0),
    failure(12.0, 0, 1, 100, root=True), failure(12.1, 0, 0, 100, root=False),
    record("state_saved", 12.5, cycle=0, rank=0, local_rank=0, step=100, bytes=210_000_000, seconds=0.41,
           source="exception", path="/x"),
    record("cycle_start", 13.0, cycle=1), record("workers_ready", 14.0, cycle=1),
    resumed(14.5, 1, 0, 100, "jit"), resumed(14.6, 1, 1, 100, "jit"),
    failure(24.5, 1, 1, 200, root=True, kind="hang"), failure(24.6, 1, 0, 200, root=False),
    record("state_not_saved", 30.0, cycle=1, reason="no rank answered within 12.0 s"),
    record("cycle_start", 31.0, cycle=2), record("workers_ready", 32.0, cycle=2),
    resumed(32.5, 2, 0, 150, "checkpoint"), resumed(32.5, 2, 1, 150, "checkpoint"),
    record("result", 50.0, outcome="succeeded", exit_code=0, cycles=3),
]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_each_failure_costs_the_steps_between_its_step_and_the_resumed_one(tmp_path):
    loaded = report.load(write(tmp_path / "ft_events.jsonl", RUN))
    first, second = failure_costs(loaded)
    assert (first.cycle, first.failed_step, first.resumed_step, first.source) == (0, 100, 100, "jit")
    assert (first.steps_redone, first.seconds_redone, first.jit_step, first.jit_seconds) == (0, 0.0, 100, 0.41)
    assert (second.cycle, second.kind, second.failed_step, second.resumed_step) == (1, "hang (heartbeat)", 200, 150)
    assert second.failed_step_at == 24.5  # rank 1's last progress (rank 0's, in the same step, came later)
    assert second.source == "checkpoint" and second.jit_not_saved == "no rank answered within 12.0 s"
    assert second.steps_redone == 50 and second.seconds_redone == pytest.approx(5.0)  # 0.1 s per step
    figures = report.figures(loaded)
    assert figures["redone_steps"] == 50 and figures["redone_s"] == pytest.approx(5.0)
    assert figures["step_s"] == pytest.approx(0.1) and figures["redone_known"] == 2
    assert figures["goodput_less_redone"] == pytest.approx((figures["useful_s"] - 5.0) / figures["wall_s"], abs=1e-3)


def test_the_timeline_and_the_figures_say_it_in_words(tmp_path, capsys):
    assert report.main([str(write(tmp_path / "ft_events.jsonl", RUN))]) == 0
    out = capsys.readouterr().out
    assert "rank 0 saved its just-in-time state of step 100 (210 MB in 0.41 s)" in out
    assert "no just-in-time state saved: no rank answered within 12.0 s" in out
    assert ("cost of the cycle 0 failure: failed in step 100, resumed from step 100 (just-in-time state, saved in "
            "0.41 s): 0 step(s) redone, about 0.00 s") in out
    assert ("cost of the cycle 1 failure: failed in step 200, resumed from step 150 (periodic checkpoint; no "
            "just-in-time state: no rank answered within 12.0 s): 50 step(s) redone, about 5.00 s") in out
    assert "work redone: 50 step(s) over 2 of 2 failure(s) (1 from a periodic checkpoint, 1 from just-in-time state)" \
        ", about 5.0 s at 0.100 s per step (median)" in out


def test_nodes_of_one_failure_count_once_with_the_furthest_step_and_the_earliest_resume(tmp_path):
    records = [
        record("launcher_start", 0.0, node=n, nnodes="2:2", nproc_per_node=1) for n in ("a", "b")
    ] + [
        record("cycle_start", 1.0, node=n, cycle=0) for n in ("a", "b")
    ] + [
        failure(10.0, 0, 1, 137, root=True, node="b"), failure(10.2, 0, 0, 138, root=False, node="a"),
        record("cycle_start", 11.0, node="a", cycle=1), record("cycle_start", 11.0, node="b", cycle=1),
        resumed(12.0, 1, 0, 137, "jit", node="a"), resumed(12.1, 1, 1, 137, "jit", node="b"),
    ]
    (cost,) = failure_costs(report.load(write(tmp_path / "ft_events.jsonl", records)))
    assert (cost.failed_step, cost.resumed_step, cost.steps_redone, sorted(cost.nodes)) == (138, 137, 1, ["a", "b"])
    assert cost.kind == "exit" and cost.seconds_redone is None  # no cycle with a known start: no step time


def test_ranks_that_do_not_report_where_they_resumed_leave_the_cost_unknown(tmp_path, capsys):
    records = [r for r in RUN if r["event"] != "resumed"]
    assert report.main([str(write(tmp_path / "ft_events.jsonl", records)), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["redone_steps"] is None and figures["redone_known"] == 0
    assert [c["steps_redone"] for c in figures["failure_costs"]] == [None, None]
    assert report.main([str(tmp_path / "ft_events.jsonl")]) == 0
    assert "work redone: unknown for all 2 failure(s)" in capsys.readouterr().out


@pytest.mark.parametrize(("step", "source", "error"), [
    (-1, "jit", "'step' must be an int"), (True, "jit", "'step' must be an int"), ("3", "jit", "'step' must be"),
    (3, "later", "'source' must be one of jit, jit_shared, checkpoint, scratch"), (3, None, "'source' must be one of"),
])
def test_the_monitor_refuses_a_resumed_report_it_cannot_use(step, source, error):
    with pytest.raises(ValueError, match=error):
        messages.resumed_fields({"type": "resumed", "step": step, "source": source})
    assert messages.resumed_fields({"step": 7, "source": "scratch"}) == (7, "scratch")


def test_the_plot_marks_the_redone_stretch(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.collections

    from launcher.events import plot

    loaded = report.load(write(tmp_path / "ft_events.jsonl", RUN))
    hatched = []
    real = matplotlib.collections.PolyCollection.__init__

    def keep_hatched(self, *args, **kwargs):  # what broken_barh draws with a hatch
        real(self, *args, **kwargs)
        if kwargs.get("hatch"):
            hatched.append(self)

    monkeypatch.setattr(matplotlib.collections.PolyCollection, "__init__", keep_hatched)
    plot.draw(loaded, report.figures(loaded), tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0
    (redone,) = hatched
    (path,) = redone.get_paths()
    assert sorted({round(float(x), 2) for x, _ in path.vertices}) == [19.5, 24.5]  # 5 s before the hang, since step 150


def test_a_rank_that_loads_its_checkpoint_then_a_newer_jit_state_counts_from_the_last(tmp_path):
    # plain loops report the periodic checkpoint they loaded, then the just-in-time state loaded on top
    run = [r for r in RUN if not (r["event"] == "resumed" and r["cycle"] == 1)]
    at = run.index(next(r for r in run if r["event"] == "workers_ready" and r["cycle"] == 1)) + 1
    run[at:at] = [resumed(14.4, 1, 0, 50, "checkpoint"), resumed(14.4, 1, 1, 50, "checkpoint"),
                  resumed(14.5, 1, 0, 100, "jit"), resumed(14.6, 1, 1, 100, "jit")]
    first, _ = failure_costs(report.load(write(tmp_path / "ft_events.jsonl", run)))
    assert (first.resumed_step, first.source, first.steps_redone) == (100, "jit", 0)
