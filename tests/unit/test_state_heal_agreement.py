"""The agreement after the rendezvous with healing (launcher/rendezvous/state_agreement.py): the
newest step ANY node holds is agreed when the nodes that lack it receive it; a failed heal falls
back to the newest step every node can read, with one line saying why."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from torch.distributed import HashStore

from ft_core.wire import saved_state
from launcher.rendezvous import state_agreement, state_transfer
from launcher.rendezvous.state_agreement import Offer, heal_plan


def _save(directory, step: int, payload: bytes = b"state") -> saved_state.SavedState:
    def writer(path: str) -> None:
        with open(path, "wb") as stream:
            stream.write(payload)

    return saved_state.write(str(directory), step, writer, kind="plain", source="blocked", cycle=0)


class Events:
    def __init__(self) -> None:
        self.records: list = []

    def record_event(self, record):
        self.records.append(record)
        return record


def _round(dirs, heal_timeout=None, events=None):
    """Every node's resume_for_round in its own thread on one store; the agreements by group rank."""
    store = HashStore()
    out: dict[int, state_agreement.Agreement] = {}

    def node(rank: int) -> None:
        out[rank] = state_agreement.resume_for_round(store, rank, len(dirs), str(dirs[rank]), 1, heal_timeout,
                                                     events[rank] if events else None)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(len(dirs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return [out[rank] for rank in range(len(dirs))]


@pytest.mark.parametrize("offers, readable, plan", [
    # nothing offered, or every node reads the newest: no heal
    ([None, None], [[], []], None),
    ([5, 5], [[5], [5]], None),
    ([5, None], [[5], [5]], None),  # node 1 reads node 0's shared copy
    # node 1 holds nothing: node 0 sends
    ([5, None], [[5], []], (5, 0, (1,))),
    # an older step is not enough; the lowest holder sends to every node lacking it
    ([3, 7, 7, None], [[3], [7], [7], []], (7, 1, (0, 3))),
])
def test_heal_plan_table(offers, readable, plan):
    parsed = [Offer(step=s, path=f"/p{s}" if s is not None else None, bytes=10) for s in offers]
    got = heal_plan(parsed, readable)
    assert (None if got is None else (got.step, got.holder, got.receivers)) == plan


def test_a_node_without_state_is_healed_and_every_node_resumes_at_the_newest_step(tmp_path, caplog):
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    held = _save(dirs[0], 137, b"z" * 3000)
    _save(dirs[2], 100)  # an older state: healed too
    events = [Events() for _ in dirs]
    with caplog.at_level(logging.INFO, logger="launcher.rendezvous.state_agreement"):
        agreements = _round(dirs, events=events)
    for index, agreement in enumerate(agreements):
        assert agreement.step == 137 and agreement.reason == ""
        assert agreement.path == str(dirs[index] / saved_state.payload_name(137))
        assert open(agreement.path, "rb").read() == b"z" * 3000
    assert saved_state.newest(str(dirs[1])).sha256 == held.sha256
    sent = events[0].records
    assert [(r.EVENT, r.role, r.step, r.bytes) for r in sent] == [("state_healed", "sent", 137, 3000)]
    assert sent[0].peer.startswith("node 1") and "node 2" in sent[0].peer
    for receiver in (1, 2):
        (record,) = events[receiver].records
        assert (record.EVENT, record.role, record.step, record.bytes) == ("state_healed", "received", 137, 3000)
        assert record.peer.startswith("node 0") and record.seconds >= 0
    lines = [r.getMessage() for r in caplog.records if "healed from node 0" in r.getMessage()]
    assert len(lines) == 2 and all("3000 bytes in" in line for line in lines)


def test_a_corrupt_transfer_falls_back_to_the_step_every_node_reads(tmp_path, caplog, monkeypatch):
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    _save(dirs[0], 137, b"z" * 3000)
    shared = _save(tmp_path / "shared", 100, b"old")  # a copy every node reads (the every-node rule)
    _save(dirs[1], 100, b"old")
    saved_state.rewrite_manifest(saved_state.SavedState(**{**saved_state.newest(str(dirs[1])).__dict__,
                                                            "shared_path": shared.payload_path}))
    send = state_transfer.send

    def corrupting_send(store, state, receivers, timeout):
        # the holder's payload changes after its offer was verified (a disk error, a writer)
        with open(state.payload_path, "r+b") as stream:
            stream.write(b"!")
        return send(store, state, receivers, timeout)

    monkeypatch.setattr(state_transfer, "send", corrupting_send)
    events = [Events() for _ in dirs]
    with caplog.at_level(logging.INFO, logger="launcher.rendezvous.state_agreement"):
        agreements = _round(dirs, events=events)
    assert [a.step for a in agreements] == [100, 100, 100]
    for agreement in agreements:
        assert agreement.reason.startswith("healing from node 0")
        assert "SHA-256 differs" in agreement.reason and "every node resumes from step 100" in agreement.reason
    for receiver in (1, 2):
        (failed,) = events[receiver].records
        assert failed.EVENT == "state_heal_failed" and "SHA-256" in failed.reason
        assert [s.step for s in saved_state.scan(str(dirs[receiver]))] in ([100], [])  # nothing of 137 kept
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "cycle 1: healing" in
                r.getMessage()]
    assert len(warnings) == 3  # one line on each node


def test_a_failed_heal_keeps_an_older_state_every_node_reads(tmp_path, monkeypatch):
    dirs = [tmp_path / "a", tmp_path / "b"]
    _save(dirs[1], 100, b"old")
    _save(dirs[0], 137, b"new")
    monkeypatch.setattr(state_transfer, "receive", lambda store, directory, step, timeout: (
        state_transfer.abort(store, step, "refused"), state_transfer.Transfer(False, step, reason="refused"))[1])
    agreements = _round(dirs, heal_timeout=5)
    # node 0 lacks 100 and node 1 lacks 137: no common step; node 1 is the one healed
    assert [a.step for a in agreements] == [None, None]
    assert all("node 1 (" in a.reason and "refused" in a.reason for a in agreements)


def test_healing_off_keeps_the_every_node_rule(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    _save(dirs[0], 137)
    agreements = _round(dirs, heal_timeout=0)
    for agreement in agreements:
        assert agreement.step is None and "cannot be read on node 1" in agreement.reason
        assert agreement.heal is None


def test_one_node_needs_no_store(tmp_path):
    _save(tmp_path, 7)
    agreement = state_agreement.agree_after_rendezvous(None, 0, 1, str(tmp_path))
    assert agreement.step == 7 and agreement.heal is None


def test_an_offer_from_the_store_is_bounded(tmp_path):
    offer = Offer.from_json(b'{"step": 5, "shared": null, "bytes": 12, "node": "' + b"h" * 400 + b'"}')
    assert offer.step == 5 and offer.bytes == 12 and len(offer.node) == 255
    assert Offer.from_json('{"step": 5, "bytes": -3}').bytes == 0
    assert Offer.from_json('{"step": null, "bytes": 3}').bytes == 0


@pytest.mark.parametrize("value, parsed", [(None, None), ("null", None), ("0", 0.0), (0, 0.0), ("12.5", 12.5)])
def test_the_heal_timeout_option(value, parsed):
    from ft_core.wire.config import FaultToleranceConfig

    assert FaultToleranceConfig(jit_heal_timeout=value).jit_heal_timeout == parsed


@pytest.mark.parametrize("value", [-1, "soon", 5000])
def test_a_bad_heal_timeout_is_a_clear_error(value):
    from ft_core.wire.config import ConfigError, FaultToleranceConfig

    with pytest.raises(ConfigError, match="jit_heal_timeout must be 0 \\(off\\) or seconds"):
        FaultToleranceConfig(jit_heal_timeout=value)


def test_a_silent_sender_ends_the_heal_at_its_bound(tmp_path, monkeypatch):
    dirs = [tmp_path / "a", tmp_path / "b"]
    _save(dirs[0], 137)
    # the holder's launcher sends nothing and says nothing (as if it hung)
    monkeypatch.setattr(state_transfer, "send", lambda store, state, receivers, timeout: state_transfer.Transfer(
        False, state.step, reason="silent"))
    started = time.monotonic()
    agreements = _round(dirs, heal_timeout=1.0)
    assert time.monotonic() - started < 1.0 + 8  # the bound, not the bound twice plus the exchange's wait
    assert [a.step for a in agreements] == [None, None]
    assert "sent nothing more within the bound" in agreements[0].reason
