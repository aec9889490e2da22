"""How often a node waiting in torch's dynamic (c10d) rendezvous reads the store again.

torch's rendezvous operation executor sleeps a fixed second between two reads of the shared
rendezvous state while it waits for the other nodes (``_delay(seconds=1)`` in
``dynamic_rendezvous``), and its state holder serves a cached copy of the state for a second
after each read (``cache_duration=1``). A restart needs several such waits (leave the old round,
join the new one, see it complete), so on 3 nodes that all entered the rendezvous within 0.1 s
of each other it took 2.5 s, most of the recovery time after a hang. ft_launcher shortens both
in its own process, while a launcher runs (:func:`installed`): it wraps the module's ``_delay``
(a call with torch's one-second poll sleeps the poll interval instead; every other delay passes
through unchanged) and sets the handler's
cache duration to the same interval (:func:`apply_to_handler`). Nothing of torch is copied;
``tests/torch_source_checks.py`` checks that every supported release still works that way
(otherwise recovery is as slow as torch's, nothing worse).

Each read fetches the whole rendezvous state, whose size grows with the node count, and a
running node also reads it to learn whether others wait (at most once per cache duration), so
the interval grows with ``--nnodes`` MAX: ``MAX / 500`` seconds, at least 0.1 s, at most torch's
1 s. That keeps the reads of all nodes together near 500 per second of the store at most (torch's
own rate at 500 nodes). ``--rdzv-conf poll_interval=S`` sets it (ft_launcher's key, removed
before torch sees the settings).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ft_core.wire.config_values import ConfigError, parse_seconds

logger = logging.getLogger(__name__)

POLL_INTERVAL_KEY = "poll_interval"
TORCH_POLL_SECONDS = 1
"""The delay torch's executor asks for between two polls (the one this module shortens)."""
MIN_POLL_INTERVAL = 0.1
MAX_POLL_INTERVAL = 1.0
MIN_ACCEPTED_POLL_INTERVAL = 0.01
"""The smallest ``poll_interval`` accepted from ``--rdzv-conf`` (the default is at least
:data:`MIN_POLL_INTERVAL`)."""
NODES_PER_SECOND_OF_POLL = 500


def default_poll_interval(max_nodes: int) -> float:
    """The poll interval for a job of at most ``max_nodes`` nodes (see the module docstring)."""
    return min(MAX_POLL_INTERVAL, max(MIN_POLL_INTERVAL, max_nodes / NODES_PER_SECOND_OF_POLL))


def parse_poll_interval(raw: str) -> float:
    """``poll_interval`` from ``--rdzv-conf``, in seconds (through ft_core's one duration
    validator, :func:`ft_core.wire.config_values.parse_seconds`; 0 is not "off" here).

    Raises:
        ValueError: Not a number from 0.01 to 1 (the message names the key and echoes the value).
    """
    try:
        value = parse_seconds(POLL_INTERVAL_KEY, raw, allow_none=False, minimum=MIN_ACCEPTED_POLL_INTERVAL,
                              maximum=MAX_POLL_INTERVAL)
    except ConfigError:
        raise ValueError(f"invalid rendezvous configuration: {POLL_INTERVAL_KEY}={raw!r} "
                         f"(seconds from {MIN_ACCEPTED_POLL_INTERVAL:g} to {MAX_POLL_INTERVAL:g})") from None
    assert value is not None  # allow_none=False
    return value


@contextlib.contextmanager
def installed(poll_interval: float) -> Iterator[bool]:
    """Make torch's c10d rendezvous in this process poll every ``poll_interval`` seconds inside
    the ``with`` block; when it ends (also on an error) torch's ``_delay`` is what it was before.

    :class:`launcher.launch.LauncherRun` enters it for the run: importing this module changes
    nothing of torch. Entered again inside the block, the inner one changes the interval until it
    ends (blocks end in reverse order, as nested ``with`` blocks do; the wrapper never wraps a
    wrapper).

    Yields:
        False (and logs why) when this torch's rendezvous module has no ``_delay`` to wrap; the
        rendezvous then polls at torch's pace.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    current = getattr(dynamic_rendezvous, "_delay", None)
    if current is None:
        logger.warning("this torch's rendezvous has no _delay; it polls the store at its own pace")
        yield False
        return
    original: Callable[..., Any] = getattr(current, "torch_delay", current)

    def delay(seconds: float | tuple[float, float]) -> None:
        if seconds == TORCH_POLL_SECONDS:
            seconds = poll_interval
        original(seconds=seconds)

    delay.torch_delay = original  # type: ignore[attr-defined]
    dynamic_rendezvous._delay = delay
    try:
        yield True
    finally:
        if dynamic_rendezvous._delay is delay:  # a wrapper installed over ours since then stays
            dynamic_rendezvous._delay = current


def apply_to_handler(handler: Any, poll_interval: float) -> bool:
    """Let ``handler``'s state holder serve its cached state for ``poll_interval`` at most.

    Returns False (and logs why) when the handler is not torch's dynamic rendezvous handler with
    a cached state holder (another backend): it is then left as it is.
    """
    own = getattr(handler, "set_poll_interval", None)
    if callable(own):  # ft-barrier (launcher.rendezvous.barrier): its own polls, no torch state to cache
        own(poll_interval)
        return True
    holder = getattr(handler, "_state_holder", None)
    if holder is None or not isinstance(getattr(holder, "_cache_duration", None), (int, float)):
        logger.info("the rendezvous handler %s has no cached state holder; its polling is left as it is",
                    type(handler).__name__)
        return False
    holder._cache_duration = poll_interval
    return True
