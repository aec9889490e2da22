"""The restart policies' names, defined once (stdlib only: the config module imports it).

The config field ``restart_policy`` accepts these names, its help text lists them with
:attr:`RestartPolicyName.description`, and the launcher's behaviour for each is in
``launcher/decision/`` (``restart_policy.py`` and ``decide.py``), which takes the member, not a
string. A new policy is one member here and its rule there.
"""

from __future__ import annotations

import enum


class RestartPolicyName(str, enum.Enum):
    """A restart policy (the value is the name the config and the command line use)."""

    ANY_FAILED = "any-failed"
    MIN_HEALTHY = "min-healthy"

    @property
    def description(self) -> str:
        """What the policy does, one sentence for the config's help text."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    RestartPolicyName.ANY_FAILED: "restart all workers when any fails.",
    RestartPolicyName.MIN_HEALTHY: "restart only when fewer nodes than the minimum of --nnodes are healthy.",
}

POLICY_NAMES: tuple[str, ...] = tuple(policy.value for policy in RestartPolicyName)
"""Every policy's name, in the order the help text lists them."""

HELP_TEXT = " ".join(f"{policy.value}: {policy.description}" for policy in RestartPolicyName)
"""The config field's help: each policy's name and what it does."""
