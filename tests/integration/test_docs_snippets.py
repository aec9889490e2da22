"""The docs' remaining commands and snippets, run as a user copies them (test_docs.py runs the rest).

* docs/launcher.md: the first launch command (one node), and every ``ft_report`` command of
  "What happened in my run", on event logs that real runs made: autoresume's run directory (the
  local-mode command of docs/autoresume.md), a plain log with ``--plot``, a directory of per-node
  logs and two per-node files of a two-node (two launchers on this host) run.
* docs/autoresume.md: the workstation command (``scripts/autoresume.sh ... --run-dir runs/demo``),
  with a tiny training script at the path it names.
* docs/stragglers.md: the example, under ft_launcher with 2 ranks on CPU.
* docs/lightning.md: the snippets after the quick start (the sections callback, the graceful stop,
  the exception policy, the simulated fault, the process-group tear-down) in one 2-rank run.
* docs/integration.md: the graceful-stop loop and the simulated-fault call, 2 ranks.

What the user fills in (the doc marks it as theirs: ``...``, ``model``, ``train.py``, names the
snippet uses but does not define) is filled with the least that runs; nothing else is changed, and
each substitution asserts that the text it replaces is still in the doc. tests/unit/test_docs_blocks.py
lists every fenced block of README.md and docs/*.md and what covers it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_docs import INTEGRATION_PRELUDE, run_bash
from tests.launcher_util import events_of, read_events, start_launcher
from tests.unit.test_docs_blocks import block_containing

REPO = Path(__file__).resolve().parents[2]


def fill(text: str, placeholder: str, value: str) -> str:
    """``text`` with its one ``placeholder`` replaced; fails when the doc no longer has it once."""
    assert text.count(placeholder) == 1, f"the doc changed: {placeholder!r} is not in this block once:\n{text}"
    return text.replace(placeholder, value)


def commands(block: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


# ---------------------------------------------------------------------- ft_report and autoresume

# The training script of autoresume.md's command, at the path the command names: rank 1 fails the
# first attempt (autoresume.sh numbers them in AUTORESUME_ATTEMPT), then rank 0 creates the finished flag.
TINY_AUTORESUME_TRAINING = """
import argparse, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--run-dir", required=True)
parser.add_argument("--max-steps", type=int, required=True)
args = parser.parse_args()
first_attempt = os.environ["AUTORESUME_ATTEMPT"] == "1"
if os.environ["RANK"] == "1" and first_attempt:
    sys.exit("rank 1: a failure in the first attempt")
if os.environ["RANK"] == "0" and not first_attempt:
    open(os.environ["FAULT_TOL_FINISHED_FLAG_FILE"], "w").close()
