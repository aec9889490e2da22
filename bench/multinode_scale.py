"""Crash -> every surviving node's workers back in the process group, for 2, 3 and 4 nodes.

Needs the multi-node SLURM cluster of ``make test-cluster`` running (4 nodes), e.g.::

    flock /tmp/ptlr-slurm-cluster.lock bash -c 'SLURM_CLUSTER_NODES=4 bash $T/start.sh &&
        .venv/bin/python bench/multinode_scale.py; bash $T/stop.sh'      # T: the cluster scripts

For N nodes it submits ``tests/cluster/ft_job.sbatch`` with ``--nnodes N-1:N`` (one rank per
node, gloo), waits for training, crashes node N with the cluster's ``fault.sh crash`` and
measures the time until every survivor's new workers completed their first collective
(``pg_ready`` in the job's timeline). "warm": ft_launcher's default warm restarts (a template
that imported torch forks the workers); "cold": ``--no-warm-restarts``. Prints a markdown table
with the 1-minute load average next to each figure (the "nodes" share this machine's cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["PTLR_CLUSTER_TESTS"] = "1"

from tests.cluster.conftest import ClusterRun, _cluster, wait_for  # noqa: E402


def crash_recovery(nodes: int, warm: bool, tmp: Path) -> tuple[float, float]:
    env, names, why = _cluster()
    if env is None:
        sys.exit(f"no cluster: {why}")
    run = ClusterRun(tmp, env, names)
    try:
        cold = "" if warm else "--no-warm-restarts"
        run.submit(nodes=nodes, nnodes=f"{nodes - 1}:{nodes}", launcher_args=f"--max-restarts 3 {cold}",
                   train_args="--steps 100000 --step-time 0.05")
        wait_for(lambda: any(e["event"] == "saved" and e["step"] >= 20 for e in run.timeline()), 240,
                 "training to reach step 20")
        crash = run.fault("crash", f"node{nodes}")
        survivors = [f"node{i}" for i in range(1, nodes)]

        def back() -> list[float] | None:
            ready = {e["node"]: e["t"] for e in run.timeline() if e["event"] == "pg_ready" and e["t"] > crash}
            return [ready[n] for n in survivors] if all(n in ready for n in survivors) else None

        times = wait_for(back, 180, "the survivors to train again")
        return max(times) - crash, os.getloadavg()[0]
    finally:
        run.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for mode in ("warm", "cold"):
        for nodes in args.nodes:
            results = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(prefix="ptlr-scale-") as tmp:
                    results.append(crash_recovery(nodes, mode == "warm", Path(tmp)))
                print(f"{mode} {nodes} nodes: {results[-1][0]:.1f} s (load {results[-1][1]:.1f})", flush=True)
            rows.append((mode, nodes, [r[0] for r in results], [r[1] for r in results]))
    print("\n| restart | nodes | crash -> survivors in the process group (s) | load (1 min) |")
    print("|---|---|---|---|")
    for mode, nodes, times, loads in rows:
        shown = ", ".join(f"{t:.1f}" for t in times)
        med = f" (median {statistics.median(times):.1f})" if len(times) > 1 else ""
        print(f"| {mode} | {nodes} | {shown}{med} | {', '.join(f'{x:.1f}' for x in loads)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
