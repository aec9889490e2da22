"""Workers' error files that are not JSON: removed, so that torch judges the failure by the exit code.

torch reads a failed worker's error file with ``json.load`` and lets a decode error end the
launcher. The file is empty or cut short when the worker died while writing it (a SIGKILL in the
middle of torch's ``json.dump``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping

logger = logging.getLogger(__name__)


def drop_unreadable(error_files: Mapping[int, str]) -> bool:
    """Remove the error files (local rank -> path) that do not parse as JSON; True if there was one."""
    dropped = False
    for local_rank, path in dict(error_files).items():
        if not os.path.isfile(path):  # none written, or os.devnull (torch's stand-in)
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as file:
                json.load(file)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            logger.warning("local rank %s's error file %s is not JSON (empty or cut short: the worker died "
                           "while writing it); its failure is judged by its exit code", local_rank, path)
            with contextlib.suppress(OSError):
                os.unlink(path)
            dropped = True
    return dropped
