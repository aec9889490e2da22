"""The launcher's result for ``scripts/autoresume.sh``: how it ended and which nodes caused it.

The loop reads one file per node (``FT_LAUNCHER_RESULT_FILE``) after each attempt, to decide
which nodes to keep out of the next allocation. The format is plain ``key=value`` lines, so
that bash reads it without a JSON parser; host names are checked so that nothing the file holds
can reach ``scontrol`` as anything but a node name.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence

from ft_core.wire.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
MAX_ROOT_NODES = 64
"""At most this many root nodes are written (a failure has one root; a lost group a few)."""


def check_result_path(path: str) -> str | None:
    """Why ``path`` cannot take the result file (None if it can): it must be absolute, in an
    existing directory."""
    if not os.path.isabs(path):
        return f"must be an absolute path, got {path!r}"
    if not os.path.isdir(os.path.dirname(path)):
        return f"must be in an existing directory, got {path!r}"
    return None


def write_result(path: str, exit_code: int, outcome: str, root_nodes: Sequence[str],
                 fingerprint: tuple[str, str] | None = None, lost_nodes: Sequence[str] = ()) -> bool:
    """Write the result file atomically; False (and a warning) if it could not be written.

    Args:
        path: The file (from ``FT_LAUNCHER_RESULT_FILE``).
        exit_code: The launcher's exit code.
        outcome: The run's outcome, as in the ``result`` event record (one line).
        root_nodes: Host names named as the root of the failure that ended the run; names that
            are not plain host names are left out.
        fingerprint: ``(digest, text)`` of the last failed cycle's root failure
            (:mod:`launcher.decision.crash_loop`), written as ``fingerprint=`` and ``fingerprint_text=``
            (one line, printable, at most 200 characters); None: both empty.
        lost_nodes: Host names the records named as a lost root (a node that sent no report of a
            failure) in any cycle, also when the run went on without it and succeeded: written as
            ``lost_nodes=`` so that the loop's node history keeps the node an elastic job lost.
    """
    def _one_line(text: str) -> str:
        return "".join(c if c.isprintable() else " " for c in " ".join(str(text).split()))[:200]

    nodes = [node for node in root_nodes if _HOST_NAME.fullmatch(node)][:MAX_ROOT_NODES]
    lost = [node for node in lost_nodes if _HOST_NAME.fullmatch(node)][:MAX_ROOT_NODES]
    text = (f"exit_code={int(exit_code)}\n"
            f"outcome={' '.join(str(outcome).split())[:200]}\n"
            f"root_nodes={','.join(nodes)}\n"
            f"lost_nodes={','.join(lost)}\n"
            f"fingerprint={_one_line(fingerprint[0]) if fingerprint else ''}\n"
            f"fingerprint_text={_one_line(fingerprint[1]) if fingerprint else ''}\n")
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as err:
        logger.warning("cannot write the result file %s: %s", path, err)
        return False
    return True
