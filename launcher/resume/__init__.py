"""The decisions of ``scripts/autoresume.sh``, in Python (``python -m launcher.resume``).

The script keeps what only a shell can do well: starting ``ft_launcher`` or ``srun``, catching
and forwarding signals, holding the run directory's lock, and the builtins-only section after
``scontrol requeue``. Everything it decides is here, as pure functions with table-driven tests:

- :mod:`launcher.resume.policy`: the verdict of an attempt (finished, continue or stop), the
  exit-code mapping, stalls, the nodes that caused a failure and the exclusion list;
- :mod:`launcher.resume.repeats`: failures that repeat across attempts: a node excluded after
  it was their root in several attempts (and let back after clean ones), or a bug that stops
  the loop (exit 66);
- :mod:`launcher.resume.history`: the run directory's ``state``, ``history.tsv``,
  ``node_history.tsv`` and ``excluded_nodes`` files;
- :mod:`launcher.resume.options`: the script's options and their validation;
- :mod:`launcher.resume.own_files`: the run directory and its files as only this user can have
  made them (no other user's file, no symbolic link, a 0600 lock file);
- :mod:`launcher.resume.batch_shell`: whether the script is SLURM's batch shell (exec'd), or a
  child of it that SLURM's warning signals would never reach (a warning at the start);
- :mod:`launcher.resume.__main__`: the command line the script calls between attempts.

Standard library only, and nothing heavy: it runs between attempts, in a SLURM batch shell that
may be signalled at any moment, so it must start in a few tens of milliseconds.
"""
