"""Whether the launcher will be able to create a file or a directory it was given, checked up front.

The launcher's paths (``--ft-event-log``, torchrun's ``--log-dir``) are created late: the event
log once the run directory exists, torch's log directory inside torch's own setup. A path that
cannot be created then fails with a traceback, after the run started. These checks run with the
other argument checks, before anything starts, and change nothing on disk: missing directories
are not created here (the launcher creates them later, as before).
"""

from __future__ import annotations

import os


def _nearest_existing(path: str) -> str:
    """``path`` or its closest ancestor that exists (``/`` at worst)."""
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _creatable_problem(path: str) -> str | None:
    """Why ``path`` (which does not exist) cannot be created with its missing parents, or None."""
    existing = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(existing):
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"no permission to create files in {existing}"
    return None


def file_problem(path: str) -> str | None:
    """Why a file cannot be appended to (created if missing, parents included) at ``path``.

    Returns:
        None when the launcher will be able to open it; else the reason in words, naming the
        part of the path that is in the way (e.g. ``"... is a directory"``).
    """
    if os.path.isdir(path):
        return f"{path} is a directory, not a file"
    if os.path.lexists(path):
        if not os.path.exists(path):
            return f"{path} is a dangling symbolic link"
        if not os.access(path, os.W_OK):
            return f"no permission to write {path}"
        return None
    return _creatable_problem(path)


def directory_problem(path: str) -> str | None:
    """Why ``path`` cannot be used as a directory to create files in (created if missing).

    Returns:
        None when it can; else the reason in words.
    """
    if os.path.lexists(path):
        if not os.path.isdir(path):
            return f"{path} is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"no permission to create files in {path}"
        return None
    return _creatable_problem(path)
