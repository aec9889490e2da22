"""Watch the rendezvous store's host from every node: end the launcher when it is gone.

With the c10d backend the store lives in the launcher of the endpoint node. When that node
crashes, torch's rendezvous on the others fails at once (connection refused). When it goes
silent (powered off, cut off the network) every store operation waits for its timeout, one
after the other (60 s each by default), and the launcher never ends: measured here, the other
nodes were still waiting after 300 s (docs/multinode.md).

The watchdog holds one TCP connection to the endpoint, with the kernel's TCP keep-alive on it
(a probe every second once it has been idle a second). It never sends anything, so the store
server does no work for it: each node's watchdog costs one accepted connection per job, not one
per probe (a new connection every second from every node stalled the server at 64 nodes here: the
server resolves each client's host name as it accepts it, which took 5 s in this sandbox). The
connection tells the two ways a store goes away:

* the store's process is gone, its host is up: the host's kernel resets the connection at once;
  the watchdog then reconnects every ``interval`` seconds, each try bounded by ``connect_timeout``;
* the host is silent (powered off, cut off the network): the keep-alive probes go unanswered and
  the kernel gives up on the connection after about ``lost_after`` seconds.

When the store has been unreachable for ``lost_after`` seconds (no connection, or a connection
the kernel found dead) it calls ``on_lost`` (on its thread), which ends the launcher with a
failure: the job can then be requeued without that node. A shorter outage (a brief partition, a
busy host) is no loss: a keep-alive probe answered late keeps the connection. ``lost_after`` is set
with ``--rdzv-conf store_lost_timeout=SECONDS`` (an ft_launcher key, not torch's; 0 turns it off).
"""

from __future__ import annotations

import errno
import logging
import math
import select
import socket
import threading
import time
from collections.abc import Callable

from launcher.rendezvous import store_counter

logger = logging.getLogger(__name__)

STORE_LOST_KEY = "store_lost_timeout"
DEFAULT_STORE_LOST_TIMEOUT = 10.0
MAX_KEEPALIVE_PROBES = 127
"""Linux's bound on TCP_KEEPCNT."""


class StoreWatchdog:
    def __init__(self, host: str, port: int, lost_after: float, on_lost: Callable[[str], None],
                 interval: float = 1.0, connect_timeout: float = 2.0):
        self.host, self.port, self.lost_after = host, port, lost_after
        self._on_lost = on_lost
        self._interval, self._connect_timeout = interval, connect_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ft-store-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _connect(self) -> tuple[socket.socket | None, str | None]:
        """A connection to the endpoint with keep-alive probes that give up after about
        ``lost_after`` seconds of silence, or (None, why not)."""
        store_counter.count_connection()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        except OSError as err:
            return None, f"{type(err).__name__}: {err}"
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if all(hasattr(socket, name) for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT")):
                count, interval = self._keepalive()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
        except OSError as err:  # the connection still tells a reset; a silent host then waits for TCP's own timeouts
            logger.warning("store watchdog: cannot set TCP keep-alive on the connection to %s:%s (%s); a silent "
                           "store host is found later", self.host, self.port, err)
        sock.setblocking(False)
        return sock, None

    def _keepalive(self) -> tuple[int, int]:
        """(probes, seconds between probes) so that idle 1 s + probes x seconds is about ``lost_after``
        (Linux takes at most 127 probes)."""
        count = min(MAX_KEEPALIVE_PROBES, max(1, math.ceil(self.lost_after) - 1))
        return count, max(1, math.ceil((self.lost_after - 1) / count))

    def _silent_for(self) -> float:
        """How long the host was silent when the kernel gave up on the connection (ETIMEDOUT)."""
        count, interval = self._keepalive()
        return 1.0 + count * interval

    def _watch(self, sock: socket.socket) -> tuple[str | None, float]:
        """Wait up to ``interval`` for news from the connection.

        Returns:
            (None, 0) while it stands; else why it ended (the peer closed or reset it, or the
            kernel gave up on it) and how long the store had been silent by then (the keep-alive's
            span when the kernel gave up, else 0).
        """
        try:
            readable, _, _ = select.select([sock], [], [], self._interval)
        except (OSError, ValueError) as err:
            return f"{type(err).__name__}: {err}", 0.0
        if not readable:
            return None, 0.0
        try:
            data = sock.recv(256)
        except BlockingIOError:
            return None, 0.0
        except OSError as err:
            if err.errno == errno.ETIMEDOUT:
                silent = self._silent_for()
                return f"ETIMEDOUT: no answer to TCP keep-alive probes for {silent:.0f} s", silent
            return f"{type(err).__name__}: {err}", 0.0
        return (None, 0.0) if data else ("the store closed the connection", 0.0)

    def _run(self) -> None:
        last_ok = time.monotonic()
        sock: socket.socket | None = None
        why: str | None = None
        try:
            while not self._stop.is_set():
                if sock is None:
                    sock, why = self._connect()
                    if sock is None:
                        self._stop.wait(self._interval)
                    else:
                        last_ok = time.monotonic()
                        continue
                else:
                    why, silent = self._watch(sock)
                    if why is None:
                        last_ok = time.monotonic()
                        continue
                    sock.close()
                    sock = None
                    last_ok = min(last_ok, time.monotonic() - silent)
                if self._stop.is_set():
                    return
                now = time.monotonic()
                logger.debug("rendezvous store %s:%s: %s", self.host, self.port, why)
                if now - last_ok >= self.lost_after:
                    self._on_lost(f"the rendezvous store at {self.host}:{self.port} has not been reachable "
                                  f"for {now - last_ok:.1f} s (last error: {why})")
                    return
        finally:
            if sock is not None:
                sock.close()
