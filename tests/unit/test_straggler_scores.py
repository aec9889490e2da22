"""Straggler scores (ft_core.straggler.scores) and the single-process Detector API."""

from __future__ import annotations

import math

import pytest
import torch

from ft_core.straggler import Detector, StragglerId
from ft_core.straggler.outcome import ReportHandler
from ft_core.straggler.scores import (
    RankTiming,
    Report,
    Streaks,
    individual_scores,
    interval_median,
    node_scores,
    relative_scores,
)

pytestmark = [pytest.mark.timeout(30)]


def test_interval_median_needs_min_samples_and_ignores_outliers() -> None:
    assert math.isnan(interval_median([1.0, 2.0], min_samples=3))
    # a GC pause and a post-checkpoint step in 9 samples do not move the median
    assert interval_median([1.0] * 7 + [50.0, 80.0], min_samples=8) == 1.0


def test_relative_scores_are_against_the_median_rank() -> None:
    scores = relative_scores({0: 1.0, 1: 1.0, 2: 1.3, 3: 1.0, 4: math.nan})
    assert scores[0] == pytest.approx(1.0)
    assert scores[2] == pytest.approx(1 / 1.3)
    assert 4 not in scores
    # one unusually fast rank does not make the others look slow
    assert min(relative_scores({0: 0.5, 1: 1.0, 2: 1.0}).values()) == pytest.approx(1.0)
    assert relative_scores({}) == {}


def test_individual_scores_are_against_the_ranks_own_best() -> None:
    scores = individual_scores({0: RankTiming(1.3, 1.0, 10), 1: RankTiming(1.0, 1.0, 10),
                                2: RankTiming(math.nan, 1.0, 2)})
    assert scores == {0: pytest.approx(1 / 1.3), 1: pytest.approx(1.0)}


def test_node_rollup_is_the_median_of_its_ranks() -> None:
    nodes = {0: "a", 1: "a", 2: "b", 3: "b", 4: "b"}
    rolled = node_scores({0: 1.0, 1: 1.0, 2: 0.7, 3: 0.72, 4: 1.0}, nodes)
    assert rolled == {"a": 1.0, "b": pytest.approx(0.72)}


def _report(rel: dict[int, float], nodes: dict[int, str]) -> Report:
    return Report(rel, {}, {}, {}, nodes, {}, {}, 0.0, True, 0,
                  node_relative_perf_scores=node_scores(rel, nodes), interval_s=1.0, steps=10, index=1)


def test_identify_stragglers_uses_the_references_keys() -> None:
    report = _report({0: 1.0, 1: 0.7}, {0: "a", 1: "b"})
    found = report.identify_stragglers(gpu_rel_threshold=0.8)
    assert found["straggler_gpus_relative"] == {StragglerId(1, "b")}
    assert found["straggler_gpus_individual"] == set()
    assert found["straggler_nodes_relative"] == {"b"}
    assert set(found) >= {"straggler_sections_relative", "straggler_sections_individual"}


def test_streaks_count_reports_in_a_row() -> None:
    streaks = Streaks()
    streaks.update({"b"})
    assert streaks.update({"b", "c"}) == {"b": 2, "c": 1}
    assert streaks.update({"c"}) == {"c": 2}
    assert streaks.count("b") == 0


def test_replace_acts_on_a_node_flagged_k_reports_in_a_row() -> None:
    handler = ReportHandler(0.8, None, 0, action="replace", replace_after=3)
    report = _report({0: 1.0, 1: 1.0, 2: 0.7, 3: 0.7}, {0: "a", 1: "a", 2: "b", 3: "b"})
    outcomes = [handler.handle(report, rank=1, local_rank=1) for _ in range(3)]
    assert [o.replace_nodes for o in outcomes] == [frozenset(), frozenset(), frozenset({"b"})]
    assert handler.entries(report, outcomes[-1], "b")[-1] == {
        "scope": "node", "rank": None, "node": "b", "relative": pytest.approx(0.7), "individual": None,
        "consecutive": 3, "action": "replace"}


def test_detector_plain_loop_reports_at_the_agreed_step() -> None:
    model = torch.nn.Linear(4, 1)
    Detector.initialize(report_time_interval=0.05, scores_to_compute="all")
    try:
        assert Detector.instrument(model) is True  # forward, and backward to the last gradient
        # every step sampled, so that the first report (at step 10) has enough samples to score
        Detector._engine.timer.sample_every = 1
        reports = []
        for _ in range(40):
            with Detector.detection_section("step"):
                model(torch.randn(2, 4)).sum().backward()
            report = Detector.generate_report_if_interval_elapsed()
            if report is not None:
                assert Detector.is_interval_elapsed()
                reports.append(report)
        assert reports, "no report in 40 steps"
        assert reports[0].index == 1 and reports[0].steps == 10
        assert set(reports[-1].gpu_relative_perf_scores) == {0}
        assert "step" in reports[-1].section_relative_perf_scores
        timing = reports[-1].timings[0]
        assert timing.samples >= 8 and timing.median_s > 0
    finally:
        Detector.shutdown()
    with pytest.raises(RuntimeError):
        Detector()


