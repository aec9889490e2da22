"""launcher.rendezvous.master_port: the workers' store port is chosen below the kernel's ephemeral range, so
that no outgoing connection of the host can take it before rank 0 binds it."""

from __future__ import annotations

import random
import socket

from torch.distributed.elastic.rendezvous import api

from launcher import launch_config
from launcher.rendezvous import master_port


def test_the_port_is_free_and_below_the_ephemeral_range():
    low, _ = master_port.ephemeral_range()
    ports = {master_port.pick_master_port() for _ in range(20)}
    assert all(master_port.LOWEST_PORT <= port < low for port in ports), ports
    with socket.create_server(("", ports.pop())):  # bindable, as rank 0's store server will
        pass


def test_a_taken_port_is_skipped(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    first = random.Random(7).randrange(master_port.LOWEST_PORT, 32768)
    with socket.create_server(("", first)):
        assert not master_port.port_is_free(first)
        port = master_port.pick_master_port(random.Random(7), path=str(tmp_path / "range"))
    assert port != first and master_port.LOWEST_PORT <= port < 32768


def test_without_room_below_the_range_torch_picks(tmp_path):
    (tmp_path / "range").write_text("10500 60999\n")  # only 500 ports between LOWEST_PORT and the range
    assert master_port.pick_master_port(path=str(tmp_path / "range")) >= 10500
    assert master_port.ephemeral_range(str(tmp_path / "missing")) is None


def test_it_is_in_torchs_rendezvous_only_inside_the_block_even_after_an_error():
    # importing the launcher changes nothing (tests/unit/test_torch_untouched.py checks every module)
    assert launch_config.create_rendezvous_handler
    torchs = api.get_free_port
    assert torchs is not master_port.pick_master_port
    with master_port.installed() as done:
        assert done and api.get_free_port is master_port.pick_master_port
    assert api.get_free_port is torchs
    try:
        with master_port.installed():
            raise KeyError("boom")
    except KeyError:
        pass
    assert api.get_free_port is torchs