"""

# launcher.md's train.py: takes the command's --lr; the group of a two-node run meets in a barrier.
TINY_TRAIN = """
import argparse, os
import torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float)
args = parser.parse_args()
if "NNODES2" in os.environ:
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_autoresume_local_command_and_ft_report_on_its_run_dir(tmp_path):
    autoresume_block = block_containing("docs/autoresume.md", "scripts/autoresume.sh --run-dir runs/demo")
    local = commands(autoresume_block)[0]
    assert local.startswith("scripts/autoresume.sh ") and "examples/slurm/train_lightning.py" in local
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    script = tmp_path / "examples" / "slurm" / "train_lightning.py"  # the user's training script
    script.parent.mkdir(parents=True)
    script.write_text(TINY_AUTORESUME_TRAINING)
    output = run_bash(local, tmp_path, timeout=150)
    run_dir = tmp_path / "runs" / "demo"
    assert (run_dir / "finished.flag").exists(), output[-4000:]
    history = (run_dir / "history.tsv").read_text().splitlines()
    assert len(history) == 3 and history[2].split("\t")[6] == "0", history  # header, a failure, the finish

    # launcher.md's ft_report commands on this run: "runs/a" is the user's run dir, "logs/" a log
    report_block = block_containing("docs/launcher.md", "ft_report runs/a ")
    by_path = {c.split()[1]: c for c in commands(report_block)}
    shutil.copytree(run_dir, tmp_path / "runs" / "a")
    (tmp_path / "logs").mkdir()
    shutil.copy(run_dir / "ft_events.jsonl", tmp_path / "logs" / "ft_events.jsonl")
    report = run_bash(by_path["runs/a"], tmp_path, timeout=60)
    assert "2 attempt(s), 2 launcher run(s)" in report and "finished: yes" in report, report
    assert "failures: 1 root cause(s)" in report, report
    plotted = run_bash(by_path["logs/ft_events.jsonl"], tmp_path, timeout=90)
    assert "timeline drawn to timeline.png" in plotted, plotted
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launcher_md_command_and_ft_report_on_per_node_logs(tmp_path):
    launch_block = block_containing("docs/launcher.md", "# one node, 2 workers")
    one_node = commands(launch_block)[0]
    assert one_node.endswith("train.py --lr 0.1"), one_node
    (tmp_path / "train.py").write_text(TINY_TRAIN)
    run_bash(one_node, tmp_path, timeout=90)
    [start] = events_of(read_events(tmp_path / "ft_launcher_logs" / "ft_events.jsonl"), "launcher_start")
    assert start["nproc_per_node"] == 2 and start["config"]["rank_heartbeat_timeout"] == 300

    # A two-node job: two launchers on this host, each with its node's log under runs/a/events/
    # ("--ft-event-log runs/a/events/{node}.jsonl"; {node}, the host name, is the same for both here).
    port = free_port()
    events = tmp_path / "runs" / "a" / "events"
    nodes = [start_launcher(["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"docs-{port}",
                             "--ft-event-log", str(events / f"{name}.jsonl"), str(tmp_path / "train.py")],
                            env={"NNODES2": "1"}, cwd=tmp_path) for name in ("n1", "n2")]
    try:
        for node in nodes:
            _, err = node.communicate(timeout=150)
            assert node.returncode == 0, err[-4000:]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.communicate()
    for name in ("n1", "n2"):
        shutil.copy(events / f"{name}.jsonl", tmp_path / f"{name}.jsonl")
    by_path = {c.split()[1]: c for c in commands(block_containing("docs/launcher.md", "ft_report runs/a "))}
    for path in ("runs/a/events", "n1.jsonl"):
        report = run_bash(by_path[path], tmp_path, timeout=60)
        assert "1 attempt(s), 2 launcher run(s)" in report, report  # one run, both nodes, one timeline
        assert report.count("ft_launcher started (run id") == 2, report


# ---------------------------------------------------------------------- Python snippets under ft_launcher


