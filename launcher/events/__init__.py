"""The event log and what reads it.

- :mod:`launcher.events.records`: one dataclass per record kind, written and read by the same
  class (documented path: :mod:`launcher.records`);
- :mod:`launcher.events.log`: the launcher's event log writer, its stderr failure lines and summary;
- :mod:`launcher.events.report`: ``ft_report``, a run's timeline (documented path:
  :mod:`launcher.report`);
- :mod:`launcher.events.plot`: ``ft_report --plot``;
- :mod:`launcher.events.goodput`: goodput and time to recover, for users and benchmarks alike.
"""
