"""Warm restarts: a template process that imported torch once forks each cycle's workers.

:mod:`launcher.warm.coordinator` (in the launcher) decides when the template starts and whether
a cycle starts warm; :mod:`launcher.warm.zygote` is the template itself and
:mod:`launcher.warm.trampoline` the stdlib-only stand-in that torch starts for each worker.
"""
