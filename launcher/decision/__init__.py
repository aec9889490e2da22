"""What the launcher decides after a cycle fails, and the facts it decides from.

- :mod:`launcher.decision.failures`: torch's failures, the monitors' hang reports and the
  evidence turned into failure records;
- :mod:`launcher.decision.incident`: what the agent learns while a cycle fails (hang reports,
  exits, progress and stacks from the monitors);
- :mod:`launcher.decision.culprit`: which rank of a failed cycle is the root, which are collateral;
- :mod:`launcher.decision.unwinding`: stacks that show a rank already ending, not waiting;
- :mod:`launcher.decision.crash_loop`: a failure that repeats without progress, and the rule
  that stops it;
- :mod:`launcher.decision.restart_policy`: restart, stop, or (min-healthy) wait.
"""
