"""The user-facing docs, read as a user reads them: snippets run as written, claims hold.

* docs/lightning.md's quick start (script and command as written) run three times in a row: the
  timeouts the first run calculated are the ones the next two runs start with.
* Under ft_launcher Lightning uses TorchElasticEnvironment even with SLURM's variables set, and
  installs no SIGUSR1 requeue handler (docs/lightning.md, "Under ft_launcher and SLURM").
* README's example command (``source .venv/bin/activate`` included) run as written: the frozen
  rank is caught against a calculated ``step`` timeout of about a second, as the text says.
* docs/integration.md's loop snippet and launch command run as written (8 ranks on CPU), the
  snippet's placeholders filled with a tiny model.
* docs/lightning.md's quoted ConfigError line is the line the launcher prints.
* docs/autoresume.md's rule for when the launcher gets ``--standalone``.
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

from tests.launcher_util import events_of, launcher_env, live_descendants, read_events, run_launcher, start_launcher

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


# ---------------------------------------------------------------------- commands as a user copies them


def run_in_scratch(command: str, workdir: Path, timeout: float) -> str:
    """Run ``command`` with bash in ``workdir``, where ``examples`` and ``.venv`` link to the
    repository's (``.venv``: this interpreter's environment); returns the output, fails on a
    non-zero exit or after ``timeout`` seconds. Nothing in the environment names a file: where
    the event log goes is the launcher's default (``ft_launcher_logs/`` of ``workdir``)."""
    (workdir / "examples").symlink_to(REPO / "examples")
    (workdir / ".venv").symlink_to(Path(sys.prefix))
    return run_bash(command, workdir, timeout)


def run_bash(command: str, workdir: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``command`` with bash in ``workdir`` (this venv's ``bin`` first on ``PATH``, as for a user
    with the venv activated); returns stdout and stderr, fails on a non-zero exit or a timeout."""
    full_env = launcher_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                             **(env or {})})
    full_env.pop("FAULT_TOL_FINISHED_FLAG_FILE", None)
    full_env.pop("AUTORESUME_RUN_DIR", None)
    proc = subprocess.Popen(["bash", "-c", command], cwd=workdir, env=full_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{command!r} did not finish in {timeout} s:\n{output[-5000:]}") from None
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{output[-6000:]}"
    return output


def docstring_command(script: Path) -> str:
    """The indented command block of an example's docstring (what tests/integration/test_examples.py runs)."""
    doc = ast.get_docstring(ast.parse(script.read_text()))
    assert doc is not None
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("::")) + 1
    block = [line.strip() for line in lines[start:] if line.startswith("    ") or not line.strip()]
    return "\n".join(block).strip().split("\n\n")[0]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_readme_example_runs_as_written(tmp_path):
    [command] = fenced_blocks((REPO / "README.md").read_text(), "## Examples", "bash")
    assert command.startswith("source .venv/bin/activate\n")
    # the same command as the example's docstring (test_examples.py runs that one too; CI runs this)
    documented = docstring_command(REPO / "examples" / "train_loop_integration.py")
    assert command.split("\n", 1)[1].split() == documented.split()
    assert Path(sys.prefix, "bin", "activate").exists(), "run the docs tests from a virtual environment"
    output = run_in_scratch(command, tmp_path, timeout=170)
    events = read_events(tmp_path / "ft_launcher_logs" / "ft_events.jsonl")
    assert events_of(events, "result")[-1]["outcome"] == "succeeded"
    assert "simulated fault rank_hung: sending SIGSTOP" in output
    hangs = [f for f in events_of(events, "failure") if f["cause_kind"] == "hang"]
    assert hangs and {f["cycle"] for f in hangs} == {0}, output[-6000:]
    # "a step timeout of about a second, so the frozen rank is caught at once", not the 60 s minimum
    assert all(f["timeout"] < 10 for f in hangs if f.get("timeout") is not None), hangs
    assert any(f.get("timeout") is not None for f in hangs), hangs
    state = json.loads((tmp_path / "runs" / "loop_integration" / "checkpoints" / "_ft_state.json").read_text())
    assert state["section_timeouts"]["calculated_sections"]