def test_the_timer_measures_every_nth_step_with_both_phases() -> None:
    from ft_core.straggler.timing import ComputeTimer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    timer = ComputeTimer(use_cuda=False, profiling_interval=3)
    assert timer.attach(model)
    for _ in range(30):
        model(torch.randn(2, 4)).sum().backward()
    samples = timer.take_samples()
    assert timer.steps == 30 and len(samples) == 10
    assert all(forward > 0 and backward > 0 for forward, backward in samples)
    timer.detach()
    assert "forward" not in model.__dict__  # the instance's wrapper is gone


def test_the_wall_clock_timer_samples_one_step_in_three_and_leaves_skipped_steps_out() -> None:
    import statistics
    import time

    from ft_core.straggler.timing import WALL_CLOCK_SAMPLE_EVERY, ComputeTimer

    class Slow(torch.nn.Module):
        """A forward of about 2 ms and a backward of about 4 ms (a hook sleeps), so the phases are told apart."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2))
            self.weight.register_hook(self._slow_backward)

        @staticmethod
        def _slow_backward(grad: torch.Tensor) -> torch.Tensor:
            time.sleep(0.004)
            return grad

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.002)
            return (self.weight * x).sum()

    model = Slow()
    timer = ComputeTimer(use_cuda=False)
    assert timer.attach(model) and timer.steps_per_sample == WALL_CLOCK_SAMPLE_EVERY == 3
    for _ in range(4):  # the learning backwards
        model(torch.ones(2)).backward()
    timer.take_samples()
    assert timer._fast  # the common path from here on
    for _ in range(30):
        model(torch.ones(2)).backward()
    samples = timer.take_samples()
    assert len(samples) == 10, samples
    forwards, backwards = [f for f, _ in samples], [b for _, b in samples]
    # medians: one step of a loaded machine may stall in either phase
    assert 0.0018 < statistics.median(forwards) < statistics.median(backwards) and min(backwards) > 0.0036, samples
    timer.skip_next(6)
    for _ in range(6):
        model(torch.ones(2)).backward()
    assert timer.take_samples() == []
    for _ in range(9):
        model(torch.ones(2)).backward()
    assert len(timer.take_samples()) == 3
    timer.detach()


def test_an_interval_at_its_shortest_with_checkpoints_in_it_is_still_scored() -> None:
    # The report interval has a floor in steps (min_samples samples); steps left out after a
    # checkpoint must not leave it short of min_samples, or every report at the floor goes unscored.
    from ft_core.straggler.engine import StragglerEngine

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    engine = StragglerEngine(report_time_interval=1e-6)  # every proposal is under the floor
    assert engine.timer.attach(model)
    reports = []
    for step in range(1, 200):
        model(torch.randn(4, 8)).sum().backward()
        if engine.exchange.due(engine.timer.steps):
            reports.append(engine.report())
        if step % 10 == 0:  # a checkpoint every 10 steps: the next step is left out
            engine.timer.skip_next()
    engine.timer.detach()
    later = reports[1:]  # the first, at step 10, comes before enough samples
    assert len(later) >= 4, [r.steps for r in reports]
    unscored = [r.steps for r in later if not r.gpu_relative_perf_scores]
    assert not unscored, f"intervals of {unscored} steps were not scored"


def test_a_forward_that_raises_leaves_the_timer_counting_and_sampling() -> None:
    # A job may catch a failed step (an out-of-memory batch skipped) and go on: the wrapper's
    # countdown must not be left at 0, or no step would be checked (sampled, reported) again.
    from ft_core.straggler.timing import ComputeTimer

    class Flaky(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2))
            self.fail = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.fail:
                raise RuntimeError("a bad batch")
            return (self.weight * x).sum()

    model = Flaky()
    timer = ComputeTimer(use_cuda=False)
    timer.attach(model)
    for _ in range(6):
        model(torch.ones(2)).backward()
    model.fail = True
    for _ in range(3):  # checked or not, each raising forward counts as a step
        with pytest.raises(RuntimeError):
            model(torch.ones(2))
    model.fail = False
    timer.take_samples()
    for _ in range(30):
        model(torch.ones(2)).backward()
    assert timer.steps == 39
    assert len(timer.take_samples()) == 10
    timer.detach()


def test_the_references_listing_names_the_worst_and_best_ranks_to_2_decimals() -> None:
    from ft_core.straggler.outcome import reference_scores_lines

    scores = {0: 0.9912, 1: 0.4567, 2: 1.0, 3: float("nan"), 4: 0.75, 5: 0.8}
    nodes = {r: f"n{r // 2}" for r in range(6)}
    # 5 scored ranks > 2 * 2: the worst 2, worst first, then the best 2, best first; NaN left out
    assert reference_scores_lines(scores, nodes, 2) == [
        " Worst performing 2/5 ranks:", "  Rank=1 Node=n0 Score=0.46", "  Rank=4 Node=n2 Score=0.75",
        " Best performing 2/5 ranks:", "  Rank=2 Node=n1 Score=1.00", "  Rank=0 Node=n0 Score=0.99"]
    # at most 2 * count: every scored rank, worst first
    assert reference_scores_lines({0: 1.0, 1: 0.5}, {0: "a"}, 1) == ["  Rank=1 Node=<unk> Score=0.50",
                                                                       "  Rank=0 Node=a Score=1.00"]


def test_a_rank_at_least_as_fast_as_the_median_is_never_a_straggler() -> None:
    # The launcher's line from a plain DDP loop with rank 1's forward 30 ms slower: "rank 0 ... is
    # slow (relative score 50.47, individual score 0.66)". Rank 0 is 50x faster than the median
    # rank; its own time moved (it waits for rank 1 and shares the CPUs), the job never waits for it.
    nodes = {0: "a", 1: "a"}
    report = Report({0: 50.47, 1: 0.51}, {}, {0: 0.66, 1: 0.98}, {}, nodes, {}, {}, 0.0, True, 0)
    found = report.identify_stragglers(gpu_rel_threshold=0.8, gpu_indiv_threshold=0.7)
    assert found["straggler_gpus_relative"] == {StragglerId(1, "a")}
    assert found["straggler_gpus_individual"] == set()
    handler = ReportHandler(0.8, 0.7, 0)
    outcome = handler.handle(report, rank=1, local_rank=1)
    assert {s.rank for s in outcome.relative | outcome.individual} == {1}
    # a relative score of exactly 1 (the median rank) is not slow either, even under a threshold above 1
    report = Report({0: 1.0, 1: 1.25, 2: 0.8}, {}, {0: 0.5, 1: 0.5, 2: 0.5}, {}, {}, {}, {}, 0.0, True, 0)
    found = report.identify_stragglers(gpu_rel_threshold=1.1, gpu_indiv_threshold=0.7)
    assert {s.rank for s in found["straggler_gpus_relative"]} == {2}
    assert {s.rank for s in found["straggler_gpus_individual"]} == {2}


def test_the_median_rule_holds_for_sections_and_nodes_and_needs_two_scored_ranks() -> None:
    report = Report({}, {"step": {0: 2.0, 1: 0.6}}, {}, {"step": {0: 0.5, 1: 0.5}}, {0: "a", 1: "b"}, {}, {}, 0.0,
                    True, 0, node_relative_perf_scores={"a": 2.0, "b": 0.6},
                    node_individual_perf_scores={"a": 0.5, "b": 0.5})
    found = report.identify_stragglers(section_rel_threshold=0.75, section_indiv_threshold=0.75,
                                       gpu_rel_threshold=0.75, gpu_indiv_threshold=0.75)
    assert found["straggler_sections_relative"] == {"step": {StragglerId(1, "b")}}
    assert found["straggler_sections_individual"] == {"step": {StragglerId(1, "b")}}
    assert found["straggler_nodes_relative"] == {"b"} and found["straggler_nodes_individual"] == {"b"}
    # one rank: its relative score (1.0 by definition) says nothing; the individual score decides
    alone = Report({0: 1.0}, {}, {0: 0.5}, {}, {0: "a"}, {}, {}, 0.0, True, 0)
    assert alone.identify_stragglers(gpu_indiv_threshold=0.7)["straggler_gpus_individual"] == {StragglerId(0, "a")}
    # relative scores off: the individual score decides
    no_rel = Report({}, {}, {0: 0.5, 1: 1.0}, {}, {}, {}, {}, 0.0, True, 0)
    assert {s.rank for s in no_rel.identify_stragglers(gpu_indiv_threshold=0.7)["straggler_gpus_individual"]} == {0}


def test_evaluation_forwards_are_not_steps_of_the_timer() -> None:
    # Rank 0 alone running sample predictions between training steps must not move its step
    # count (the report step every rank agreed on), under no_grad, inference_mode or eval mode.
    from ft_core.straggler.timing import ComputeTimer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    timer = ComputeTimer(use_cuda=False, sample_every=1)
    assert timer.attach(model)
    seen = []
    timer.on_step_end = seen.append
    for _ in range(12):
        model(torch.randn(2, 4)).sum().backward()
        with torch.no_grad():
            model(torch.randn(2, 4))
        with torch.inference_mode():
            model(torch.randn(2, 4))
        model.eval()
        model(torch.randn(2, 4))
        model.train()
    assert timer.steps == 12
    assert seen == list(range(1, 13))
    samples = timer.take_samples()
    assert len(samples) == 12 - 2  # the two learning backwards give no sample
    timer.detach()
