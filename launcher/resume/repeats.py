"""Failures that repeat across attempts: a bad node, or a bug. Pure functions, no I/O.

``RUN_DIR/node_history.tsv`` (:mod:`launcher.resume.history`) keeps, per attempt, how it ended
(``failed`` with its failure's fingerprint, or ``clean``), which nodes were the root of its
failure, and which nodes were put on or taken off the exclusion list. From those rows:

- a node that was the root of failures in ``--node-failures-to-exclude`` attempts, or the only
  node on which a fingerprint repeated ``--max-repeats`` times, is a bad node: it is excluded;
- a fingerprint that repeated ``--max-repeats`` times on different nodes (or where the loop
  cannot move to another node: local mode, ``--max-excluded 0``) is a bug: the loop stops with
  :data:`launcher.exit_codes.EXIT_REPEATED_FAILURE`, since a requeue will not fix it;
- a node on the exclusion list comes back after ``--node-exclusion-expiry`` clean attempts.

Repeats are counted among the failed attempts since the last attempt that did not fail (or
that made progress, with ``--progress-path``) or that stopped the loop: a failure that comes
back after the job moved on is not a loop.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

FAILED = "failed"
"""An attempt that counted as a failure (node ``-``; its fingerprint, if the launcher named one)."""
CLEAN = "clean"
"""An attempt that did not count as a failure (node ``-``)."""
PROGRESS = "progress"
"""A failed attempt that made progress (``--progress-path``; node ``-``): repeats count anew."""
STOPPED = "stop"
"""The loop stopped after this attempt (node ``-``): a new submission counts afresh."""
ROOT = "root"
"""The node was the root of the attempt's failure, as the launchers' records name it."""
BAD = "bad"
"""The node caused the failure in a way that excludes it at once (lost, ExcludeThisNode)."""
EXCLUDED = "excluded"
"""The node was put on the exclusion list."""
EXPIRED = "expired"
"""The node was taken off the exclusion list after enough clean attempts."""
KINDS = (FAILED, CLEAN, PROGRESS, STOPPED, ROOT, BAD, EXCLUDED, EXPIRED)
NO_NODE = "-"

_FINGERPRINT = re.compile(r"[0-9a-f]{12}")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def is_node_name(text: str) -> bool:
    """Whether ``text`` can be passed to ``scontrol`` as a node name and nothing else."""
    return bool(_NODE_NAME.fullmatch(text))


def is_fingerprint(text: str) -> bool:
    """Whether ``text`` is a failure fingerprint as the launcher writes it (12 hex digits)."""
    return bool(_FINGERPRINT.fullmatch(text))


@dataclass(frozen=True)
class LauncherResult:
    """What the loop takes from a launcher's result file (``FT_LAUNCHER_RESULT_FILE``).

    Attributes:
        roots: Root node names that are plain host names.
        fingerprint: 12 hex digits, or empty (absent, malformed, or an older launcher).
        fingerprint_text: One line, at most 200 characters, or empty.
        lost: Nodes the launcher's records named as a lost root in any cycle of its run (a node
            that sent no report of a failure), plain host names; also after a run that went on
            without the node and succeeded.
    """

    roots: tuple[str, ...] = ()
    fingerprint: str = ""
    fingerprint_text: str = ""
    lost: tuple[str, ...] = ()


def parse_launcher_result(text: str) -> LauncherResult:
    """Parse the ``key=value`` lines of a result file; unknown keys and bad values are ignored."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value
    roots = tuple(name for name in values.get("root_nodes", "").split(",") if is_node_name(name))
    lost = tuple(name for name in values.get("lost_nodes", "").split(",") if is_node_name(name))
    fingerprint = values.get("fingerprint", "").strip().lower()
    if not is_fingerprint(fingerprint):
        return LauncherResult(roots, lost=lost)
    return LauncherResult(roots, fingerprint, " ".join(values.get("fingerprint_text", "").split())[:200], lost)


@dataclass(frozen=True)
class Event:
    """One row of ``node_history.tsv``.

    Attributes:
        attempt: The attempt's number.
        node: The node (SLURM's name; the host name in local mode), or ``-`` for the attempt.
        kind: One of :data:`KINDS`.
        fingerprint: The failure's fingerprint, or ``-``.
        detail: Why (the fingerprint's text, the reason for an exclusion), or ``-``.
    """

    attempt: int
    node: str
    kind: str
    fingerprint: str = "-"
    detail: str = "-"


@dataclass(frozen=True)
class Rules:
    """The options that decide about repeats and nodes.

    Attributes:
        max_repeats: ``--max-repeats``: a fingerprint ending this many attempts repeats; 0 = off.
        node_failures_to_exclude: ``--node-failures-to-exclude``: root of failures in this many
            attempts excludes a node.
        exclusion_expiry: ``--node-exclusion-expiry``: clean attempts after which an excluded
            node may come back; 0 = never.
        can_exclude: Whether the loop can keep a node out (slurm mode, ``--max-excluded`` > 0).
    """

    max_repeats: int = 2
    node_failures_to_exclude: int = 2
    exclusion_expiry: int = 3
    can_exclude: bool = False


