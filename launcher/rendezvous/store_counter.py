"""Count the launcher's rendezvous-store operations and bytes, per phase (a debug counter).

How much a restart costs the store server at hundreds of nodes depends on how many operations
each node makes and how large they are. This module counts them where they are made, in each
launcher, when ``FT_STORE_COUNTS`` names a file (:data:`ENV_VAR`); ``bench/scale.py`` reads the
files. Without it nothing is wrapped: what is left is a :func:`phase` call per rendezvous
and per poll of ``num_nodes_waiting`` that returns a shared no-op context, and a global read per
watchdog probe and per rendezvous.

:func:`install` puts a :class:`CountingStore` between torch's dynamic rendezvous handler and its
store (the one the c10d backend keeps the rendezvous state in; the agent's per-round store is a
``PrefixStore`` over the same object, so the launcher's own keys pass through it too). Each
operation lands in one phase (:data:`PHASES`), decided in this order:

1. by its key, for the keys whose purpose is fixed: ``ft_launcher/member/`` (written: the
   host-name exchange, ``members``; read: the culprit views), ``ft_launcher/failure_view/``
   (written: ``failure_exchange``; read: ``culprit_views``), ``ft_launcher/shutdown*``,
   ``ft_launcher/unhealthy/``, torch's agent keys (rank assignment, exit barrier);
2. by the caller's current phase (:func:`phase`, a context variable: the rendezvous handler's
   proxy sets ``rendezvous`` around ``next_rendezvous`` and ``poll`` around
   ``num_nodes_waiting``);
3. otherwise ``keep_alive``: torch's heartbeat thread and the close of the rendezvous.

The store watchdog's probes are TCP connections, not store operations; they are counted as
``connect`` operations of the ``watchdog`` phase (:func:`count_connection`).

Bytes are the payload the operation carries: its keys and values sent, the values received
(what the TCPStore protocol adds per message, a few bytes, is left out). An operation that raises
(a timeout, a store that is gone) is not counted. With counting on, a ``get`` waits for the inner
store's own timeout, not for one a ``PrefixStore`` over the counter set (``wait`` passes that on).

The file (JSON) is rewritten at every :func:`mark` (the agent marks the end of each rendezvous
with the cycle it starts) and by :func:`flush` at the launcher's end: ``{"pid", "marks": [{"label",
"time", "counts"}], "final"}``, counts cumulative, ``{phase: {op: [operations, bytes out, bytes
in]}}``. A mark's counts minus the previous one's are what happened in between.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

ENV_VAR = "FT_STORE_COUNTS"
"""Path of the JSON file to write the counts to; unset or empty: nothing is counted."""

RENDEZVOUS = "rendezvous"
POLL = "poll"
KEEP_ALIVE = "keep_alive"
MEMBERS = "members"
FAILURE_EXCHANGE = "failure_exchange"
CULPRIT_VIEWS = "culprit_views"
SHUTDOWN_POLL = "shutdown_poll"
HEALTH = "health"
AGENT_SETUP = "agent_setup"
EXIT_BARRIER = "exit_barrier"
WATCHDOG = "watchdog"
PHASES = (RENDEZVOUS, POLL, KEEP_ALIVE, MEMBERS, FAILURE_EXCHANGE, CULPRIT_VIEWS, SHUTDOWN_POLL, HEALTH,
          AGENT_SETUP, EXIT_BARRIER, WATCHDOG)
"""Every phase an operation can land in (see the module docstring)."""

READS = frozenset({"get", "check", "wait", "multi_get", "num_keys"})

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("ft_store_phase", default=None)
_NO_PHASE = contextlib.nullcontext()

# Key fragments -> (phase of a write, phase of a read). Matched anywhere in the key: the agent's
# store prefixes every key with torch's round ("torch.rendezvous.<run id>.<round>/").
_KEY_PHASES: tuple[tuple[str, str, str], ...] = (
    ("ft_launcher/failure_view/", FAILURE_EXCHANGE, CULPRIT_VIEWS),
    ("ft_launcher/member/", MEMBERS, CULPRIT_VIEWS),
    ("ft_launcher/shutdown", SHUTDOWN_POLL, SHUTDOWN_POLL),
    ("ft_launcher/unhealthy/", HEALTH, HEALTH),
    ("torchelastic/role_info", AGENT_SETUP, AGENT_SETUP),
    ("torchelastic/assigned_ranks", AGENT_SETUP, AGENT_SETUP),
    ("MASTER_ADDR", AGENT_SETUP, AGENT_SETUP),
    ("MASTER_PORT", AGENT_SETUP, AGENT_SETUP),
    ("torchelastic/agent/terminal_state", EXIT_BARRIER, EXIT_BARRIER),
)


def phase_of(keys: Sequence[str], op: str, default: str = KEEP_ALIVE) -> str:
    """The phase an operation ``op`` on ``keys`` counts in (see the module docstring)."""
    read = op in READS
    for key in keys:
        for fragment, write_phase, read_phase in _KEY_PHASES:
            if fragment in key:
                return read_phase if read else write_phase
    return _current.get() or default


class StoreCounts:
    """Thread-safe counts of store operations: phase -> operation -> [count, bytes out, bytes in]."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, list[int]]] = {}

    def add(self, phase_name: str, op: str, sent: int, received: int) -> None:
        """Count one operation ``op`` of ``phase_name`` carrying ``sent`` and ``received`` bytes."""
        with self._lock:
            row = self._counts.setdefault(phase_name, {}).setdefault(op, [0, 0, 0])
            row[0] += 1
            row[1] += sent
            row[2] += received

    def snapshot(self) -> dict[str, dict[str, list[int]]]:
        """A copy of the counts so far."""
        with self._lock:
            return {p: {op: list(row) for op, row in ops.items()} for p, ops in self._counts.items()}


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "replace"))
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8  # an integer (add's increment and result, check's answer)


