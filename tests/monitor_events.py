"""What a real rank monitor reported to a test that plays its launcher (through a MonitorLink).

One read of the link can return several reports at once (a hang and the next rank's connection,
when the test process was descheduled for a moment), so reports are never dropped: each link
keeps those no caller has taken yet.
"""

from __future__ import annotations

import selectors
import time
import weakref

from ft_core.monitor.link import MonitorLink

_pending: weakref.WeakKeyDictionary[MonitorLink, list[dict]] = weakref.WeakKeyDictionary()


def received(link: MonitorLink, kind: str) -> list[dict]:
    """Reports of ``kind`` received so far and not yet taken by :func:`wait_event` (not blocking)."""
    pending = _pending.setdefault(link, [])
    pending.extend(link.poll_events())
    return [event for event in pending if event["type"] == kind]


def wait_event(link: MonitorLink, kind: str, timeout: float = 60.0) -> dict:
    """Take the oldest report of ``kind``, waiting up to ``timeout`` seconds for one (the default
    covers a trainer process starting on a loaded machine: torch and Lightning imports took more
    than 20 s in a loaded CI run)."""
    pending = _pending.setdefault(link, [])
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(link.fileno(), selectors.EVENT_READ)
        while True:
            pending.extend(link.poll_events())
            for event in pending:
                if event["type"] == kind:
                    pending.remove(event)
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0 or link.lost:
                raise AssertionError(f"no {kind!r} event from the monitor within {timeout} s: {pending}")
            sel.select(remaining)
