"""Exit codes of ``ft_launcher``; an auto-resume loop reads them to decide whether to continue.

| code | meaning | auto-resume should |
| --- | --- | --- |
| 0 | workers finished successfully | check the finished flag file |
| 1 | workers failed and no restarts were left, or an internal error | continue (counts as a failure) |
| 2 | invalid command line or configuration | stop (nothing will change on retry) |
| 64 | a rank requested ``ShutdownWorkload`` | stop: do not continue |
| 65 | a rank requested ``ExcludeThisNode`` for this node | continue without this node |
| 128+N | the launcher was stopped by signal N (e.g. 143 for SIGTERM) | continue (not a failure if preempted) |
"""

EXIT_SUCCESS = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_SHUTDOWN_REQUESTED = 64
EXIT_NODE_EXCLUDED = 65
EXIT_SIGNAL_BASE = 128
