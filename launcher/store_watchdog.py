"""Watch the rendezvous store's host from every node: end the launcher when it is gone.

With the c10d backend the store lives in the launcher of the endpoint node. When that node
crashes, torch's rendezvous on the others fails at once (connection refused). When it goes
silent (powered off, cut off the network) every store operation waits for its timeout, one
after the other (60 s each by default), and the launcher never ends: measured here, the other
nodes were still waiting after 300 s (docs/multinode.md).

The watchdog opens a fresh TCP connection to the endpoint every ``interval`` seconds, bounded by
``connect_timeout``. When none succeeded for ``lost_after`` seconds it calls ``on_lost`` (on its
thread), which ends the launcher with a failure: the job can then be requeued without that
node. A shorter outage (a brief partition, a busy host) is no loss. ``lost_after`` is set with
``--rdzv-conf store_lost_timeout=SECONDS`` (an ft_launcher key, not torch's; 0 turns it off).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from launcher import store_counter

logger = logging.getLogger(__name__)

STORE_LOST_KEY = "store_lost_timeout"
DEFAULT_STORE_LOST_TIMEOUT = 10.0


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

    def _probe(self) -> str | None:
        """None when the endpoint accepted a connection, else why not."""
        store_counter.count_connection()
        try:
            with socket.create_connection((self.host, self.port), timeout=self._connect_timeout):
                return None
        except OSError as err:
            return f"{type(err).__name__}: {err}"

    def _run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self._interval):
            why = self._probe()
            now = time.monotonic()
            if why is None:
                last_ok = now
                continue
            if self._stop.is_set():
                return
            logger.debug("rendezvous store %s:%s did not answer: %s", self.host, self.port, why)
            if now - last_ok >= self.lost_after:
                self._on_lost(f"the rendezvous store at {self.host}:{self.port} has not accepted a "
                              f"connection for {now - last_ok:.1f} s (last error: {why})")
                return
