"""Issue 25 item 1: the launcher's rendezvous-store operations counted per phase (``FT_STORE_COUNTS``).

A real TCPStore and torch's real c10d rendezvous handler, built by ft_launcher's own code
(:mod:`launcher.launch_config`), wrapped as the launcher wraps it; one node, so each test takes
a second or two.
"""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from launcher.launch_config import create_rendezvous_handler, plan_rendezvous
from launcher.rendezvous import membership, store_counter
from launcher.rendezvous import poll as rendezvous_poll
from launcher.rendezvous.store_channel import StoreChannel


@pytest.fixture
def fresh_counter(monkeypatch):
    """The counter's process-wide state as in a new launcher."""
    monkeypatch.setattr(store_counter, "_counts", None)
    monkeypatch.setattr(store_counter, "_marks", [])


def _server() -> tuple[dist.TCPStore, int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True), port


def _handler(port: int):
    # the LaunchConfig fields the launcher's rendezvous code reads (a LaunchConfig makes a log directory)
    config = SimpleNamespace(min_nodes=1, max_nodes=1, rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port}",
                             run_id=f"counter{port}", local_addr=None, rdzv_configs={"is_host": "false"})
    handler = create_rendezvous_handler(plan_rendezvous(config).config)
    rendezvous_poll.apply_to_handler(handler, 0.0)  # every num_nodes_waiting reads the store
    return handler


def test_phase_of_goes_by_key_then_by_the_callers_phase():
    prefix = "torch.rendezvous.job.3/"
    assert store_counter.phase_of([prefix + "ft_launcher/failure_view/2"], "set") == store_counter.FAILURE_EXCHANGE
    assert store_counter.phase_of([prefix + "ft_launcher/failure_view/2"], "get") == store_counter.CULPRIT_VIEWS
    assert store_counter.phase_of([prefix + "ft_launcher/member/0"], "set") == store_counter.MEMBERS
    assert store_counter.phase_of([prefix + "ft_launcher/member/0"], "check") == store_counter.CULPRIT_VIEWS
    assert store_counter.phase_of([prefix + "ft_launcher/shutdown"], "check") == store_counter.SHUTDOWN_POLL
    assert store_counter.phase_of(["torch.rendezvous.job"], "compare_set") == store_counter.KEEP_ALIVE
    with store_counter._phase(store_counter.POLL):
        assert store_counter.phase_of(["torch.rendezvous.job"], "get") == store_counter.POLL
        assert store_counter.phase_of([prefix + "ft_launcher/member/0"], "set") == store_counter.MEMBERS


@pytest.mark.timeout(60)
def test_without_the_variable_nothing_is_wrapped(fresh_counter, monkeypatch):
    monkeypatch.delenv(store_counter.ENV_VAR, raising=False)
    server, port = _server()
    handler = _handler(port)
    store = handler._store
    assert not store_counter.install(handler)
    assert handler._store is store
    assert store_counter.phase(store_counter.POLL) is store_counter._NO_PHASE
    store_counter.mark(0)
    assert store_counter.snapshot() == {}
    del server


@pytest.mark.timeout(60)
def test_every_operation_of_a_round_and_a_failure_exchange_is_counted_in_its_phase(fresh_counter, monkeypatch,
                                                                                    tmp_path):
    path = tmp_path / "counts.json"
    monkeypatch.setenv(store_counter.ENV_VAR, str(path))
    server, port = _server()
    handler = _handler(port)
    assert store_counter.install(handler)
    node = membership.wrap(handler, "any-failed")
    info = node.next_rendezvous()
    channel = StoreChannel(info.store)
    assert channel.publish_member(info.rank, "node-a")
    store_counter.mark(0)
    assert node.num_nodes_waiting() == 0
    assert channel.poll_shutdown(force=True) is None
    assert channel.publish_view(info.rank, [{"rank": 0, "cause": "hang"}])
    views = channel.gather_views(2, info.rank, timeout=0.1)  # group rank 1 never publishes
    assert list(views.missing) == [1]
    store_counter.flush()

    data = json.loads(path.read_text())
    assert [m["label"] for m in data["marks"]] == [0]
    first = store_counter.totals(data["marks"][0]["counts"])
    assert first[store_counter.RENDEZVOUS][0] >= 2  # at least a read and a write of the state
    members = first[store_counter.MEMBERS]
    assert members[0] == 1 and members[1] > len("ft_launcher/member/0node-a") and members[2] == 0
    later = store_counter.difference(data["final"], data["marks"][0]["counts"])
    assert store_counter.POLL in later and store_counter.RENDEZVOUS not in later
    assert later[store_counter.SHUTDOWN_POLL] == {"check": [1, later[store_counter.SHUTDOWN_POLL]["check"][1], 8]}
    view_set = later[store_counter.FAILURE_EXCHANGE]["set"]
    assert view_set[0] == 1 and view_set[1] > len('[{"rank": 0, "cause": "hang"}]')
    # node 1's view: checked at least twice within the 0.1 s wait, then its host name looked up
    views_read = later[store_counter.CULPRIT_VIEWS]
    assert views_read["check"][0] >= 3 and "get" not in views_read
    del server
