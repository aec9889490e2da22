"""The port rank 0's worker listens on for its store: chosen below the kernel's ephemeral range.

The launcher gives every rendezvous round a fresh store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``,
:mod:`launcher.node.environment`). torch's rendezvous then takes that port from
``get_free_port()``: bind port 0, read the number, close. Rank 0's worker binds it seconds later,
after its imports. The kernel picks port 0's number from ``ip_local_port_range``, the same range
it gives every outgoing connection of the host as its local port, so on a busy host an outgoing
connection can take the port first, and rank 0 fails with ``EADDRINUSE`` (seen in a loaded
``.ci/run``: a crash of cycle 0, ``The server socket has failed to listen ... address already in
use``). Ports below that range are never handed to outgoing connections; only a program that
binds one on purpose can take it.

:func:`installed` puts :func:`pick_master_port` in the place of the name torch's rendezvous calls
(``torch.distributed.elastic.rendezvous.api.get_free_port``) while a launcher runs (``tests/torch_source_checks.py``
checks that it is still called there). Both torch's c10d rendezvous and
:mod:`launcher.rendezvous.barrier` build the workers' store address through it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import socket
from collections.abc import Iterator

logger = logging.getLogger(__name__)

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000
"""The lowest port chosen: clear of the well-known and most registered service ports."""
LEAST_ROOM = 1000
"""Fewer free numbers than this between :data:`LOWEST_PORT` and the ephemeral range: use torch's helper."""
ATTEMPTS = 64


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range of local ports for outgoing connections; None if it cannot be read."""
    try:
        with open(path) as stream:
            low, high = (int(field) for field in stream.read().split()[:2])
    except (OSError, ValueError):
        return None
    return low, high


def port_is_free(port: int) -> bool:
    """True if a listening socket could bind ``port`` on every address now (it is closed again)."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with contextlib.closing(probe):
            try:
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
                probe.bind((address, port))
                probe.listen(1)
            except OSError as err:
                if family == socket.AF_INET6 and err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    continue  # IPv6 disabled in the kernel: probe IPv4 alone
                return False
        return True
    return False


def pick_master_port(rng: random.Random | None = None, path: str = EPHEMERAL_RANGE_FILE) -> int:
    """A free port below the ephemeral range (torch's ``get_free_port()`` where there is no room
    or no free port is found in :data:`ATTEMPTS` tries)."""
    limits = ephemeral_range(path)
    if limits is not None and limits[0] - LOWEST_PORT >= LEAST_ROOM:
        draw = rng or random.SystemRandom()
        for _ in range(ATTEMPTS):
            port = draw.randrange(LOWEST_PORT, limits[0])
            if port_is_free(port):
                return port
        logger.debug("no free port below the ephemeral range in %d tries; using torch's", ATTEMPTS)
    from torch.distributed.elastic.utils.distributed import get_free_port

    return get_free_port()


@contextlib.contextmanager
def installed() -> Iterator[bool]:
    """Make torch's rendezvous pick the workers' store port with :func:`pick_master_port` inside
    the ``with`` block, and put torch's own function back when it ends (also on an error).

    :class:`launcher.launch.LauncherRun` enters it for the run: importing this module changes
    nothing of torch.

    Yields:
        False (nothing changed) when this torch's rendezvous has no ``get_free_port`` to replace.
    """
    from torch.distributed.elastic.rendezvous import api

    original = getattr(api, "get_free_port", None)
    if not callable(original):
        yield False
        return
    api.get_free_port = pick_master_port
    try:
        yield True
    finally:
        # what was there before, unless someone else replaced ours meanwhile (theirs stays)
        if api.get_free_port is pick_master_port:
            api.get_free_port = original
