"""The argument checks every front end shares: one wording, ``<owner>: <name> must be ..., got <value>``.

The front ends are :class:`ft_core.client.integration.FaultToleranceIntegration` (a hand-written loop)
and the two Lightning callbacks (``ptl_resiliency``). The rules they follow are
:mod:`ft_core.client.sections_policy`'s, what they do with its answers is
:mod:`ft_core.client.policy_actions`', and the connection each holds, set up and torn down in one
order, is :class:`ft_core.client.session.FrontEndSession`; this module holds the checks of their
arguments.
"""

from __future__ import annotations

import os
from typing import Any


def require_bool(owner: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is True or False (not merely truthy)."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")


def require_path(owner: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a ``str`` or ``os.PathLike`` (or None if allowed)."""
    if value is None and allow_none:
        return
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{owner}: {name} must be a path{' or None' if allow_none else ''}, got {value!r}")
