"""The phase of :class:`launcher.agent.FaultTolerantAgent`, and the transitions it may make.

torch's loop drives the agent through its hooks; the phase says what the agent is doing between
them, and :meth:`AgentPhase.check` is the one place that says which changes are allowed::

    IDLE --start--> STARTING --all connected--> RUNNING
    STARTING/RUNNING --a worker failed--> FAILED (torch restarts or stops) | WAITING (min-healthy)
    STARTING/RUNNING/FAILED/WAITING --restart--> STARTING
    WAITING --too few healthy nodes--> FAILED
    STARTING/RUNNING --every worker exited 0--> SUCCEEDED
    STARTING/RUNNING --ShutdownWorkload--> SHUTDOWN;  --ExcludeThisNode--> EXCLUDED --ShutdownWorkload--> SHUTDOWN
    STARTING/RUNNING --the same failure again, no progress--> REPEATED
"""

from __future__ import annotations

import enum


class PhaseError(RuntimeError):
    """The agent was asked to make a change of phase it cannot make (a bug)."""


class AgentPhase(enum.Enum):
    """What the agent is doing."""

    IDLE = "idle"
    """No worker started yet (the first rendezvous)."""
    STARTING = "starting"
    """The cycle's workers were started; not every one has connected to its monitor yet."""
    RUNNING = "running"
    """Every worker of the cycle connected to its monitor."""
    FAILED = "failed"
    """The cycle failed; torch's loop restarts the workers, or stops them when no restart is left."""
    WAITING = "waiting"
    """min-healthy: the cycle failed on this node; it waits until too few nodes are healthy (a
    restart for all) or nodes join (torch's restart)."""
    SUCCEEDED = "succeeded"
    """Every worker exited 0."""
    SHUTDOWN = "shutdown"
    """A ShutdownWorkload request (here or on another node): the workers stop, no restart, exit 64."""
    EXCLUDED = "excluded"
    """An ExcludeThisNode request: this node's workers stop, the others go on, exit 65."""
    REPEATED = "repeated"
    """The same failure ended ``max_no_progress_cycles`` cycles without progress
    (:mod:`launcher.decision.crash_loop`): the workers stop, no restart, exit ``no_restart_exit_code``."""

    def check(self, new: AgentPhase) -> AgentPhase:
        """Return ``new`` if the agent may go from this phase to it.

        Raises:
            PhaseError: It may not.
        """
        if new not in _ALLOWED[self]:
            raise PhaseError(f"the agent cannot go from {self.name} to {new.name}")
        return new

    @property
    def requested(self) -> bool:
        """True once a control request decided how the run ends (SHUTDOWN or EXCLUDED)."""
        return self in (AgentPhase.SHUTDOWN, AgentPhase.EXCLUDED)


_REQUESTS = {AgentPhase.SHUTDOWN, AgentPhase.EXCLUDED}
_ALLOWED: dict[AgentPhase, set[AgentPhase]] = {
    AgentPhase.IDLE: {AgentPhase.STARTING},
    AgentPhase.STARTING: {AgentPhase.STARTING, AgentPhase.RUNNING, AgentPhase.FAILED, AgentPhase.WAITING,
                          AgentPhase.SUCCEEDED, AgentPhase.REPEATED, *_REQUESTS},
    AgentPhase.RUNNING: {AgentPhase.STARTING, AgentPhase.FAILED, AgentPhase.WAITING, AgentPhase.SUCCEEDED,
                         AgentPhase.REPEATED, *_REQUESTS},
    AgentPhase.FAILED: {AgentPhase.STARTING},
    AgentPhase.WAITING: {AgentPhase.STARTING, AgentPhase.FAILED},
    AgentPhase.SUCCEEDED: set(),
    AgentPhase.SHUTDOWN: set(),
    AgentPhase.REPEATED: set(),
    AgentPhase.EXCLUDED: {AgentPhase.SHUTDOWN},
}
