"""bench/goodput_node_loss.py's parts: the loss's step, each node's command, the cost split, the
table, and killing a node's whole tree. The bench itself (three real launchers, a node lost, a spare
healed) runs in its quick mode in tests/integration/test_goodput_node_loss.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from bench import goodput_node_loss as bench


def test_the_loss_comes_after_the_first_checkpoint_at_a_seeded_step():
    steps = {bench.plan_node_loss(seed, 1200, 500) for seed in range(20)}
    assert len(steps) > 1 and all(550 <= s < 1180 for s in steps)
    assert bench.plan_node_loss(3, 1200, 500) == bench.plan_node_loss(3, 1200, 500)
    with pytest.raises(SystemExit, match="no step after the first checkpoint"):
        bench.plan_node_loss(0, 100, 500)


def test_only_node_a_hosts_the_store_and_only_the_given_faults_reach_a_node(tmp_path):
    peer = tmp_path / "peer" / "bin"
    peer.mkdir(parents=True)
    (peer / "ft_launcher").touch()
    args = argparse.Namespace(max_steps=300, checkpoint_every=100, step_time=0.01, rows=64, hb_timeout=5.0,
                              peer_python=str(peer / "python"))
    faults = [{"step": 150, "kind": "node"}]
    a = bench.node_command("ours_jit", args, "a", 1234, tmp_path, tmp_path / "a.jsonl", [])
    b = bench.node_command("ours_nojit", args, "b", 1234, tmp_path, tmp_path / "b.jsonl", faults)
    assert a[a.index("--rdzv-conf") + 1].endswith("is_host=true")
    assert b[b.index("--rdzv-conf") + 1].endswith("is_host=false")
    assert a[a.index("--ft-jit-state") + 1] == "true" and a[-1] == "--jit"
    assert b[b.index("--ft-jit-state") + 1] == "false" and "--jit" not in b
    assert json.loads(b[b.index("--faults") + 1]) == faults and json.loads(a[a.index("--faults") + 1]) == []
    assert b[b.index("--fault-rank") + 1] == "-1" and b[b.index("--nnodes") + 1] == "2"
    # NVRx's launcher: none of our options, the training with NVRx's client
    nvrx = bench.node_command("nvrx", args, "b", 1234, tmp_path, tmp_path / "b.jsonl", faults)
    assert nvrx[0] == str(peer / "ft_launcher") and nvrx[nvrx.index("--impl") + 1] == "nvrx"
    assert not {"--ft-jit-state", "--ft-event-log", "--warm-preload", "--jit"} & set(nvrx)


def test_detection_ends_at_the_survivors_restart_record_and_healing_is_split_off_the_restart():
    progress = [line.split() for line in [
        "start 1 100.0", "resume 1 0 scratch 110.0", "step 1 500 160.0", "ckpt 1 500 0.8 161.0", "step 1 620 175.0",
        "start 2 181.0", "resume 2 620 jit 190.0", "step 2 621 190.1",
    ]]
    fault = {"fault": 0, "kind": "node", "step": 620, "time": 175.0}
    events = [{"event": "failure", "role": "root", "detected_at": 20.0, "ts": 20.0},  # before the loss: ignored
              {"event": "restart", "ts": 177.0, "reason": "another node entered the rendezvous"},
              {"event": "state_saved", "ts": 177.5},
              {"event": "state_healed", "role": "sent", "ts": 179.0, "seconds": 1.5, "bytes": 10},
              {"event": "state_healed", "role": "received", "ts": 179.0, "seconds": 1.5, "bytes": 10}]
    (cost,) = bench.node_loss_costs(progress, fault, events)
    assert (cost["steps_lost"], cost["source"], cost["detection_s"], cost["save_s"]) == (0, "jit", 2.0, 0.5)
    assert (cost["heal_s"], cost["heal_bytes"], cost["restart_s"], cost["lost_s"]) == (1.5, 10, 11.0, 15.0)
    assert bench.node_loss_costs(progress, None, events) == []
    # without just-in-time state: resumed from the checkpoint, no healing, a failure record detects it
    progress[-2:] = [line.split() for line in ["resume 2 500 checkpoint 190.0", "step 2 620 196.0"]]
    (cost,) = bench.node_loss_costs(progress, fault, [{"event": "failure", "role": "collateral",
                                                       "detected_at": 176.0, "ts": 176.1}])
    assert (cost["steps_lost"], cost["detection_s"], cost["heal_s"], cost["redone_s"]) == (120, 1.0, None, 6.0)


def test_the_table_has_a_heal_row_and_one_column_per_tool():
    run = {"finished_flag": True, "goodput": 0.8, "median_step_s": 0.03, "faults_injected": 1,
           "spare_waiting_at_loss": True, "processes_left_behind": 0, "checkpoint_s": {"median": 0.7},
           "fault_costs": [{"steps_lost": 0, "source": "jit", "lost_s": 9.0, "detection_s": 1.0, "save_s": 0.5,
                            "heal_s": 2.0, "heal_bytes": 210e6, "restart_s": 5.5, "redone_s": 0.0}]}
    figures = {"ours_jit": bench.tool_figures([run], [dict(run, goodput=1.0, fault_costs=[], faults_injected=0)])}
    text = bench.table(figures)
    assert "| - heal (spare receives it from node a) | 2.0 s (210 MB) |" in text
    assert "| resumed from | jit |" in text and "| with the loss / fault-free | 0.8 |" in text


@pytest.mark.timeout(30)
def test_killing_a_node_kills_its_launcher_and_the_workers_in_sessions_of_their_own():
    # a "launcher" whose "worker" runs in a session of its own, as torch starts them
    launcher = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    worker = int(launcher.stdout.readline())
    try:
        victims = bench.kill_node(launcher.pid)
        assert launcher.pid in victims and worker in victims
        assert launcher.wait(10) == -9
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and bench._live(worker):
            time.sleep(0.05)
        assert not bench._live(worker)
    finally:
        for pid in (launcher.pid, worker):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        launcher.wait(10)
