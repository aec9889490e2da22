"""Stacks that show a rank already ending, not waiting: read before naming where a rank was blocked.

A collateral rank's stack is taken when the launcher stops it after another rank failed. By then
the rank has often seen its peer's death itself (a collective failed) and is unwinding: printing
its traceback (``traceback.py``, ``linecache.py``, ``ast.py`` under it), running our front end's
error handling (``on_exception``, recording the error for the launcher), or exiting (the warm
start's worker running its exit handlers, the interpreter's shutdown). The innermost frame of such
a stack is where it was printing or exiting, not where it waited: :func:`ending_reason` says so,
and :func:`caller_frame` never names our own code as the user's caller. Pure (no I/O).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from ft_core.wire.stacks import innermost_user_frame

# A standard library file: .../lib/python3.11/name.py (a venv or pyenv keeps that layout).
_STDLIB_DIR = re.compile(r"^python3\.\d+$")
_PRINTING = ("traceback.py", "linecache.py")
# Our own packages' directories, as they appear in a worker's frame paths (checkout or install).
_OWN_DIRS = ("ft_core", "ptl_resiliency")
_OWN_LAUNCHER_FILES = ("launcher/warm/zygote.py", "launcher/warm/trampoline.py")
# Functions of ours (or Lightning's) that run only once the rank's run has failed or is ending.
_ENDING_FUNCTIONS = ("on_exception", "_finish", "record_error_for_launcher", "stop_job_for_setup_error",
                     "FrontEndSession.close", "_interrupt")


def _split(frame: str) -> tuple[str, str]:
    """``(path, function)`` of a ``path:line function`` frame."""
    location, _, function = frame.rpartition(" ")
    path = location.rpartition(":")[0] or location
    return path, function


def _stdlib(path: str, name: str) -> bool:
    return os.path.basename(path) == name and bool(_STDLIB_DIR.match(os.path.basename(os.path.dirname(path))))


def is_own_frame(frame: str) -> bool:
    """Whether ``frame`` is in this project's code (ft_core, ptl_resiliency, the warm start's
    worker code): never the user's line a rank waited in."""
    path = _split(frame)[0].replace(os.sep, "/")
    parts = path.split("/")
    return any(own in parts[:-1] for own in _OWN_DIRS) or path.endswith(_OWN_LAUNCHER_FILES)


def ending_reason(frames: Sequence[str]) -> str | None:
    """Why a rank's stack (innermost frame first) shows it ending rather than waiting.

    Returns:
        ``printing a traceback``, ``handling its error`` or ``exiting``; None when nothing in
        the stack says the rank was ending (its innermost frame is then where it waited).
    """
    inner_is_runpy = False
    for frame in frames:
        path, function = _split(frame)
        if any(_stdlib(path, name) for name in _PRINTING):
            return "printing a traceback"
        if _stdlib(path, "threading.py") and function == "_shutdown":
            return "exiting"
        if function.rpartition(".")[2] in _ENDING_FUNCTIONS or function in _ENDING_FUNCTIONS:
            if is_own_frame(frame) or "lightning" in path:
                return "handling its error"
        if path.replace(os.sep, "/").endswith("launcher/warm/zygote.py") and not inner_is_runpy:
            # The warm start's worker is above the script only while runpy runs it; without
            # runpy inside, the script is over and the worker runs its exit handlers.
            return "exiting"
        inner_is_runpy = _stdlib(path, "runpy.py")  # the frame the next (outer) one called
    return None


def caller_frame(frames: Sequence[str]) -> str | None:
    """The innermost frame (of ``frames``, innermost first) of the user's own code: outside the
    standard library, installed packages and this project's code, which is never the user's line
    that called into the library a rank waited in. None if the stack holds none."""
    return innermost_user_frame([frame for frame in frames if not is_own_frame(frame)])
