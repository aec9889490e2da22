"""ft_core.client.graceful_stop in one process: real signals to this process, the default collectives
(one process, no process group: a MAX is the value itself), a clock the test moves."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from ft_core.client.collectives import default_collectives
from ft_core.client.graceful_stop import (
    DEFAULT_SIGNALS,
    MAX_INTERVAL_STEPS,
    GracefulStop,
    GracefulStopConfig,
    _absorb_after_end,
)
from ft_core.client.sections_policy import (
    final_update_refusal,
    is_clean_exit,
    is_graceful_stop,
    is_interruption,
)
from ft_core.wire.config import ConfigError
from ft_core.wire.errors import GracefulStopExit

COLLECTIVES = default_collectives()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def restore_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


# ---------------------------------------------------------------------- the option


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), (False, None),
    (True, GracefulStopConfig()),
    ({"signals": ["USR2", 15], "check_interval": "0.5"},
     GracefulStopConfig((signal.SIGUSR2, signal.SIGTERM), 0.5)),
    ({"signals": "SIGUSR1"}, GracefulStopConfig((signal.SIGUSR1,))),
    ({"checkpoint_path": "/ckpt/stop.ckpt"}, GracefulStopConfig(checkpoint_path="/ckpt/stop.ckpt")),
])
def test_the_option_accepts_bools_configs_and_dicts(value, expected):
    assert GracefulStopConfig.from_value(value) == expected
    assert GracefulStopConfig().signals == DEFAULT_SIGNALS == (signal.SIGTERM, signal.SIGUSR1)


@pytest.mark.parametrize(("value", "fragment"), [
    ({"signals": ["SIGKILL"]}, "SIGKILL cannot ask for a graceful stop"),
    ({"signals": ["SIGCHLD"]}, "SIGCHLD cannot ask"),
    ({"signals": []}, "signals is empty"),
    ({"signals": ["SIGNOPE"]}, "unknown signal 'SIGNOPE'"),
    ({"check_interval": 0}, "check_interval must be a number of seconds > 0"),
    ({"check_interval": float("nan")}, "check_interval"),
    ({"checkpoint_path": 3}, "checkpoint_path must be a path"),
    ({"every": 3}, "unknown key(s) every"),
    ("yes", "must be True, False, None, a GracefulStopConfig or a dict, got 'yes'"),
])
def test_bad_options_are_config_errors_naming_the_field(value, fragment):
    with pytest.raises(ConfigError) as info:
        GracefulStopConfig.from_value(value)
    assert fragment in str(info.value)


# ---------------------------------------------------------------------- the flag


def test_a_stop_signal_only_sets_a_flag_once_however_often_it_comes(restore_handlers):
    before = {sig: signal.getsignal(sig) for sig in DEFAULT_SIGNALS}
    stop = GracefulStop(GracefulStopConfig())
    assert stop.install() and stop.installed
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR1)  # a job-wide signal forwarded once more
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.received is signal.SIGUSR1 and stop.deliveries == 3
    assert stop.step_ended(COLLECTIVES)  # one stop, at the first check
    assert stop.stop_step == 1 and stop.stop_signal is signal.SIGUSR1 and stop.checks == 1
    assert stop.describe_stop() == "SIGUSR1 (received by this rank)"
    stop.uninstall(absorb=True)
    # Default actions before: absorbed from now on (a stop after the run must not kill it, 21.3).
    assert before == dict.fromkeys(DEFAULT_SIGNALS, signal.SIG_DFL)
    assert not stop.installed and {sig: signal.getsignal(sig) for sig in DEFAULT_SIGNALS} == \
        dict.fromkeys(DEFAULT_SIGNALS, _absorb_after_end)
    os.kill(os.getpid(), signal.SIGUSR1)  # would end this process with SIG_DFL back


def test_the_users_handler_still_runs_and_is_restored(restore_handlers):
    calls = []

    def users(signum, frame):
        calls.append(signum)

    signal.signal(signal.SIGUSR1, users)
    stop = GracefulStop(GracefulStopConfig(signals=("SIGUSR1",)))
    stop.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert calls == [signal.SIGUSR1, signal.SIGUSR1] and stop.received is signal.SIGUSR1
    stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is users
    stop.uninstall()  # twice: nothing more
    assert signal.getsignal(signal.SIGUSR1) is users


def test_a_handler_installed_over_ours_is_left_alone(restore_handlers):
    stop = GracefulStop(GracefulStopConfig(signals=("SIGUSR2",)))
    stop.install()

    def later(signum, frame):
        pass

    signal.signal(signal.SIGUSR2, later)  # e.g. a framework that registers its own afterwards
    assert not stop.installed
    stop.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is later
    # install() takes the signal back, and still chains to the handler found first (the default)
    stop.install()
    assert stop.installed
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.received is signal.SIGUSR2


def test_sigint_does_not_raise_keyboard_interrupt_when_it_asks_for_a_stop(restore_handlers):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = GracefulStop(GracefulStopConfig(signals=("SIGINT",)))
    stop.install()
    os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt if the default handler ran
    assert stop.received is signal.SIGINT
    stop.uninstall(absorb=True)
    assert signal.getsignal(signal.SIGINT) is _absorb_after_end  # no KeyboardInterrupt after the run


def test_handlers_are_installed_on_the_main_thread_only(restore_handlers):
    stop = GracefulStop(GracefulStopConfig())
    result = []
    thread = threading.Thread(target=lambda: result.append(stop.install()))
    thread.start()
    thread.join(10)
    assert result == [False] and not stop.installed


def test_a_forked_child_survives_a_stop_signal_and_records_nothing(restore_handlers):
    # Issue 21.2: a DataLoader worker (a forked child) that died of the stop signal would fail
    # the rank before its stop step. The child ignores the stop; the parent stops its children.
    stop = GracefulStop(GracefulStopConfig())
    stop.install()
    pid = os.fork()
    if pid == 0:  # the child (a data-loader worker, say)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGUSR1)
            os._exit(0 if stop.received is None and stop.deliveries == 0 else 4)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert stop.received is None  # the parent saw nothing


def test_a_child_forked_before_install_survives_too(restore_handlers):
    # Lightning forks the first epoch's loader workers before on_train_start, where it installs.
    stop = GracefulStop(GracefulStopConfig())
    pid = os.fork()
    if pid == 0:
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            os._exit(0 if signal.getsignal(signal.SIGTERM) == stop._handle else 4)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the parent is untouched before install
    stop.uninstall()
    pid = os.fork()  # after uninstall: children are left alone
    if pid == 0:
        os._exit(0 if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL else 4)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_forked_child_still_calls_the_users_own_handler(restore_handlers):
    calls = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))
    stop = GracefulStop(GracefulStopConfig())
    stop.install()
    pid = os.fork()
    if pid == 0:
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            os._exit(0 if calls == [signal.SIGUSR1] and stop.received is None else 4)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# ---------------------------------------------------------------------- the agreement


def test_checks_happen_about_every_check_interval_and_the_stop_at_the_next_one(restore_handlers):
    clock = Clock()
    stop = GracefulStop(GracefulStopConfig(check_interval=1.0), clock=clock)
    stop.install()
    steps_checked = []
    for _ in range(1000):
        clock.now += 0.01  # 10 ms steps
        checks = stop.checks
        assert not stop.step_ended(COLLECTIVES)
        if stop.checks != checks:
            steps_checked.append(stop.steps)
    # the first check after step 1 (it measures the step time), then one per 100 steps (1 s)
    assert steps_checked[0] == 1 and all(b - a == 100 for a, b in zip(steps_checked, steps_checked[1:], strict=False))
    assert stop.checks == 10
    os.kill(os.getpid(), signal.SIGTERM)
    stopped_at = None
    for _ in range(200):
        clock.now += 0.01
        if stop.step_ended(COLLECTIVES):
            stopped_at = stop.steps
            break
    assert stopped_at is not None and stopped_at in [s + 100 for s in steps_checked[-1:]]
    assert stop.stop_step == stopped_at and stop.step_ended(COLLECTIVES)  # stays True


def test_slow_steps_are_checked_every_step_and_fast_ones_are_bounded(restore_handlers):
    clock = Clock()
    stop = GracefulStop(GracefulStopConfig(check_interval=1.0), clock=clock)
    for _ in range(5):
        clock.now += 30.0
        stop.step_ended(COLLECTIVES)
    assert stop.checks == 5 and stop.interval_steps == 1
    fast = GracefulStop(GracefulStopConfig(check_interval=1.0), clock=clock)
    fast.step_ended(COLLECTIVES)  # no time passed at all
    assert fast.interval_steps == MAX_INTERVAL_STEPS


# ---------------------------------------------------------------------- how the end of a run reads


def test_a_graceful_stop_is_no_completion_but_allows_the_final_update():
    stop = GracefulStopExit(120, "SIGUSR1", "/ckpt/last.ckpt")
    assert stop.code == 0 and is_graceful_stop(stop) and is_interruption(stop)
    assert not is_clean_exit(stop)
    assert final_update_refusal(stop, world_size=8) is None  # every rank stopped after the same step
    assert str(stop) == "graceful stop after step 120 (SIGUSR1, checkpoint /ckpt/last.ckpt)"


def test_lightnings_sigterm_exception_is_an_interruption_not_a_completion():
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    exc = SIGTERMException()
    assert exc.code is None  # exits 0, like sys.exit()
    assert is_interruption(exc) and not is_clean_exit(exc)
    assert "interrupted (SIGTERMException)" in final_update_refusal(exc, world_size=1)
    assert is_clean_exit(SystemExit(0)) and is_clean_exit(SystemExit())


def test_handlers_registered_after_the_chain_was_taken_are_not_called(restore_handlers):
    calls = []
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("user"))
    stop = GracefulStop(GracefulStopConfig(signals=("SIGTERM",)))
    stop.chain_to_current_handlers()  # before fit: the user's handler
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("framework"))  # e.g. Lightning's
    stop.install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == ["user"] and stop.received is signal.SIGTERM
    stop.uninstall()
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == ["user", "framework"]  # what was there when ours went in is back


def test_after_a_failure_the_default_actions_come_back(restore_handlers):
    """Only a clean end absorbs later stop signals; a failed rank must still end at once."""
    before = {sig: signal.getsignal(sig) for sig in DEFAULT_SIGNALS}
    stop = GracefulStop(GracefulStopConfig())
    stop.install()
    stop.uninstall(absorb=False)
    assert {sig: signal.getsignal(sig) for sig in DEFAULT_SIGNALS} == before


def test_the_stop_is_named_by_the_users_step_and_reported_to_the_launcher_as_checked_values(restore_handlers):
    # issue 29 item 10/11: the stop line named the run's own count ("step 194 of this run") while
    # the user counts 447; the launcher now records every rank's step and signal.
    from ft_core.monitor.server import _graceful_stop_fields
    from launcher.events.records import GracefulStopped
    from launcher.launch import graceful_stop_outcome

    stop = GracefulStop(GracefulStopConfig(check_interval=1.0), clock=Clock())
    stop.install()
    assert stop.describe_step() == "" and stop.named_step is None
    os.kill(os.getpid(), signal.SIGUSR1)
    while not stop.step_ended(COLLECTIVES):
        pass
    assert stop.describe_step() == f"training step {stop.stop_step} of this run" and stop.named_step == stop.stop_step
    stop.counted_step = 447
    assert stop.describe_step() == f"training step 447 (step {stop.stop_step} of this run)" and stop.named_step == 447

    fields = {"type": "shutdown", "finished": True, "stop_step": 447, "stop_run_steps": 47, "stop_signal": "SIGUSR1"}
    assert _graceful_stop_fields(fields) == {"stop_step": 447, "stop_run_steps": 47, "stop_signal": "SIGUSR1"}
    for bad in ({"stop_step": True}, {"stop_step": -1}, {"stop_step": "447"}, {"stop_step": 2**64}):
        assert _graceful_stop_fields({**fields, **bad}) == {}
    assert _graceful_stop_fields({**fields, "stop_signal": "x\nforged"}) == {"stop_step": 447, "stop_run_steps": 47}

    assert graceful_stop_outcome([]) is None
    same = [GracefulStopped(rank=r, step=447, signal="SIGUSR1") for r in (0, 1)]
    assert graceful_stop_outcome(same) == "stopped: graceful stop after step 447 on SIGUSR1, not finished"
    split = [GracefulStopped(rank=0, step=447, signal="SIGTERM"), GracefulStopped(rank=1, step=446, signal="SIGTERM")]
    assert graceful_stop_outcome(split) == ("stopped: graceful stop after different steps (rank 0: 447, rank 1: 446) "
                                            "on SIGTERM, not finished")