def _counting_store_class() -> type:
    """:class:`CountingStore`'s class, built on first use: it subclasses ``torch.distributed.Store``
    (so that torch's ``PrefixStore`` accepts it) and this module must import without torch."""
    import torch.distributed as dist

    class CountingStore(dist.Store):  # type: ignore[misc]
        """A store that passes every operation to ``inner`` and counts it in ``counts``."""

        def __init__(self, inner: Any, counts: StoreCounts) -> None:
            super().__init__()
            self.inner = inner
            self.counts = counts
            # torch's PrefixStore sets the timeout on this object (not the inner one): waits pass it on
            self.set_timeout(inner.timeout)

        def _count(self, op: str, keys: Sequence[str], sent: int, received: int) -> None:
            self.counts.add(phase_of(keys, op), op, sent, received)

        def set(self, key: str, value: Any) -> None:
            self.inner.set(key, value)
            self._count("set", (key,), _size(key) + _size(value), 0)

        def get(self, key: str) -> bytes:
            value = self.inner.get(key)
            self._count("get", (key,), _size(key), _size(value))
            return value

        def add(self, key: str, amount: int) -> int:
            value = self.inner.add(key, amount)
            self._count("add", (key,), _size(key) + 8, 8)
            return value

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            value = self.inner.compare_set(key, expected, desired)
            self._count("compare_set", (key,), _size(key) + _size(expected) + _size(desired), _size(value))
            return value

        def check(self, keys: list[str]) -> bool:
            found = self.inner.check(keys)
            self._count("check", keys, _size(keys), 8)
            return found

        def wait(self, keys: list[str], *timeout: Any) -> None:
            self.inner.wait(keys, *(timeout or (self.timeout,)))
            self._count("wait", keys, _size(keys), 0)

        def multi_get(self, keys: list[str]) -> list[bytes]:
            values = self.inner.multi_get(keys)
            self._count("multi_get", keys, _size(keys), _size(values))
            return values

        def multi_set(self, keys: list[str], values: list[Any]) -> None:
            self.inner.multi_set(keys, values)
            self._count("multi_set", keys, _size(keys) + _size(values), 0)

        def delete_key(self, key: str) -> bool:
            deleted = self.inner.delete_key(key)
            self._count("delete_key", (key,), _size(key), 8)
            return deleted

        def num_keys(self) -> int:
            value = self.inner.num_keys()
            self._count("num_keys", (), 0, 8)
            return value

    return CountingStore


_class: type | None = None
_counts: StoreCounts | None = None
_marks: list[dict[str, Any]] = []
_write_lock = threading.Lock()


