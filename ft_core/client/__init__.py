"""The rank side of ft_core: ``RankMonitorClient``, timeouts, sections policy and front ends.

Runs inside each training process. Importing it never imports torch; torch is used lazily (for
collectives) once a front end runs.
"""
