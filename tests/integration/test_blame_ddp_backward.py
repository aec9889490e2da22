"""The root of a DDP hang is the rank that froze, not the peer waiting for it in ``backward`` (issue 31 item 7).

Under ``DistributedDataParallel`` the gradient all-reduce runs in C++ hooks inside
``loss.backward()``: a rank waiting for a frozen peer shows autograd's backward innermost, no
``torch.distributed`` frame. Both ranks miss their deadlines together (same step, last progress
milliseconds apart), and the rule used to fall through to the clocks and often named the waiting
rank. Real ft_launcher runs, 2 ranks, gloo on CPU: a plain loop with the sections API and with
heartbeats (tests/workers/ddp_blame_worker.py), and Lightning with both callbacks
(tests/workers/lightning_train.py); rank 1 sleeps inside a training step each time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launcher_util import events_of, read_events, run_launcher

WORKERS = Path(__file__).resolve().parents[1] / "workers"
DDP_WORKER = str(WORKERS / "ddp_blame_worker.py")
LIGHTNING_WORKER = str(WORKERS / "lightning_train.py")
TIMEOUT = "4"  # seconds: short, yet well above a step's time on a loaded machine
NULL_HEARTBEATS = ["--ft-param-initial_rank_heartbeat_timeout", "null", "--ft-param-rank_heartbeat_timeout", "null"]
HEARTBEATS = ["--ft-param-initial_rank_heartbeat_timeout", "60", "--ft-param-rank_heartbeat_timeout", TIMEOUT]

pytestmark = pytest.mark.timeout(120)


def launcher_args(tmp_path: Path, *ft_args: str) -> list[str]:
    # No restart: the failure records of cycle 0 are all the test needs. A rank blocked in a
    # gloo collective may not act on SIGTERM: a short --term-timeout SIGKILLs it soon.
    return ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--monitor-interval", "0.05",
            "--term-timeout", "2", "--ft-event-log", str(tmp_path / "events.jsonl"), *ft_args]


def assert_rank_1_is_the_root(tmp_path: Path, stderr: str, sleeping_in: str) -> None:
    failures = [f for f in events_of(read_events(tmp_path / "events.jsonl"), "failure") if f["cycle"] == 0]
    by_rank = {f["rank"]: f for f in failures}
    assert set(by_rank) == {0, 1}, failures
    root, peer = by_rank[1], by_rank[0]
    # the scenario is the one claimed: rank 1 sleeps in its own code, rank 0 waits in backward
    # (py-spy names a method Class.method, faulthandler the function alone)
    assert root["stack_frames"][0].rpartition(" ")[2].rpartition(".")[2] == sleeping_in, root
    assert "torch/autograd/" in peer["stack_frames"][0], peer
    assert root["role"] == "root" and peer["role"] == "collateral", failures
    assert peer["root_rank"] == 1, peer
    line = next(line for line in stderr.splitlines() if line.startswith("[ft_launcher] cycle 0: rank 1 ("))
    assert "rank 1 froze" in line and "rank 0 stopped waiting for it" in line, line
    peer_line = next(line for line in stderr.splitlines() if line.startswith("[ft_launcher] cycle 0: rank 0 ("))
    assert "stopped waiting for rank 1" in peer_line and "_engine_run_backward" in peer_line, peer_line


@pytest.mark.parametrize("lag", ["0", "0.4"], ids=["together", "root-progressed-later"])
@pytest.mark.parametrize("api", ["sections", "heartbeat"])
def test_plain_ddp_loop_blames_the_rank_sleeping_in_its_step_not_the_one_in_backward(tmp_path, api, lag):
    # "root-progressed-later": rank 1's last progress comes 0.4 s after rank 0's, so the clocks
    # alone point at rank 0 (rank 0 may also time out first, rank 1 still running).
    sections = NULL_HEARTBEATS + ["--ft-param-rank_section_timeouts", f"step:{TIMEOUT}"]
    ft = sections if api == "sections" else HEARTBEATS
    result = run_launcher(launcher_args(tmp_path, *ft) + [DDP_WORKER, "--dir", str(tmp_path), "--api", api,
                                                        "--lag", lag], timeout=100)
    assert result.returncode != 0, result.stderr[-4000:]
    assert_rank_1_is_the_root(tmp_path, result.stderr, "sleep_inside_step")


@pytest.mark.slow
@pytest.mark.parametrize("callback", ["heartbeats", "sections"])
def test_lightning_ddp_blames_the_rank_sleeping_in_training_step_not_the_one_in_backward(tmp_path, callback):
    cfg = {"callback": callback, "root": str(tmp_path / "run"), "ddp": True, "max_steps": 40, "ckpt_every": 0,
           "hang": {"where": "step", "step": 6, "rank": 1, "cycle": 0}}
    if callback == "sections":
        ft = NULL_HEARTBEATS + ["--ft-param-rank_section_timeouts", f"setup:60,step:{TIMEOUT},checkpointing:60",
                                "--ft-param-rank_out_of_section_timeout", "60"]
    else:
        ft = HEARTBEATS
    result = run_launcher(launcher_args(tmp_path, *ft) + [LIGHTNING_WORKER, json.dumps(cfg)], timeout=100)
    assert result.returncode != 0, result.stderr[-4000:]
    assert_rank_1_is_the_root(tmp_path, result.stderr, "training_step")
