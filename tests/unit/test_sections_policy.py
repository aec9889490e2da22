"""ft_core.client.sections_policy as tables: events in, sections and timeouts decisions out.

Pure code: no monitor, no client, no torch. Each table row is a run written as a list of events;
the test replays it and compares what the policy answered with what the rules say.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ft_core.client import sections_policy
from ft_core.client.sections_policy import (
    MIN_ITERS_FOR_HB_TIMEOUTS,
    MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE,
    HeartbeatsFacts,
    HeartbeatsPolicy,
    SectionsFacts,
    SectionsPolicy,
    final_update_refusal,
    heartbeats_config_error,
    is_clean_exit,
    sections_config_error,
)
from ft_core.wire.config import ConfigError

N = MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE

# ---------------------------------------------------------------------- sections


def replay(policy: SectionsPolicy, events: list[str]) -> list[str]:
    """Apply ``events``; return the section changes as "-name" / "+name" strings, in order."""
    out = []
    handlers = {
        "setup": policy.setup_started,
        "train_start": policy.training_step_started,
        "train_end": policy.training_step_ended,
        "eval_start": policy.eval_step_started,
        "eval_end": policy.eval_step_ended,
        "abandon": policy.step_abandoned,
        "ckpt_start": policy.checkpointing_started,
    }
    for event in events:
        if event == "end":
            out += [f"-{name}" for name in policy.run_ended()]
            continue
        if event.startswith("ckpt_end"):
            end = policy.checkpointing_ended(is_async_finalization=event == "ckpt_end_async",
                                             completes_save=event != "ckpt_end_partial")
            change = end.change
            if end.update_timeouts:
                out.append("update")
            if end.unmatched:
                out.append("unmatched")
        else:
            change = handlers[event]()
            if not isinstance(change, tuple):  # the step-ended events: the section to close, or None
                change = (change, None)
        end, start = change
        out += [f"-{end}"] * (end is not None) + [f"+{start}"] * (start is not None)
    return out


SECTION_CASES = [
    # (events, warm-up iterations, expected section changes)
    pytest.param(["setup", "train_start", "train_end", "train_start", "train_end"], 1,
                 ["+setup", "-setup", "+step", "-step"], id="first-training-step-is-warm-up"),
    pytest.param(["setup", "train_start", "train_end"], 0,
                 ["+setup", "-setup", "+step", "-step"], id="no-warm-up"),
    pytest.param(["setup"] + ["train_start", "train_end"] * 4, 3,
                 ["+setup", "-setup", "+step", "-step"], id="three-warm-up-steps"),
    pytest.param(["setup", "eval_start", "eval_end", "eval_start", "eval_end"], 1,
                 ["+setup", "-setup", "+step", "-step"], id="evaluation-first-closes-setup"),
    pytest.param(["setup", "train_start", "train_end", "train_start", "train_end",
                  "eval_start", "eval_end", "eval_start", "eval_end",
                  "train_start", "train_end", "eval_start", "eval_end", "eval_start", "eval_end"], 1,
                 ["+setup", "-setup", "+step", "-step", "+step", "-step", "+step", "-step", "+step", "-step"],
                 id="every-evaluation-run-warms-up"),
    pytest.param(["setup", "train_start", "train_start", "train_end"], 0,
                 ["+setup", "-setup", "+step", "-step"], id="step-opened-once"),
    pytest.param(["setup", "train_start", "train_end", "train_start", "abandon", "train_start"], 1,
                 ["+setup", "-setup", "+step", "-step", "+step"], id="abandoned-step-closes"),
    pytest.param(["setup", "ckpt_start", "ckpt_start", "ckpt_end", "ckpt_end", "ckpt_end"], 1,
                 ["+setup", "+checkpointing", "-checkpointing", "unmatched"], id="nested-checkpointing-counts-once"),
    pytest.param(["setup", "train_start", "train_end", "train_start", "ckpt_start", "end"], 1,
                 ["+setup", "-setup", "+step", "+checkpointing", "-checkpointing", "-step"], id="end-closes-all"),
    pytest.param(["setup", "end", "end"], 1, ["+setup", "-setup"], id="end-closes-setup-once"),
]


@pytest.mark.parametrize("events, warmup, expected", SECTION_CASES)
def test_sections_follow_the_events(events, warmup, expected):
    assert replay(SectionsPolicy(calculate_timeouts=False, num_warmup_iters=warmup), events) == expected


def test_the_answers_of_step_events_are_shared_constants():
    # The per-step events must not allocate: the Lightning hooks run them every batch.
    policy = SectionsPolicy(calculate_timeouts=False, num_warmup_iters=0)
    policy.setup_started()
    policy.training_step_started()
    policy.training_step_ended()
    first = policy.training_step_started()
    assert policy.training_step_ended() == "step"
    assert policy.training_step_started() is first
    assert policy.training_step_ended() == "step"
    assert policy.training_step_ended() is None


UPDATE_POINT_CASES = [
    # (calculate_timeouts, events, expected markers)
    pytest.param(True, ["ckpt_start", "ckpt_end"], ["+checkpointing", "update", "-checkpointing"], id="save"),
    pytest.param(False, ["ckpt_start", "ckpt_end"], ["+checkpointing", "-checkpointing"], id="not-calculating"),
    pytest.param(True, ["ckpt_start", "ckpt_end_async"], ["+checkpointing", "-checkpointing"], id="async-finalisation"),
    pytest.param(True, ["ckpt_start", "ckpt_end_partial"], ["+checkpointing", "-checkpointing"],
                 id="not-on-every-rank"),
    pytest.param(True, ["ckpt_start", "ckpt_start", "ckpt_end", "ckpt_end"],
                 ["+checkpointing", "update", "-checkpointing"], id="only-the-outermost-end"),
]


@pytest.mark.parametrize("calculate, events, expected", UPDATE_POINT_CASES)
def test_timeouts_are_updated_after_a_save_every_rank_completed(calculate, events, expected):
    assert replay(SectionsPolicy(calculate), events) == expected


def run_facts(events: list[str], *, loaded: str = "", async_io: bool = False) -> SectionsPolicy:
    policy = SectionsPolicy(calculate_timeouts=True, async_checkpointing=async_io)
    policy.setup_started()
    if loaded:
        policy.checkpoint_loaded(persistent=loaded == "persistent")
    replay(policy, events)
    return policy


def steps(count: int) -> list[str]:
    return ["train_start", "train_end"] * count


SAVE = ["ckpt_start", "ckpt_end"]
ASYNC = ["ckpt_start", "ckpt_end_async"]

TIMEOUTS_CASES = [
    # (events, loaded, async IO, selected sections, out-of-section, note about async)
    pytest.param(steps(3), "", False, None, False, False, id="too-little-data"),
    pytest.param(steps(3) + SAVE, "", False, ("checkpointing",), False, False, id="save-before-16-iterations"),
    pytest.param(steps(N), "", False, ("step",), False, False, id="16-iterations"),
    pytest.param(steps(N - 1), "", False, None, False, False, id="15-iterations"),
    pytest.param(steps(N) + SAVE, "", False, ("checkpointing", "step"), False, False, id="first-run"),
    pytest.param(steps(N) + SAVE, "persistent", False, ("checkpointing", "setup", "step"), True, False,
                 id="resumed-run"),
    pytest.param(steps(N) + SAVE, "local", False, ("checkpointing", "step"), False, False,
                 id="local-checkpoint-load"),
    pytest.param(steps(3), "persistent", False, ("setup",), False, False, id="resumed-few-iterations"),
    pytest.param([], "persistent", False, None, False, False, id="setup-never-closed-by-a-step"),
    pytest.param(ASYNC + steps(N) + SAVE, "", False, ("step",), False, True, id="async-finalisation-seen"),
    pytest.param(steps(N) + SAVE, "", True, ("step",), False, True, id="async-checkpoint-io"),
    pytest.param(ASYNC + steps(2), "", False, None, False, False, id="async-without-save"),
]


@pytest.mark.parametrize("events, loaded, async_io, selected, oos, async_note", TIMEOUTS_CASES)
def test_what_is_calculated(events, loaded, async_io, selected, oos, async_note):
    policy = run_facts(events, loaded=loaded, async_io=async_io)
    decision = policy.timeouts_update(policy.local_facts())
    if selected is None and not oos:
        assert not decision.runs and "too little data" in decision.skip_reason
        assert f"{policy.train_iters} training iterations" in decision.skip_reason
    else:
        assert decision.runs, decision
        assert decision.selected_sections == (selected or ())
        assert decision.calc_out_of_section is oos
    assert any("asynchronous" in note for note in decision.notes) is async_note


def test_every_fact_must_hold_on_every_rank():
    policy = run_facts(steps(N) + SAVE, loaded="persistent")
    mine = policy.local_facts()
    assert all(mine)
    # Another rank saw fewer iterations, or an asynchronous finalisation: the AND drops them.
    other = mine._replace(enough_iters=False, sync_checkpointing=False)
    agreed = SectionsFacts(*(a and b for a, b in zip(mine, other, strict=True)))
    decision = policy.timeouts_update(agreed)
    assert decision.selected_sections == ("setup",) and decision.calc_out_of_section is False
    assert decision.describe() == "setup"


def test_nothing_is_calculated_without_calculate_timeouts():
    policy = SectionsPolicy(calculate_timeouts=False)
    policy.setup_started()
    replay(policy, steps(N) + SAVE)
    decision = policy.timeouts_update(policy.local_facts())
    assert not decision.runs and decision.skip_reason == "calculate_timeouts is off"


def test_describe_names_the_out_of_section_timeout():
    decision = run_facts(steps(N) + SAVE, loaded="persistent").timeouts_update(
        SectionsFacts(True, True, True, True, True))
    assert decision.describe() == "checkpointing, setup, step, out-of-section"


# ---------------------------------------------------------------------- heartbeats


HEARTBEATS_CASES = [
    # (iterations, loaded, saved, calculate, expected reason fragment or None)
    pytest.param(5, True, True, True, None, id="loaded-and-saved"),
    pytest.param(MIN_ITERS_FOR_HB_TIMEOUTS - 1, True, True, True, "too little data (1 training iterations",
                 id="one-iteration"),
    pytest.param(5, False, True, True,
                 "both load and save a checkpoint so that the intervals include them "
                 "(this run: loaded=False, saved=True)",
                 id="not-loaded"),
    pytest.param(5, True, False, True, "loaded=True, saved=False", id="not-saved"),
    pytest.param(5, True, True, False, "calculate_timeouts is off", id="not-calculating"),
]


@pytest.mark.parametrize("iters, loaded, saved, calculate, reason", HEARTBEATS_CASES)
def test_heartbeat_timeouts_rule(iters, loaded, saved, calculate, reason):
    policy = HeartbeatsPolicy(calculate)
    policy.train_iters += iters
    if loaded:
        policy.checkpoint_loaded()
    if saved:
        policy.checkpoint_saved()
    decision = policy.timeouts_update(HeartbeatsFacts(*policy.local_facts()))
    assert decision.calculate is (reason is None)
    if reason is not None:
        assert reason in decision.skip_reason


# ---------------------------------------------------------------------- end of run


@pytest.mark.parametrize("exception, world_size, refused", [
    (None, 4, None),
    (SystemExit(0), 1, None),
    (SystemExit(), 1, None),
    (SystemExit(0), 2, "exited from inside the training loop"),
    (SystemExit(1), 1, "the run failed (SystemExit(1))"),
    (RuntimeError("boom"), 1, "the run failed (RuntimeError('boom'))"),
    (KeyboardInterrupt(), 1, "the run failed"),
])
def test_final_update_refusal(exception, world_size, refused):
    answer = final_update_refusal(exception, world_size)
    assert (answer is None) if refused is None else (refused in answer)


def test_clean_exit_is_only_a_successful_system_exit():
    assert is_clean_exit(SystemExit(0)) and is_clean_exit(SystemExit(None))
    assert not is_clean_exit(SystemExit(2)) and not is_clean_exit(SystemExit("failed"))
    assert not is_clean_exit(ValueError())


# ---------------------------------------------------------------------- configuration

FULL = {"setup": 600.0, "step": 180.0, "checkpointing": 420.0}


@pytest.mark.parametrize("sections, oos, calculate, message", [
    (FULL, 300.0, False, None),
    ({**FULL, "extra": 5.0}, 300.0, False, None),
    ({"step": 5.0}, 300.0, True, "missing: setup, checkpointing"),
    ({"setup": 5.0, "step": 5.0}, None, True, "missing: checkpointing (configured: {'setup': 5.0, 'step': 5.0})"),
    ({**FULL, "step": None}, 300.0, False, "a timeout is infinite (step; "),
    ({**FULL, "step": None}, 300.0, True, None),
    (FULL, None, False, "infinite (out-of-section; "),
    (FULL, None, False, "rank_out_of_section_timeout=None) and calculate_timeouts=False"),
    (FULL, None, True, None),
    ({**FULL, "extra": None}, 300.0, False, "infinite (extra; "),
])
def test_sections_config_check(sections, oos, calculate, message):
    error = sections_config_error("who", sections, oos, calculate)
    if message is None:
        assert error is None
    else:
        assert isinstance(error, ConfigError) and str(error).startswith("who: ")
        assert message in str(error)


@pytest.mark.parametrize("calculate", [False, True])
def test_a_sections_front_end_refuses_a_finite_initial_heartbeat_timeout(calculate):
    # Sections are not heartbeats (seed 002): the monitor would stop the rank when it passes.
    error = sections_config_error("who", FULL, 300.0, calculate, initial_heartbeat=3600.0)
    assert isinstance(error, ConfigError)
    assert "initial_rank_heartbeat_timeout=3600.0 is finite" in str(error)
    assert "sections are not heartbeats" in str(error) and "stop this rank 3600 s after it connected" in str(error)
    assert "--ft-param-initial_rank_heartbeat_timeout=null" in str(error)
    assert sections_config_error("who", FULL, 300.0, calculate, initial_heartbeat=None) is None


@pytest.mark.parametrize("initial, subsequent, oos, calculate, message", [
    (600.0, 300.0, None, False, None),
    (None, None, None, True, None),
    (600.0, None, None, False, "rank_heartbeat_timeout=None) and calculate_timeouts=False"),
    (None, 300.0, None, False, "initial_rank_heartbeat_timeout=None"),
    (600.0, 300.0, 30.0, False, "rank_out_of_section_timeout=30.0 is set, but this callback opens no sections"),
    (600.0, 300.0, 30.0, True, "stop this rank after 30 s"),
])
def test_heartbeats_config_check(initial, subsequent, oos, calculate, message):
    error = heartbeats_config_error("who", initial, subsequent, oos, calculate)
    if message is None:
        assert error is None
    else:
        assert isinstance(error, ConfigError) and message in str(error)


def test_the_policy_is_pure():
    # Importing any ft_core module imports the package (and its client), so the check is on the
    # module's own imports: the standard library's typing helpers and difflib (a likely typo in a
    # section name), ConfigError and the graceful stop's exception class (ft_core.wire.errors holds
    # only exception classes), nothing else.
    tree = ast.parse(Path(sections_policy.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported == {"__future__", "collections.abc", "difflib", "typing", "ft_core.wire.config",
                        "ft_core.wire.errors"}
