"""What differs between the torch releases the launcher supports (2.8 to 2.15), read from the installed torch.

The launcher builds on torch's elastic agent and ``LaunchConfig``; a few of their parameters came
in later releases. Each difference is detected here once, from the installed torch's signatures
and dataclass fields (never from its version string), so that the rest of the launcher passes
torch only what it takes and supplies the rest itself:

- the agent's shutdown timeout (``LocalElasticAgent(shutdown_timeout=...)``,
  ``_shutdown(death_sig, timeout)``, torchrun's ``--shutdown-timeout``, torch 2.12 and later):
  without it torch calls ``_shutdown(death_sig)`` with no timeout; ``FaultTolerantAgent._shutdown``
  then applies ``--term-timeout`` itself (it does the waiting in every release);
- ``WorkerSpec`` fields that older releases lack (``numa_options``, ``virtual_local_rank``, the
  duplicate output filters): passed only where torch's ``WorkerSpec`` has them;
- ``LaunchConfig`` fields that older releases lack (``shutdown_timeout``, ``signals_to_handle``):
  :func:`launcher.launch_config.read_launch_config` sets what that release's torch does.

``tests/torch_source_checks.py`` checks each supported release's sources against the shape
expected here (``make check-torch-versions``).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import fields
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.launcher.api import LaunchConfig

AGENT_SHUTDOWN_TAKES_TIMEOUT: bool = "timeout" in inspect.signature(LocalElasticAgent._shutdown).parameters
"""Whether torch's agent bounds its own stops (torch >= 2.12): ``_shutdown(death_sig, timeout)``,
``LocalElasticAgent(shutdown_timeout=...)``. The source checks require the two to go together."""

WORKER_SPEC_FIELDS: frozenset[str] = frozenset(f.name for f in fields(WorkerSpec))
"""The fields of the installed torch's ``WorkerSpec``."""

LAUNCH_CONFIG_FIELDS: frozenset[str] = frozenset(f.name for f in fields(LaunchConfig))
"""The fields of the installed torch's ``LaunchConfig``."""


def agent_shutdown_kwargs(term_timeout: float) -> dict[str, Any]:
    """The keyword arguments that hand ``LocalElasticAgent.__init__`` the stop timeout, if it takes one.

    Empty for a torch without ``shutdown_timeout``: its ``run`` then calls ``_shutdown`` without a
    timeout, and ``FaultTolerantAgent._shutdown`` uses ``--term-timeout`` itself.
    """
    return {"shutdown_timeout": term_timeout} if AGENT_SHUTDOWN_TAKES_TIMEOUT else {}


def torch_shutdown_kwargs(timeout: float) -> dict[str, Any]:
    """The keyword arguments for torch's own ``_shutdown`` after our bounded stop.

    torch's ``_shutdown`` takes whole seconds where it takes a timeout at all (rounded up, so that
    a worker started after our pid list still gets at least ``timeout``); older releases close
    their process context with its own default, which finds the workers gone already.
    """
    return {"timeout": math.ceil(timeout)} if AGENT_SHUTDOWN_TAKES_TIMEOUT else {}
