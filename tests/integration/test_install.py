"""Install: the package as a user gets it, without this checkout.

* ``ft_core`` and ``ft_launcher`` need no Lightning; ``import ptl_resiliency`` without it says how
  to install it.
* A wheel built and installed as the README's Install section says, into a fresh venv (with
  ``--no-deps``: no torch, no Lightning there): ``ft_autoresume`` runs the packaged ``autoresume.sh`` (an
  sbatch script needs no checkout) with that venv's ``ft_launcher`` by default, and
  ``ft_report`` reads an event log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_LIGHTNING = "import sys; sys.modules['lightning'] = None; sys.modules['pytorch_lightning'] = None\n"


def python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_ptl_resiliency_without_lightning_says_how_to_install_it():
    out = python(NO_LIGHTNING + "import ptl_resiliency")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ptl_resiliency (the Lightning callbacks) needs PyTorch Lightning, "
                           "which is not installed: pip install 'ptl-resiliency[lightning]'"), last


def test_ft_core_and_the_launcher_work_without_lightning():
    code = NO_LIGHTNING + (
        "import ft_core, ft_core.client.integration, ft_core.monitor.server, ft_core.client.run_errors\n"
        "import launcher.cli, launcher.launch, launcher.agent, launcher.events.report\n"
        "launcher.cli.get_args_parser().format_help()\n"
        "print('ok', [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')"
        " and sys.modules[m] is not None])\n")
    out = python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok []"


def readme_install_commands() -> list[str]:
    """The ``pip`` lines of the README's Install section, as written."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Install"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[:block.index("```")]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip().startswith("pip ")]


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A new venv with only the wheel built from these sources, as the README says.

    The README's wheel line runs as written (with the checkout's path); its install line too,
    plus ``--no-deps``: torch and Lightning are what the user's environment has (here none: a
    CUDA torch from PyPI is gigabytes).
    """
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("ft_core", "launcher", "ptl_resiliency", "scripts"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    commands = readme_install_commands()
    wheel_line = next(c for c in commands if c.startswith("pip wheel"))
    install_line = next(c for c in commands if c.startswith("pip install") and ".whl" in c)
    env = {**venv_env(venv), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for line in (wheel_line, install_line + " --no-deps"):
        out = subprocess.run(["bash", "-c", line.replace("/path/to/ptl-resiliency", str(source))], cwd=base,
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{line}:\n{out.stdout}\n{out.stderr}"
    shutil.rmtree(source)  # nothing of the sources is left to lean on
    return venv


def venv_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTORESUME_", "FT_LAUNCHER", "FAULT_TOL_", "SLURM_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return env


def test_the_wheel_ships_autoresume_and_the_entry_points(fresh_venv):
    for name in ("ft_launcher", "ft_report", "ft_autoresume"):
        assert (fresh_venv / "bin" / name).exists(), name
    out = subprocess.run([str(fresh_venv / "bin" / "python"), "-c",
                          "from launcher.autoresume import script_path; print(script_path())"],
                         capture_output=True, text=True, timeout=60, cwd="/", env=venv_env(fresh_venv))
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(fresh_venv)
    assert Path(out.stdout.strip()).read_bytes() == (REPO / "scripts" / "autoresume.sh").read_bytes()
    # torchrun's own registry finds ft-barrier (this venv has no torch: the plugin imports none)
    out = subprocess.run([str(fresh_venv / "bin" / "python"), "-c",
                          "from importlib.metadata import entry_points\n"
                          "(point,) = entry_points(group='torchrun.handlers', name='ft-barrier')\n"
                          "print(point.load()().__name__)"],
                         capture_output=True, text=True, timeout=60, cwd="/", env=venv_env(fresh_venv))
    assert (out.returncode, out.stdout.strip()) == (0, "create_ft_barrier_handler"), out.stderr


FAKE_LAUNCHER = """#!/bin/bash
# stands in for ft_launcher: the training command "finishes" on the second attempt
echo "fake launcher attempt $AUTORESUME_ATTEMPT: $*" >> "$AUTORESUME_RUN_DIR/launches.log"
if [ "$AUTORESUME_ATTEMPT" -ge 2 ]; then echo done > "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0; fi
exit 1
"""


def test_ft_autoresume_runs_the_loop_from_the_installed_package(fresh_venv, tmp_path):
    launcher = tmp_path / "fake_launcher"
    launcher.write_text(FAKE_LAUNCHER)
    launcher.chmod(0o755)
    run_dir = tmp_path / "run"
    out = subprocess.run([str(fresh_venv / "bin" / "ft_autoresume"), "--mode", "local", "--run-dir", str(run_dir),
                          "--launcher", str(launcher), "--", "train.py", "--lr", "0.1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=venv_env(fresh_venv))
    assert out.returncode == 0, out.stderr
    assert (run_dir / "finished.flag").exists()
    launches = (run_dir / "launches.log").read_text().splitlines()
    assert launches == ["fake launcher attempt 1: --standalone train.py --lr 0.1",
                        "fake launcher attempt 2: --standalone train.py --lr 0.1"]
    history = (run_dir / "history.tsv").read_text().splitlines()
    assert len(history) == 3 and history[-1].endswith("finished: flag file present")


def test_ft_autoresume_uses_its_own_venvs_ft_launcher_by_default(fresh_venv, tmp_path):
    # No torch in this venv, so that ft_launcher fails; what matters is which one was started.
    out = subprocess.run([str(fresh_venv / "bin" / "ft_autoresume"), "--mode", "local", "--run-dir",
                          str(tmp_path / "run"), "--max-failures", "1", "--", "train.py"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**venv_env(fresh_venv), "PATH": "/usr/bin:/bin"})  # not on PATH
    assert out.returncode == 1, out.stderr
    assert f"attempt 1: {fresh_venv / 'bin' / 'ft_launcher'} --standalone train.py" in out.stderr


def test_ft_report_from_the_installed_package(fresh_venv, tmp_path):
    events = tmp_path / "ft_events.jsonl"
    records = [{"event": "launcher_start", "ts": 1.0, "node": "n", "pid": 1, "run_id": "r"},
               {"event": "cycle_start", "ts": 2.0, "node": "n", "pid": 1, "run_id": "r", "cycle": 0},
               {"event": "workers_ready", "ts": 3.0, "node": "n", "pid": 1, "run_id": "r", "cycle": 0},
               {"event": "result", "ts": 11.0, "node": "n", "pid": 1, "run_id": "r", "outcome": "succeeded",
                "exit_code": 0}]
    events.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = subprocess.run([str(fresh_venv / "bin" / "ft_report"), str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=60, env=venv_env(fresh_venv))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["goodput"] == 0.8  # up 8 s of 10 s
