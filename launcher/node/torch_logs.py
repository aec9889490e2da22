"""torch's worker log lines, made true to what the launcher knows.

torch's ``multiprocessing.api`` logger names the process torch started (under warm restarts a
stand-in) and, at a failure, the rank with the earliest timestamp (a second's resolution, often a
collateral rank). :func:`install` adds two filters to that logger: one rewrites the pid to the
worker's own, one drops the wrong-rank failure line (the launcher's own failure line names the
root and says why). ``tests/unit/test_torch_hooks.py`` checks the messages against torch.
"""

from __future__ import annotations

import logging

from launcher.node.processes import WorkerProcesses

TORCH_PROCESS_LOGGER = "torch.distributed.elastic.multiprocessing.api"
TORCH_PID_LINES = {  # torch's message -> index of its pid argument (checked by test_torch_hooks)
    "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s": 2,
    "Sending process %s closing signal %s": 0,
}


class _WrongRankLineFilter(logging.Filter):
    """Drops torch's "failed (exitcode: ...) local_rank: N" line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("failed (exitcode"))


_wrong_rank_filter = _WrongRankLineFilter()


class _WorkerPidLogFilter(logging.Filter):
    """Makes torch's lines name the worker's own pid, as every line of ours does."""

    def __init__(self, workers: WorkerProcesses) -> None:
        super().__init__()
        self.workers = workers

    def filter(self, record: logging.LogRecord) -> bool:
        index = TORCH_PID_LINES.get(record.msg) if isinstance(record.msg, str) else None
        if index is not None and isinstance(record.args, tuple) and len(record.args) > index:
            pid = record.args[index]
            if isinstance(pid, int):
                args = list(record.args)
                args[index] = self.workers.worker_pid(pid)
                record.args = tuple(args)
        return True


def install(workers: WorkerProcesses) -> None:
    """Add the two filters to torch's process logger (the pid one for ``workers``)."""
    torch_logger = logging.getLogger(TORCH_PROCESS_LOGGER)
    torch_logger.addFilter(_WorkerPidLogFilter(workers))
    torch_logger.addFilter(_wrong_rank_filter)