@dataclass(frozen=True)
class Repeat:
    """A fingerprint's failed attempts since the last attempt that did not fail.

    Attributes:
        fingerprint: The fingerprint.
        attempts: The attempts it ended, oldest first.
        nodes: The distinct root nodes of those attempts, in the order first seen.
        text: The fingerprint's text, as the launcher last described it.
    """

    fingerprint: str
    attempts: tuple[int, ...]
    nodes: tuple[str, ...]
    text: str


def repeat_of(events: Sequence[Event], fingerprint: str) -> Repeat | None:
    """The run of ``fingerprint``'s failures, up to the newest attempt; None if it has none."""
    if not is_fingerprint(fingerprint):
        return None
    window_start = 0
    for event in events:
        if event.node == NO_NODE and event.kind in (CLEAN, STOPPED):
            window_start = max(window_start, event.attempt + 1)
        elif event.node == NO_NODE and event.kind == PROGRESS:
            window_start = max(window_start, event.attempt)
    attempts: list[int] = []
    text = "-"
    for event in events:
        if (event.attempt >= window_start and event.node == NO_NODE and event.kind == FAILED
                and event.fingerprint == fingerprint and event.attempt not in attempts):
            attempts.append(event.attempt)
            text = event.detail
    if not attempts:
        return None
    nodes = [e.node for e in events if e.kind == ROOT and e.attempt in attempts]
    return Repeat(fingerprint, tuple(attempts), tuple(dict.fromkeys(nodes)), text)


def is_bug(repeat: Repeat | None, rules: Rules) -> bool:
    """Whether ``repeat`` is a bug that a requeue will not fix: ``--max-repeats`` attempts, and
    not all on one node that the loop could keep out."""
    if repeat is None or rules.max_repeats <= 0 or len(repeat.attempts) < rules.max_repeats:
        return False
    return len(repeat.nodes) != 1 or not rules.can_exclude


def describe(repeat: Repeat) -> str:
    """``fingerprint 0123456789ab (text) ended attempts 1,2 (root nodes a,b)``: for the log."""
    text = f"fingerprint {repeat.fingerprint}"
    if repeat.text not in ("", "-"):
        text += f" ({repeat.text})"
    text += f" ended attempts {','.join(map(str, repeat.attempts))}"
    text += f" (root nodes {','.join(repeat.nodes)})" if repeat.nodes else " (root node unknown)"
    return text


def _since_last(events: Sequence[Event], node: str, kinds: tuple[str, ...]) -> int:
    """The attempt after the node's newest event of ``kinds`` (0 if it has none)."""
    return max((e.attempt for e in events if e.node == node and e.kind in kinds), default=-1) + 1


def bad_nodes(events: Sequence[Event], fingerprint: str, rules: Rules) -> list[tuple[str, str]]:
    """The nodes to exclude for what they did over the attempts, with why (oldest root first).

    A node was the root of failures in ``node_failures_to_exclude`` attempts since it last came
    back from an exclusion; or ``fingerprint`` repeated ``max_repeats`` times, every time with
    this node (and no other) as its root.
    """
    if not rules.can_exclude:
        return []
    found: dict[str, str] = {}
    roots = dict.fromkeys(e.node for e in events if e.kind == ROOT)
    for node in roots:
        since = _since_last(events, node, (EXPIRED,))
        attempts = sorted({e.attempt for e in events if e.node == node and e.kind == ROOT
                           and e.attempt >= since})
        if len(attempts) >= rules.node_failures_to_exclude:
            found[node] = (f"root of failures in {len(attempts)} attempts "
                           f"({','.join(map(str, attempts))})")
    repeat = repeat_of(events, fingerprint)
    if (repeat is not None and 0 < rules.max_repeats <= len(repeat.attempts)
            and len(repeat.nodes) == 1 and repeat.nodes[0] not in found):
        found[repeat.nodes[0]] = (f"fingerprint {repeat.fingerprint} repeated on this node only "
                                  f"(attempts {','.join(map(str, repeat.attempts))})")
    return list(found.items())


def expired_nodes(events: Sequence[Event], excluded: Sequence[str], expiry: int) -> list[str]:
    """The nodes of ``excluded`` that ``expiry`` clean attempts have passed since they were
    excluded (a node excluded before this history began counts from its start)."""
    if expiry <= 0:
        return []
    expired = []
    for node in excluded:
        since = _since_last(events, node, (EXCLUDED,))
        clean = {e.attempt for e in events if e.node == NO_NODE and e.kind == CLEAN and e.attempt >= since}
        if len(clean) >= expiry:
            expired.append(node)
    return expired