def _path() -> str | None:
    return os.environ.get(ENV_VAR) or None


def counting_store(inner: Any, counts: StoreCounts) -> Any:
    """``inner`` (a ``torch.distributed.Store``) wrapped so that ``counts`` counts its operations."""
    global _class
    with _write_lock:
        if _class is None:
            _class = _counting_store_class()
    return _class(inner, counts)


def install(handler: Any) -> bool:
    """Count the operations on ``handler``'s store (torch's dynamic rendezvous handler), if
    ``FT_STORE_COUNTS`` is set (``bench/scale.py`` calls it once per simulated node in one
    process: the counts are the process's).

    Returns:
        True when counting is on for this handler; False (nothing changed) when the variable is
        unset or the handler keeps no store where torch's dynamic rendezvous does.
    """
    global _counts
    if _path() is None:
        return False
    store = getattr(handler, "_store", None)
    backend = getattr(getattr(handler, "_state_holder", None), "_backend", None)
    if store is None:
        logger.warning("%s is set but the rendezvous handler %s has no store to count", ENV_VAR,
                       type(handler).__name__)
        return False
    with _write_lock:  # bench/scale.py installs from several threads: one StoreCounts per process
        if _counts is None:
            _counts = StoreCounts()
    wrapped = counting_store(store, _counts)
    handler._store = wrapped
    if backend is not None and getattr(backend, "_store", None) is store:
        backend._store = wrapped  # the rendezvous state's reads and writes (torch's c10d backend)
    elif hasattr(handler, "_state_holder"):  # without one (ft-barrier) every operation goes through handler._store
        logger.warning("%s: the rendezvous state's store operations are not counted (handler %s keeps no "
                       "c10d backend with the handler's store)", ENV_VAR, type(handler).__name__)
    logger.info("counting rendezvous store operations into %s", _path())
    return True


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """A context in which this thread's store operations count in phase ``name`` (unless their
    key decides); a shared no-op context when nothing is counted."""
    if _counts is None:
        return _NO_PHASE
    return _phase(name)


@contextlib.contextmanager
def _phase(name: str) -> Iterator[None]:
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)


def count_connection(phase_name: str = WATCHDOG) -> None:
    """Count one TCP connection opened to the store's endpoint (the store watchdog's probe)."""
    if _counts is not None:
        _counts.add(phase_name, "connect", 0, 0)


def mark(label: Any) -> None:
    """Remember the counts so far under ``label`` and rewrite the file (no-op when not counting)."""
    if _counts is None:
        return
    with _write_lock:
        _marks.append({"label": label, "time": time.time(), "counts": _counts.snapshot()})
    flush()


def snapshot() -> dict[str, dict[str, list[int]]]:
    """The counts so far (cumulative; empty when nothing is counted)."""
    return _counts.snapshot() if _counts is not None else {}


def flush() -> None:
    """Write the marks and the counts so far to the file of ``FT_STORE_COUNTS`` (atomically;
    a failure is logged, never raised: counting must not end a run)."""
    path = _path()
    if _counts is None or path is None:
        return
    with _write_lock:
        data = {"pid": os.getpid(), "marks": list(_marks), "final": _counts.snapshot()}
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(tmp, path)
        except OSError as err:
            logger.warning("could not write the store counts to %s: %s", path, err)


def totals(counts: dict[str, dict[str, list[int]]]) -> dict[str, list[int]]:
    """``{phase: [operations, bytes out, bytes in]}`` of a counts snapshot (summed over operations)."""
    out: dict[str, list[int]] = {}
    for phase_name, ops in counts.items():
        row = out.setdefault(phase_name, [0, 0, 0])
        for values in ops.values():
            for i in range(3):
                row[i] += values[i]
    return out


def difference(later: dict[str, dict[str, list[int]]],
               earlier: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
    """``later - earlier`` of two cumulative snapshots (the operations made in between)."""
    out: dict[str, dict[str, list[int]]] = {}
    for phase_name, ops in later.items():
        for op, values in ops.items():
            before = earlier.get(phase_name, {}).get(op, [0, 0, 0])
            diff = [a - b for a, b in zip(values, before, strict=True)]
            if any(diff):
                out.setdefault(phase_name, {})[op] = diff
    return out
