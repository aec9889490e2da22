"""FrontEndSession's contract (ft_core.client.session), against a real rank monitor.

The set-up steps run in one order, a step out of turn is refused, and ``close`` undoes what was
set up in reverse order on every way out: a normal end, an exception in the middle of set-up, a
release that fails. The rank is this pytest process: timeouts are long and the termination
signal is one the ``harmless_termination`` fixture ignores.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from ft_core import FaultToleranceConfig, RankMonitorClientError
from ft_core.client.collectives import default_collectives
from ft_core.client.graceful_stop import GracefulStopConfig
from ft_core.client.ranklog import rank_logger
from ft_core.client.session import FrontEndSession, SessionOrderError, SessionPhase
from ft_core.client.state_file import PART_SECTIONS
from ft_core.wire.config import ConfigError
from ft_core.wire.env import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
from tests.conftest import HARMLESS_TERMINATION

LONG = 600.0
LOGGER = "tests.front_end_session"


@pytest.fixture
def monitor(start_monitor, monkeypatch, harmless_termination) -> None:
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=None, rank_heartbeat_timeout=None,
                               rank_section_timeouts={"setup": LONG, "step": LONG, "checkpointing": LONG},
                               rank_out_of_section_timeout=LONG, **HARMLESS_TERMINATION)
    _handle, path = start_monitor(cfg)
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.fixture
def session() -> Iterator[FrontEndSession]:
    opened = FrontEndSession(rank_logger(LOGGER), PART_SECTIONS)
    yield opened
    opened.close()


def open_until_connected(session: FrontEndSession, tmp_path) -> None:
    session.begin(0, default_collectives())
    session.use_state_file(str(tmp_path / "_ft_state.json"))
    session.connect(restore=True)


def test_a_full_set_up_moves_through_every_phase_in_order_and_close_undoes_it(monitor, session, tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    phases = [session.phase]
    session.begin(0, default_collectives())
    phases.append(session.phase)
    session.use_state_file(str(tmp_path / "_ft_state.json"))
    phases.append(session.phase)
    client = session.connect(restore=True)
    phases.append(session.phase)
    session.check_config(lambda c: None)
    phases.append(session.phase)
    stop = session.arm_graceful_stop(GracefulStopConfig(signals=(signal.SIGUSR1,)))
    assert stop is not None and stop.install()
    phases.append(session.phase)
    session.started("set up %s", "done")
    phases.append(session.phase)
    assert phases == list(SessionPhase)
    assert session.client is client and client.is_initialized and session.set_step is not None
    assert signal.getsignal(signal.SIGUSR1) != before

    session.close()
    assert session.phase is SessionPhase.IDLE and not session.is_open
    assert session.client is None and session.set_step is None and session.graceful_stop is None
    assert not client.is_initialized
    assert signal.getsignal(signal.SIGUSR1) == before
    assert session.state_file_path == str(tmp_path / "_ft_state.json")  # kept for inspection
    session.close()  # a second close is a no-op


@pytest.mark.parametrize("step", ["use_state_file", "connect", "check_config", "arm_graceful_stop", "started"])
def test_a_step_before_its_turn_is_refused_and_changes_nothing(step, session, tmp_path):
    calls = {
        "use_state_file": lambda: session.use_state_file(str(tmp_path / "state.json")),
        "connect": lambda: session.connect(restore=False),
        "check_config": lambda: session.check_config(lambda c: None),
        "arm_graceful_stop": lambda: session.arm_graceful_stop(None),
        "started": lambda: session.started("set up"),
    }
    with pytest.raises(SessionOrderError, match=rf"FrontEndSession\.{step}\(\) comes after the \w+ phase, "
                                                r"but the session is IDLE"):
        calls[step]()
    assert session.phase is SessionPhase.IDLE and session.client is None


def test_a_step_cannot_be_repeated_or_skipped(monitor, session, tmp_path):
    session.begin(0, default_collectives())
    with pytest.raises(SessionOrderError, match=r"begin\(\) comes after the IDLE phase, but the session is BEGUN"):
        session.begin(0, default_collectives())
    with pytest.raises(SessionOrderError, match=r"connect\(\) comes after the STATE_FILE phase"):
        session.connect(restore=False)
    session.use_state_file(str(tmp_path / "state.json"))
    session.connect(restore=False)
    with pytest.raises(SessionOrderError, match=r"started\(\) comes after the STOP_ARMED phase, but the session "
                                                r"is CONNECTED"):
        session.started("set up")
    with pytest.raises(SessionOrderError, match=r"arm_fault\(\) needs a checked connection"):
        session.arm_fault({"fault_type": "rank_killed", "base_delay": LONG})
    assert session.phase is SessionPhase.CONNECTED


def test_hold_needs_an_open_session(session):
    with pytest.raises(SessionOrderError, match="the session is not open"):
        session.hold("hooks", lambda: None)


def test_an_exception_in_the_middle_of_set_up_releases_everything_in_reverse(monitor, session, tmp_path):
    order = []
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(ConfigError, match="cannot watch"):
        with session.opening():
            session.begin(0, default_collectives())
            session.hold("first", lambda: order.append(("first", session.client is None)))
            session.use_state_file(str(tmp_path / "state.json"))
            client = session.connect(restore=False)
            session.hold("second", lambda: order.append(("second", session.client is None)))
            session.check_config(lambda c: ConfigError("this config cannot watch the front end"))
            session.arm_graceful_stop(GracefulStopConfig(signals=(signal.SIGUSR1,)))  # never reached
    # "second" ran while still connected, "first" after the disconnect: the reverse of set-up.
    assert order == [("second", False), ("first", True)]
    assert session.phase is SessionPhase.IDLE and session.client is None and not client.is_initialized
    assert signal.getsignal(signal.SIGUSR1) == before


def test_a_connection_that_fails_leaves_the_session_closed_and_reopenable(monitor, session, tmp_path, monkeypatch):
    path = str(tmp_path / "state.json")
    good = os.environ[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR]
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, str(tmp_path / "no-such.sock"))
    with pytest.raises(RankMonitorClientError):
        with session.opening():
            session.begin(0, default_collectives())
            session.use_state_file(path)
            session.connect(restore=False)
    assert session.phase is SessionPhase.IDLE and session.client is None
    monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, good)
    with session.opening():
        open_until_connected(session, tmp_path)
    assert session.client is not None and session.client.is_initialized


def test_every_release_runs_even_when_one_fails_and_close_never_raises(monitor, session, tmp_path, caplog):
    order = []

    def broken() -> None:
        order.append("broken")
        raise RuntimeError("uninstall failed")

    open_until_connected(session, tmp_path)
    client = session.client
    session.hold("hooks", broken)
    session.hold("metrics", lambda: order.append("metrics"))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        session.close()
    assert order == ["metrics", "broken"]
    assert client is not None and not client.is_initialized  # the disconnect still ran, last
    assert "releasing the hooks failed" in caplog.text and "uninstall failed" in caplog.text


def test_the_tear_down_of_a_rank_whose_peer_died_is_quiet(monitor, session, tmp_path, caplog):
    # Issue 29 item 7: the launcher SIGTERMs the survivor of a killed peer while it closes its
    # session after the failed collective; Lightning's SIGTERM handler broadcasts to the dead peer
    # and raises inside our release. That printed "releasing the disconnect failed" with a chained
    # traceback; now one DEBUG line at most, and the disconnect still runs.
    def like_lightning(signum, frame):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer.\nmore")

    def interrupted() -> None:
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    open_until_connected(session, tmp_path)
    client = session.client
    session.hold("hooks", interrupted)
    previous = signal.signal(signal.SIGTERM, like_lightning)
    caplog.clear()  # only the tear-down's lines
    try:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            try:
                raise RuntimeError("Connection reset by peer")  # the failed all-reduce
            except RuntimeError:
                session.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert client is not None and not client.is_initialized
    ours = [r for r in caplog.records if r.name.startswith(LOGGER)]
    assert all(r.levelno <= logging.DEBUG and r.exc_info is None for r in ours), [r.getMessage() for r in ours]
    [line] = [r.getMessage() for r in ours if "releasing the hooks" in r.getMessage()]
    assert "\n" not in line and line.endswith("RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: "
                                              "Connection reset by peer."), line


def test_a_simulated_fault_is_replaced_by_a_new_one_and_cancelled_by_close(monitor, session, tmp_path):
    open_until_connected(session, tmp_path)
    session.check_config(lambda c: None)
    first = session.arm_fault({"fault_type": "rank_killed", "base_delay": LONG, "rank_to_fail": 0})
    second = session.arm_fault({"fault_type": "rank_killed", "base_delay": LONG, "rank_to_fail": 0})
    assert session.fault is second and not first.is_armed and second.is_armed
    session.close()
    assert not second.is_armed and session.fault is None


def test_a_closed_session_opens_again_with_a_new_client(monitor, session, tmp_path):
    open_until_connected(session, tmp_path)
    first = session.client
    session.close()
    open_until_connected(session, tmp_path)
    assert session.client is not None and session.client is not first and session.client.is_initialized
