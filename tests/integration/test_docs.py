"""The user-facing docs, read as a user reads them: snippets run as written, claims hold.

* docs/lightning.md's quick start (script and command as written) run three times in a row: the
  timeouts the first run calculated are the ones the next two runs start with.
* Under ft_launcher Lightning uses TorchElasticEnvironment even with SLURM's variables set, and
  installs no SIGUSR1 requeue handler (docs/lightning.md, "Under ft_launcher and SLURM").
* One set of overhead figures: README and docs/lightning.md quote docs/benchmarks.md.
* No internal references (the specification's file names, issue numbers) in user-facing files.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.launcher_util import events_of, launcher_env, live_descendants, read_events, run_launcher

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
LIGHTNING_WORKER = REPO / "tests" / "workers" / "lightning_train.py"


def fenced_blocks(markdown: str, heading: str, language: str) -> list[str]:
    """Code blocks of ``language`` in the section that starts at ``heading``."""
    section = markdown[markdown.index(heading):]
    following = re.search(r"\n## ", section[len(heading):])
    section = section[:len(heading) + following.start()] if following else section
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


# ---------------------------------------------------------------------- the quick start


def worker_pid(launcher_pid: int, rank: int) -> int | None:
    for pid in live_descendants(launcher_pid):
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if f"RANK={rank}".encode() in environ and b"train.py" in cmdline and b"trampoline" not in cmdline:
                return pid
    return None


def heartbeat_metrics(cwd: Path) -> list[tuple[str, dict[str, str]]]:
    """Every logged row with ft/ timeouts, by version directory (one per run or restart)."""
    rows = []
    for path in sorted(cwd.glob("lightning_logs/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        with open(path, newline="") as stream:
            rows += [(path.parent.name, row) for row in csv.DictReader(stream) if row.get("ft/heartbeat_timeout")]
    return rows


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quick_start_keeps_its_calculated_timeouts_across_runs(tmp_path):
    text = (DOCS / "lightning.md").read_text()
    [script] = fenced_blocks(text, "## Quick start (heartbeats)", "python")
    [command] = fenced_blocks(text, "## Quick start (heartbeats)", "bash")
    (tmp_path / "train.py").write_text(script)
    private_tmp = Path(tempfile.mkdtemp(prefix="qs-"))
    env = launcher_env({"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TMPDIR": str(private_tmp),
                        "PYTHONWARNINGS": "ignore"})

    def run(kill_rank_1: bool) -> str:
        proc = subprocess.Popen(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            if kill_rank_1:
                # An in-job restart: rank 1 dies once a checkpoint exists; the restarted workers
                # load it, train to the end, save, and calculate the heartbeat timeouts.
                deadline = time.monotonic() + 240
                while not (tmp_path / "ckpt" / "last.ckpt").exists() and proc.poll() is None:
                    assert time.monotonic() < deadline, "no checkpoint within 240 s"
                    time.sleep(0.05)
                pid = worker_pid(proc.pid, 1)
                assert pid is not None and proc.poll() is None, "rank 1 not found (training too fast?)"
                os.kill(pid, signal.SIGKILL)
            output, _ = proc.communicate(timeout=400)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == 0, output[-5000:]
        return output

    try:
        first = run(kill_rank_1=True)
        assert "restarting the worker group (restart 1/3)" in first
        state = tmp_path / "ft_state" / "_ft_state.json"
        assert state.exists(), sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))[:50]
        calculated = json.loads(state.read_text())["hb_timeouts"]
        assert calculated["were_calculated"] is True
        for _ in range(2):  # started the same way again (a finished flag makes no difference here)
            (tmp_path / "finished.flag").unlink(missing_ok=True)
            run(kill_rank_1=False)
        versions = heartbeat_metrics(tmp_path)
        # every run logs the timeouts in force at its start: the last two runs (the last two
        # version directories) start with the calculated ones, not the command's 1800/600
        last_two = sorted({version for version, _ in versions}, key=lambda v: int(v[8:]))[-2:]
        assert len(last_two) == 2
        for version in last_two:
            first_row = next(row for v, row in versions if v == version)
            assert float(first_row["ft/heartbeat_timeout"]) == pytest.approx(calculated["subsequent"]), versions
            assert float(first_row["ft/initial_heartbeat_timeout"]) == pytest.approx(calculated["initial"])
        assert calculated["subsequent"] != 600.0
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


# ---------------------------------------------------------------------- Lightning under ft_launcher


def test_lightning_uses_torchelastic_not_slurm_under_ft_launcher(tmp_path):
    # As inside an sbatch job step: SLURM's variables are set, the job is not interactive.
    slurm = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_JOB_NAME": "train", "SLURM_NNODES": "1"}
    cfg = {"callback": "heartbeats", "root": str(tmp_path), "max_steps": 2, "ddp": True}
    events = tmp_path / "events.jsonl"
    out = run_launcher(["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.1",
                        "--ft-event-log", str(events), str(LIGHTNING_WORKER), json.dumps(cfg)],
                       timeout=180, env=slurm)
    assert out.returncode == 0, out.stderr
    assert events_of(read_events(events), "result")[0]["outcome"] == "succeeded"
    started = next(json.loads(line) for line in (tmp_path / "report_rank0_cycle0.jsonl").read_text().splitlines()
                   if json.loads(line)["op"] == "started")
    assert started["cluster_environment"] == "TorchElasticEnvironment"
    assert "SignalConnector" not in started["sigusr1_handler"] and "slurm" not in started["sigusr1_handler"].lower()


# ---------------------------------------------------------------------- figures and wording


def overhead_row(path: Path, label: str) -> str:
    return next(line for line in path.read_text().splitlines() if label in line)


def test_one_set_of_overhead_figures():
    bench = (DOCS / "benchmarks.md").read_text()
    section = bench[bench.index("## 5. Lightning step overhead"):bench.index("## 6.")]

    def figure(callback: str, tool: str, column: int) -> str:
        row = next(line for line in section.splitlines() if line.startswith(f"| `{callback}` | {tool} |")
                   or line.startswith(f"| {callback} | {tool} |"))
        return row.split("|")[column].strip().split(" ")[0]

    heartbeat = figure("FaultToleranceCallback", "ours", 3)
    sections = figure("FaultToleranceSectionsCallback", "ours", 3)
    nvrx_hb = figure("FaultToleranceCallback", "NVRx", 3)
    nvrx_sections = figure("FaultToleranceSectionsCallback", "NVRx", 3)
    readme = overhead_row(REPO / "README.md", "Lightning step overhead")
    assert f"{heartbeat} µs / {sections} µs" in readme and f"{nvrx_hb} µs / {nvrx_sections} µs" in readme, readme
    lightning = (DOCS / "lightning.md").read_text()
    heartbeat_own_code = figure("FaultToleranceCallback", "ours", 5)
    assert f"| `FaultToleranceCallback` | {heartbeat} µs | {heartbeat_own_code} µs |" in lightning
    assert f"| `FaultToleranceSectionsCallback` | {sections} µs |" in lightning
    assert f"| an empty `lightning.pytorch.Callback` | {figure('empty `Callback`', 'ours', 3)} µs |" in lightning
    assert f"| NVRx 0.4.1 `FaultToleranceCallback` | {nvrx_hb} µs |" in lightning


INTERNAL = re.compile(r"\bseeds? ?\d{3}\b|\bseeds/|\bissue ?\(?\d+\)?|/work/|\bhelper [A-Z]\b", re.I)
USER_FACING_DOCS = ["README.md", "docs/lightning.md", "docs/launcher.md", "docs/autoresume.md", "docs/integration.md",
                    "docs/security.md", "docs/benchmarks.md", "docs/multinode.md"]


def docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return [doc for doc in (ast.get_docstring(n) for n in nodes) if doc]


def test_no_internal_references_in_user_facing_files():
    found = []
    texts = [(name, (REPO / name).read_text()) for name in USER_FACING_DOCS]
    texts += [(str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / "examples").rglob("*"))
              if p.is_file() and p.suffix in (".py", ".yaml", ".md", ".sh", ".sbatch", "")]
    texts += [(f"{p.relative_to(REPO)} (docstrings)", "\n".join(docstrings(p)))
              for package in ("ft_core", "launcher", "ptl_resiliency") for p in sorted((REPO / package).glob("*.py"))]
    texts.append(("scripts/autoresume.sh", (REPO / "scripts" / "autoresume.sh").read_text()))
    for name, text in texts:
        found += [f"{name}: {match.group(0)!r}" for match in INTERNAL.finditer(text)]
    assert not found, found
