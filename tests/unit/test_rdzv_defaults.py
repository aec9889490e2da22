"""ft_launcher's rendezvous defaults for fast recovery across nodes (launcher.launch_config.RDZV_DEFAULTS)."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from launcher.launch_config import (
    RDZV_DEFAULTS,
    StartFailed,
    plan_rendezvous,
    rendezvous_parameters,
)
from launcher.rendezvous.store_watchdog import DEFAULT_STORE_LOST_TIMEOUT, StoreWatchdog


def config(backend: str = "c10d", **conf: str) -> SimpleNamespace:
    return SimpleNamespace(rdzv_backend=backend, rdzv_configs=dict(conf), rdzv_endpoint="node1:29500",
                           run_id="job", min_nodes=2, max_nodes=3, local_addr=None)


def test_c10d_gets_the_fast_recovery_defaults():
    cfg = config()
    plan = plan_rendezvous(cfg)
    assert sorted(plan.defaulted) == sorted(RDZV_DEFAULTS)
    assert cfg.rdzv_configs == {}  # the config read from torchrun's arguments is not changed
    params = rendezvous_parameters(plan.config)
    assert params.get_as_int("keep_alive_interval") == 1
    assert params.get_as_int("keep_alive_max_attempt") == 3
    assert params.get_as_int("last_call_timeout") == 2


def test_rdzv_conf_overrides_each_default():
    plan = plan_rendezvous(config(last_call_timeout="30", keep_alive_interval="5"))
    assert plan.defaulted == ("keep_alive_max_attempt",)
    assert plan.config.rdzv_configs == {"last_call_timeout": "30", "keep_alive_interval": "5",
                                        "keep_alive_max_attempt": "3"}


def test_other_backends_are_left_alone():
    plan = plan_rendezvous(config(backend="static"))
    assert plan.defaulted == () and plan.config.rdzv_configs == {}


def test_store_lost_timeout_is_ours_and_removed_before_torch_sees_the_settings():
    cfg = config(store_lost_timeout="4.5", join_timeout="60")
    plan = plan_rendezvous(cfg)
    assert plan.store_lost_after == 4.5
    assert {k: v for k, v in plan.config.rdzv_configs.items() if k not in RDZV_DEFAULTS} == {"join_timeout": "60"}
    assert cfg.rdzv_configs == {"store_lost_timeout": "4.5", "join_timeout": "60"}  # not changed
    assert plan_rendezvous(config()).store_lost_after == DEFAULT_STORE_LOST_TIMEOUT


def test_invalid_store_lost_timeout_is_a_usage_error():
    with pytest.raises(StartFailed) as err:
        plan_rendezvous(config(store_lost_timeout="soon"))
    assert err.value.exit_code == 2


def test_watchdog_reports_a_store_that_stops_accepting_connections():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    lost: list[str] = []
    dog = StoreWatchdog("127.0.0.1", port, lost_after=0.5, on_lost=lost.append, interval=0.1, connect_timeout=0.2)
    dog.start()
    time.sleep(0.6)
    assert not lost  # accepting: no loss
    server.close()  # resets the watchdog's connection; every new one is refused
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert lost and f"127.0.0.1:{port}" in lost[0] and "has not been reachable" in lost[0]


def test_watchdog_holds_one_connection_and_reconnects_when_the_store_closes_it():
    # A new connection per probe from every node stalled the store server at 64 nodes (it resolves
    # each client's host name as it accepts it): the watchdog keeps one, with TCP keep-alive on it.
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    port = server.getsockname()[1]
    lost: list[str] = []
    # lost_after beyond what TCP_KEEPCNT takes (127 probes): the probes are spaced instead
    dog = StoreWatchdog("127.0.0.1", port, lost_after=3600, on_lost=lost.append, interval=0.05, connect_timeout=0.5)
    dog.start()
    try:
        first, _ = server.accept()
        server.settimeout(1.0)  # 20 probe intervals: a watchdog that connects per probe is caught here
        with pytest.raises(TimeoutError):
            server.accept()
        first.close()  # the store closes it (its host is up): the watchdog reconnects at once
        server.settimeout(5)
        second, _ = server.accept()
        second.close()
        server.accept()[0].close()
        assert not lost
    finally:
        dog.stop()
        server.close()


def test_the_poll_interval_grows_with_the_node_count_up_to_torchs_second():
    from launcher.rendezvous.poll import default_poll_interval

    assert [default_poll_interval(n) for n in (1, 3, 50, 100, 250, 500, 5000)] == [0.1, 0.1, 0.1, 0.2, 0.5, 1.0, 1.0]


def test_poll_interval_from_rdzv_conf_is_removed_before_torch_sees_it():
    cfg = config(poll_interval="0.05", join_timeout="30")
    plan = plan_rendezvous(cfg)
    assert plan.poll_interval == 0.05
    assert {k: v for k, v in plan.config.rdzv_configs.items() if k not in RDZV_DEFAULTS} == {"join_timeout": "30"}
    assert cfg.rdzv_configs == {"poll_interval": "0.05", "join_timeout": "30"}  # not changed
    assert plan_rendezvous(config()).poll_interval == 0.1  # 3 nodes at most


@pytest.mark.parametrize("raw", ["0", "2", "fast", "nan", "-1"])
def test_a_bad_poll_interval_is_a_usage_error_naming_the_key(raw):
    with pytest.raises(StartFailed) as caught:
        plan_rendezvous(config(poll_interval=raw))
    assert str(caught.value) == f"invalid rendezvous configuration: poll_interval={raw!r} (seconds from 0.01 to 1)"
    assert caught.value.exit_code == 2


def test_the_wrapped_delay_shortens_only_torchs_one_second_poll(monkeypatch):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from launcher.rendezvous import poll as rendezvous_poll

    asked = []
    # Stands in for torch's sleep, so that the test does not sleep; restored afterwards.
    def stand_in(seconds):
        asked.append(seconds)

    monkeypatch.setattr(dynamic_rendezvous, "_delay", stand_in)
    with rendezvous_poll.installed(0.2) as done:
        assert done
        dynamic_rendezvous._delay(seconds=1)
        dynamic_rendezvous._delay(seconds=(0, 0.3))
        dynamic_rendezvous._delay(seconds=2)
        assert asked == [0.2, (0, 0.3), 2]
        outer = dynamic_rendezvous._delay
        with rendezvous_poll.installed(0.5):  # again: changes the interval, does not wrap the wrapper
            dynamic_rendezvous._delay(seconds=1)
            assert asked[-1] == 0.5 and len(asked) == 4
        assert dynamic_rendezvous._delay is outer
    assert dynamic_rendezvous._delay is stand_in  # what was there before, once the block ends


def test_the_handlers_cached_state_lives_no_longer_than_the_poll_interval():
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from launcher.rendezvous import poll as rendezvous_poll

    store = dist.HashStore()
    handler = DynamicRendezvousHandler.from_backend(
        run_id="job", store=store, backend=C10dRendezvousBackend(store, "job"), min_nodes=1, max_nodes=3)
    assert handler._state_holder._cache_duration == 1  # torch's
    assert rendezvous_poll.apply_to_handler(handler, 0.1)
    assert handler._state_holder._cache_duration == 0.1
    assert not rendezvous_poll.apply_to_handler(object(), 0.1)  # another backend: left alone