# The snippet's placeholders, filled with the least that runs: a linear model, a few batches,
# a checkpoint file per save. The snippet itself is pasted below this prelude unchanged, but for
# its process group's arguments.
INTEGRATION_PRELUDE = """
import os
import sys
import torch
import torch.distributed as dist

checkpoint_dir = sys.argv[1]
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.randn(2, 4) for _ in range(20)]
eval_data = data[:2]
first_step, eval_every, save_every = 1, 10, 5


def load_checkpoint(directory):
    return os.path.exists(os.path.join(directory, "model.pt"))


def train_step(batch):
    optimizer.zero_grad()
    model(batch).sum().backward()
    optimizer.step()


def eval_step(batch):
    with torch.no_grad():
        model(batch)


def save_checkpoint(directory):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), os.path.join(directory, "model.pt"))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_loop_integration_snippet_and_command_run_as_written(tmp_path):
    text = (DOCS / "integration.md").read_text()
    heading = "## `ft_core.integration`: a plain training loop"
    snippet = fenced_blocks(text, heading, "python")[0]  # the first of each, before "### What is watched"
    command = fenced_blocks(text, heading, "bash")[0]
    assert "dist.init_process_group(...)" in snippet
    snippet = snippet.replace("dist.init_process_group(...)", 'dist.init_process_group("gloo")')
    (tmp_path / "train.py").write_text(INTEGRATION_PRELUDE + snippet)
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    # The command as written; the script's own argument (its checkpoint directory) appended.
    assert command.rstrip().endswith("train.py")
    output = run_in_scratch(command.rstrip() + f" {checkpoints}", tmp_path, timeout=260)
    events = read_events(tmp_path / "ft_launcher_logs" / "ft_events.jsonl")
    [result] = events_of(events, "result")
    assert result["outcome"] == "succeeded" and not events_of(events, "failure"), output[-6000:]
    [start] = events_of(events, "launcher_start")
    assert start["nproc_per_node"] == 8
    assert start["config"]["initial_rank_heartbeat_timeout"] is None
    state = json.loads((checkpoints / "_ft_state.json").read_text())
    assert "step" in state["section_timeouts"]["calculated_sections"]


CONFIG_ERROR_WORKER = """
import logging
from ft_core.client.setup_errors import stop_job_for_setup_error
from ft_core.wire.config import ConfigError

# What the Lightning callbacks do with a setup error: ask for ShutdownWorkload, then raise it.
error = ConfigError("FaultToleranceCallback(autoresume=True) needs FAULT_TOL_FINISHED_FLAG_FILE: set it")
stop_job_for_setup_error(error, logging.getLogger("worker"))
raise error
"""


def test_the_quoted_config_error_line_is_the_launchers(tmp_path):
    text = (DOCS / "lightning.md").read_text()
    section = text[text.index("A `ConfigError` is a setup error that no restart can fix"):]
    quoted = re.search(r"```\n(\[ft_launcher\][^\n]*)\n```", section).group(1)
    # the quote's pid and "..." stand for anything
    pattern = re.escape(quoted).replace(r"pid\ 812", r"pid\ \d+").replace(r"\.\.\.", ".*")
    script = tmp_path / "worker.py"
    script.write_text(CONFIG_ERROR_WORKER)
    proc = start_launcher(["--standalone", "--nproc-per-node", "1", "--no-warm-restarts", "--ft-event-log", "none",
                           str(script)])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 64, err[-4000:]
    lines = [line for line in err.splitlines() if line.startswith("[ft_launcher] cycle 0:")]
    assert any(re.fullmatch(pattern, line) for line in lines), (quoted, lines)


def test_autoresume_md_says_when_the_launcher_gets_standalone(tmp_path, monkeypatch):
    from launcher.resume import options

    sentence = " ".join((DOCS / "autoresume.md").read_text().split())
    assert "nor any `-a` is given, the launcher gets `--standalone`" in sentence
    monkeypatch.chdir(tmp_path)
    launcher = str(Path(sys.executable).parent / "ft_launcher")

    def launcher_args(*argv: str) -> list[str]:
        opts = options.from_environment({"FT_LAUNCHER": launcher})
        return options.validate(options.parse_args([*argv, "t.py"], opts), {}).launcher_args

    assert launcher_args() == ["--standalone"]
    assert launcher_args("-a", "--nproc-per-node=2") == ["--nproc-per-node=2"]  # -a alone: none added
    assert launcher_args("--launcher-args", "") == []


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
              for package in ("ft_core", "launcher", "ptl_resiliency") for p in sorted((REPO / package).rglob("*.py"))]
    texts.append(("scripts/autoresume.sh", (REPO / "scripts" / "autoresume.sh").read_text()))
    for name, text in texts:
        found += [f"{name}: {match.group(0)!r}" for match in INTERNAL.finditer(text)]
    assert not found, found