def launch(args: list[str], cwd: Path, timeout: float,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``ft_launcher ARGS`` in ``cwd`` to completion, bounded by ``timeout`` seconds."""
    proc = start_launcher(args, env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"ft_launcher did not finish in {timeout} s; stderr:\n{err[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

STRAGGLER_PRELUDE = """
import functools
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

# The user's own Trainer settings (the example shows only the callbacks): 2 CPU ranks, a few steps.
Trainer = functools.partial(pl.Trainer, accelerator="cpu", devices=2, max_steps=6, logger=False,
                            enable_progress_bar=False, enable_model_summary=False)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stragglers_md_example_runs_under_ft_launcher(tmp_path):
    snippet = block_containing("docs/stragglers.md", "StragglerDetectionCallback(report_time_interval=300")
    for used in ("Trainer(", "ModelCheckpoint("):
        assert used in snippet  # defined by the prelude: the snippet uses them without importing them
    script = tmp_path / "train.py"
    completion = "\ntrainer.fit(BoringModel())\nprint('fit done', trainer.global_step)\n"  # the user's model
    script.write_text(STRAGGLER_PRELUDE + snippet + completion)
    out = launch(["--standalone", "--nproc-per-node", "2", "--ft-event-log", "none", str(script)], tmp_path,
                 timeout=260)
    assert out.returncode == 0, out.stderr[-6000:]
    assert out.stdout.count("fit done 6") == 2, out.stdout[-3000:]


LIGHTNING_PRELUDE = """
import torch
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from ptl_resiliency import FaultToleranceCallback
from ft_core import WorkloadAction

model = BoringModel()  # the user's model
"""

# after the policy snippet: it does what its comments say
POLICY_CHECK = """
assert policy(ValueError("bad")).action == WorkloadAction.ShutdownWorkload
assert policy(RuntimeError("transient")) is None
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lightning_md_snippets_run_under_ft_launcher(tmp_path):
    doc = "docs/lightning.md"
    sections = block_containing(doc, "ft = FaultToleranceSectionsCallback(autoresume=True, calculate_timeouts=True)\n")
    policy = block_containing(doc, "def policy(exc: BaseException)")
    simulated = block_containing(doc, "SimulatedFaultParams(fault_type=\"rank_hung\"")
    graceful = block_containing(doc, "graceful_stop=True)")
    # the user's other Trainer arguments ("..."): 2 CPU ranks, a few steps
    graceful = fill(graceful, "pl.Trainer(...,", "pl.Trainer(accelerator='cpu', devices=2, max_steps=4, logger=False, "
                    "enable_progress_bar=False, enable_model_summary=False,")
    teardown = block_containing(doc, "torch.distributed.destroy_process_group()")
    script = tmp_path / "train.py"
    script.write_text("\n".join([LIGHTNING_PRELUDE, sections, policy, POLICY_CHECK, simulated, graceful, teardown,
                                 "print('done', trainer.global_step, torch.distributed.is_initialized())\n"]))
    out = launch(["--standalone", "--nproc-per-node", "2", "--ft-event-log", "none", str(script)], tmp_path,
                 timeout=260, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(tmp_path / "finished.flag")})
    assert out.returncode == 0, out.stderr[-6000:]
    assert out.stdout.count("done 4 False") == 2, out.stdout[-3000:]
    assert (tmp_path / "ckpt" / "last.ckpt").exists()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_integration_md_graceful_stop_and_simulated_fault_snippets_run(tmp_path):
    doc = "docs/integration.md"
    graceful = block_containing(doc, "ft_integration.setup(checkpoint_dir, calculate_timeouts=True, graceful_stop")
    simulated = block_containing(doc, "ft_integration.maybe_setup_simulated_fault(")
    setup_line, rest = graceful.split("\n", 1)
    assert setup_line.startswith("ft_integration.setup(")
    # the simulated fault is scheduled "after setup()", as its section says; in cycle 0 it is due
    # after 60-90 s, long after this run ends (shutdown() cancels it)
    prelude = INTEGRATION_PRELUDE + "import ft_core.integration as ft_integration\ndist.init_process_group('gloo')\n"
    script = tmp_path / "train.py"
    script.write_text("\n".join([prelude, setup_line, simulated, rest, "dist.destroy_process_group()",
                                 "print('done', step)\n"]))
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    # launched with the options of the section's command (2 ranks, not 8)
    [command] = commands(block_containing(doc, "ft_launcher --standalone --nproc-per-node 8"))
    options = fill(command, "--nproc-per-node 8", "--nproc-per-node 2").split()
    assert options[0] == "ft_launcher" and options[-1] == "train.py", options
    out = launch([*options[1:-1], "--ft-event-log", "none", str(script), str(checkpoints)], tmp_path, timeout=150)
    assert out.returncode == 0, out.stderr[-6000:]
    assert out.stdout.count("done 20") == 2, out.stdout[-3000:]
    # no stop was asked for: no stop checkpoint; shutdown() saved the calculated timeouts
    assert not (checkpoints / "model.pt").exists()
    assert "step" in json.loads((checkpoints / "_ft_state.json").read_text())["section_timeouts"]["calculated_sections"]
