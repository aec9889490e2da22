"""The monitor's side of just-in-time state (ft_core/monitor/state_relay.py): who may open a state
channel, one request in flight, the bound, answers from memory, a stopped rank not asked."""

from __future__ import annotations

import socket

from ft_core.monitor.message_server import Connection
from ft_core.monitor.state_relay import STATE_ROLE, StateRelay
from ft_core.wire import messages, protocol


class FakeServer:
    def __init__(self) -> None:
        self.sent: list[tuple[Connection, dict]] = []
        self.dropped: list[Connection] = []

    def send(self, conn, message, fds=None):
        self.sent.append((conn, message))
        return True

    def drop(self, conn, reason):
        self.dropped.append(conn)


def connection(pid: int) -> Connection:
    return Connection(sock=socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), peer_pid=pid, accepted_at=0.0)


def relay_with_channel(pid: int = 42) -> tuple[StateRelay, FakeServer, Connection]:
    io = FakeServer()
    relay = StateRelay(io, configured_timeout=None)  # type: ignore[arg-type]
    relay.identity = {"rank": 3, "local_rank": 1}
    conn = connection(pid)
    assert relay.attach(conn, {"type": "state_channel", "pid": pid, "approx_bytes": 300_000_000}, pid) is None
    return relay, io, conn


def test_only_the_attached_rank_may_open_the_channel():
    relay = StateRelay(FakeServer(), None)  # type: ignore[arg-type]
    assert relay.attach(connection(7), {"pid": 7}, None) is not None  # no rank attached
    assert relay.attach(connection(7), {"pid": 7}, 8) is not None  # another process
    assert relay.attach(connection(8), {"pid": 7}, 8) is not None  # says another pid than its own
    assert not relay.open


def test_request_answer_and_memory():
    relay, io, conn = relay_with_channel()
    assert conn.role == STATE_ROLE and relay.timeout() == 13.0  # 10 s + 1 s per 100 MB
    answers: list[messages.StateSaved] = []
    relay.ask(5, "hang", answers.append)
    relay.ask(5, "launcher", answers.append)  # joins the request in flight
    requests = [m for _, m in io.sent if m["type"] == protocol.MSG_SAVE_STATE]
    assert len(requests) == 1 and requests[0]["cycle"] == 5 and requests[0]["timeout"] == 13.0
    relay.on_message(conn, {"type": "state_saved", "ok": True, "step": 137, "bytes": 10, "seconds": 0.5,
                            "source": "blocked", "path": "/x"})
    assert len(answers) == 2 and all(a.ok and a.step == 137 and a.rank == 3 and a.cycle == 5 for a in answers)
    relay.ask(5, "again", answers.append)
    assert len(answers) == 3 and len([m for _, m in io.sent if m["type"] == protocol.MSG_SAVE_STATE]) == 1


def test_no_answer_within_the_bound():
    relay, io, _ = relay_with_channel()
    answers: list[messages.StateSaved] = []
    relay.ask(0, "hang", answers.append)
    due = relay.due()
    assert due is not None
    relay.expire(due - 1.0)
    assert not answers
    relay.expire(due)
    assert len(answers) == 1 and not answers[0].ok and "within 13.0 s" in answers[0].reason
    assert relay.due() is None


def test_stopped_rank_and_no_channel_decline_at_once():
    relay, io, conn = relay_with_channel()
    answers: list[messages.StateSaved] = []
    relay.ask(0, "hang", answers.append, stopped=True)
    assert "stopped" in answers[-1].reason
    relay.on_close(conn)
    relay.ask(0, "hang", answers.append)
    assert "no state channel" in answers[-1].reason
    assert not [m for _, m in io.sent if m["type"] == protocol.MSG_SAVE_STATE]


def test_channel_closing_answers_the_askers():
    relay, io, conn = relay_with_channel()
    answers: list[messages.StateSaved] = []
    relay.ask(0, "hang", answers.append)
    relay.on_close(conn)
    assert len(answers) == 1 and "closed its state channel" in answers[0].reason
