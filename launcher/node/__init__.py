"""One node's processes and what the launcher does with them.

- :mod:`launcher.node.check`: the node check before each rendezvous;
- :mod:`launcher.node.processes`: who exited first, stopping workers, leftovers;
- :mod:`launcher.node.monitors`: the rank monitors, one per local rank;
- :mod:`launcher.node.sentinel`: the stdlib-only witness of job-wide signals;
- :mod:`launcher.node.signals`: what the launcher does with each signal it receives;
- :mod:`launcher.node.control_server`: the control socket for workload requests;
- :mod:`launcher.node.environment`: what the launcher takes out of its environment and sets;
- :mod:`launcher.node.path_checks`: files and directories the launcher must be able to create.
"""
