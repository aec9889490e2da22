"""The nodes' agreement on a just-in-time state (launcher/rendezvous/state_agreement.py): the
newest step every node can read, the same on every node; nothing partial or mixed."""

from __future__ import annotations

import threading

import pytest

from ft_core.wire import saved_state
from launcher.rendezvous.state_agreement import (
    Agreement,
    Offer,
    agree,
    agree_after_rendezvous,
    heal_plan,
    local_offer,
    readable_steps,
    worker_env,
)

L = "/local/state-{}.pt"
S = "/shared/state-{}.pt"


def offer(step, shared=False):
    if step is None:
        return Offer()
    return Offer(step=step, path=L.format(step), shared=S.format(step) if shared else None)


# Each row: the nodes' offers (step, shared copy?), which shared copies exist on every node, the
# step agreed without healing, whether a reason line is expected then, and the step agreed once the
# nodes that lack the newest state received it from a peer (launcher/rendezvous/state_transfer.py).
TABLE = [
    ("all nodes saved the same step", [(137, False), (137, False)], set(), 137, False, 137),
    ("nothing saved anywhere", [(None, False), (None, False)], set(), None, False, None),
    ("one node saved nothing, no shared copy", [(137, False), (None, False)], set(), None, True, 137),
    ("one node saved nothing, shared copy readable", [(137, True), (None, False)], {137}, 137, False, 137),
    ("one node saved nothing, shared copy offered but not visible", [(137, True), (None, False)], set(), None, True,
     137),
    ("nodes one step apart, no shared copies", [(137, False), (138, False)], set(), None, True, 138),
    ("newest only on one node, older shared", [(138, False), (137, True)], {137}, 137, True, 138),
    ("newest shared, older local elsewhere", [(138, True), (137, False)], {138}, 138, False, 138),
    ("three nodes, one without anything", [(137, False), (137, False), (None, False)], set(), None, True, 137),
    ("three nodes, two without anything", [(None, False), (137, False), (None, False)], set(), None, True, 137),
    ("single node", [(5, False)], set(), 5, False, 5),
]


@pytest.mark.parametrize("name, offers, visible, expected, reason, healed", TABLE, ids=[row[0] for row in TABLE])
def test_agreement_table(name, offers, visible, expected, reason, healed, monkeypatch):
    all_offers = [offer(step, shared) for step, shared in offers]

    def exists(path):
        return any(path == S.format(step) for step in visible)

    monkeypatch.setattr("os.path.exists", exists)
    readable = [readable_steps(own, all_offers, exists) for own in all_offers]
    results = [agree(all_offers, readable, own, i) for i, own in enumerate(all_offers)]
    assert {r.step for r in results} == {expected}, "every node agrees on the same step"
    assert all(bool(r.reason) == reason for r in results)
    for own, result in zip(all_offers, results, strict=True):
        if expected is None:
            assert result.path is None
        elif own.step == expected:
            assert result.path == L.format(expected)
        else:
            assert result.path == S.format(expected)
    # healing: the plan's receivers then hold the newest step on their own (their received copy)
    plan = heal_plan(all_offers, readable)
    if plan is not None:
        assert all_offers[plan.holder].step == plan.step and plan.holder not in plan.receivers
        all_offers = [offer(plan.step) if i in plan.receivers else own for i, own in enumerate(all_offers)]
        readable = [readable_steps(own, all_offers, exists) for own in all_offers]
    results = [agree(all_offers, readable, own, i) for i, own in enumerate(all_offers)]
    assert {r.step for r in results} == {healed}
    assert all(r.reason == "" for r in results)
    assert all(r.path == L.format(healed) or r.path == S.format(healed) for r in results if healed is not None)


def test_worker_env():
    assert worker_env(None, Agreement(step=3, path="/x")) == {}
    assert worker_env("/d", None) == {"FT_JIT_STATE_DIR": "/d"}
    assert worker_env("/d", Agreement(step=3, path="/x")) == {
        "FT_JIT_STATE_DIR": "/d", "FT_JIT_RESUME": "/x", "FT_JIT_RESUME_STEP": "3"}


def _save(directory, step, payload=b"payload"):
    def writer(path):
        with open(path, "wb") as stream:
            stream.write(payload)

    return saved_state.write(str(directory), step, writer, kind="plain", source="blocked", cycle=0)


def test_local_offer_skips_a_corrupt_state(tmp_path):
    _save(tmp_path, 5)
    newest = _save(tmp_path, 6, b"0123456789")
    assert local_offer(str(tmp_path)).step == 6
    with open(newest.payload_path, "r+b") as stream:
        stream.write(b"X")
    assert local_offer(str(tmp_path)).step == 5
    assert local_offer(None) == Offer()


def test_malformed_offers_read_as_empty():
    assert Offer.from_json(b"not json") == Offer()
    assert Offer.from_json('{"step": true}') == Offer()
    assert Offer.from_json('{"step": 4, "shared": 7}') == Offer(step=4)


@pytest.mark.parametrize("steps, heal, expected", [((7, 7), None, 7), ((7, None), 0, None), ((7, None), None, 7)])
def test_two_nodes_exchange_through_a_store(tmp_path, steps, heal, expected):
    torch_dist = pytest.importorskip("torch.distributed")
    store = torch_dist.HashStore()
    dirs = []
    for node, step in enumerate(steps):
        directory = tmp_path / f"node{node}"
        directory.mkdir()
        if step is not None:
            _save(directory, step)
        dirs.append(str(directory))
    results: dict[int, Agreement] = {}

    def node(rank):
        results[rank] = agree_after_rendezvous(store, rank, 2, dirs[rank], wait=10.0, heal_timeout=heal)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert {r.step for r in results.values()} == {expected}


def test_a_node_that_never_publishes_means_no_state(tmp_path):
    torch_dist = pytest.importorskip("torch.distributed")
    _save(tmp_path, 7)
    result = agree_after_rendezvous(torch_dist.HashStore(), 0, 2, str(tmp_path), wait=0.3)
    assert result.step is None and "could not exchange" in result.reason
