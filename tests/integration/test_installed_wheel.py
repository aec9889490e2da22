"""The package as users install it: the built wheel and the sdist, in a venv with torch and Lightning.

Every other test imports the checkout, which hides a module the wheel leaves out (the hand-written
package list once left ``ft_core.straggler`` out: ``import ptl_resiliency`` failed from the wheel).
Here the wheel and the sdist are built from a copy of the sources and installed, one after the
other, into one new venv that has torch and Lightning from the package index. From each, away from
the checkout:

* every module of the source tree imports, and from the installed copy;
* a 2-rank Lightning DDP job (gloo, CPU) with a fault tolerance callback and
  ``StragglerDetectionCallback`` trains to the end under the installed ``ft_launcher``: the
  finished flag is written and a straggler report is logged.

About two minutes on 2 cores: most of it is installing torch and Lightning into the venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("ft_core", "launcher", "ptl_resiliency")
SOURCE_FILES = ("pyproject.toml", "setup.py", "README.md")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def source_modules() -> list[str]:
    """Every module of the source tree, by dotted name (``launcher.scripts`` is data, not code)."""
    names = []
    for root in PACKAGE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell with only ``venv`` on PATH and nothing of this checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTORESUME_", "FT_LAUNCHER", "FAULT_TOL_", "SLURM_", "PYTHON", "VIRTUAL_ENV",
                                "PYTEST_", "TORCHELASTIC_"))}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1")
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built from a copy of the sources (no build output in the checkout)."""
    base = tmp_path_factory.mktemp("build")
    source = base / "src"
    source.mkdir()
    for name in SOURCE_FILES:
        shutil.copy(REPO / name, source / name)
    for name in (*PACKAGE_ROOTS, "scripts"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    dist = base / "dist"
    # --no-isolation: the dev venv's setuptools; an isolated build would fetch it from the index
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, cwd=base, timeout=300)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory) -> Path:
    """A new venv with this checkout's torch and Lightning versions, installed from the package index."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    import torch  # noqa: PLC0415 - the dev venv's version is the one the suite is known to pass with

    pins = [f"torch=={torch.__version__.split('+')[0]}", f"lightning=={importlib.metadata.version('lightning')}"]
    run([str(venv / "bin" / "pip"), "install", "-q", *pins], env=clean_env(venv), cwd=venv, timeout=600)
    return venv


IMPORT_ALL = r"""
import importlib, importlib.util, json, sys
bad = {}
for name in json.loads(sys.argv[1]):
    try:
        if name.endswith("__main__"):  # running it would start the program: only find it
            origin = importlib.util.find_spec(name).origin
        else:
            origin = importlib.import_module(name).__file__
    except BaseException as e:
        bad[name] = f"{type(e).__name__}: {e}"
        continue
    if not origin.startswith(sys.prefix + "/"):
        bad[name] = "imported from " + origin
print(json.dumps(bad))
"""

TRAIN = r"""
import logging, os, sys
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from ptl_resiliency import FaultToleranceCallback, FaultToleranceSectionsCallback, StragglerDetectionCallback

logging.basicConfig(level=logging.INFO)
run_dir, kind = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
ft = (FaultToleranceCallback if kind == "heartbeats" else FaultToleranceSectionsCallback)(
    autoresume=True, calculate_timeouts=True, exp_dir=run_dir)
stragglers = StragglerDetectionCallback(report_time_interval=1.0, min_samples=1, stop_if_detected=False)
trainer = Trainer(default_root_dir=run_dir, accelerator="cpu", strategy="ddp",
                  devices=int(os.environ["LOCAL_WORLD_SIZE"]), plugins=[TorchElasticEnvironment()],
                  max_steps=400, logger=False, enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False, limit_val_batches=0, num_sanity_val_steps=0,
                  callbacks=[ft, stragglers])
trainer.fit(BoringModel())
torch.distributed.destroy_process_group()
"""


def install(venv: Path, artifact: Path) -> None:
    """Replaces whatever ptl-resiliency the venv has with ``artifact`` (its dependencies are there)."""
    pip = str(venv / "bin" / "pip")
    env = clean_env(venv)
    subprocess.run([pip, "uninstall", "-q", "-y", "ptl-resiliency"], env=env, cwd=venv, timeout=120,
                   capture_output=True)
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import ft_core"], env=env, cwd=venv,
                           capture_output=True, timeout=60)
    assert found.returncode != 0, "the previous install left ft_core behind"
    # --no-build-isolation: the sdist builds with the venv's own setuptools, as pip in a closed
    # cluster network would (the venv has no setuptools: give it the one pip uses)
    run([pip, "install", "-q", "setuptools>=64"], env=env, cwd=venv, timeout=300)
    run([pip, "install", "-q", "--no-build-isolation", f"{artifact}[lightning]"], env=env, cwd=venv, timeout=600)


def check_installed(venv: Path, kind: str, workdir: Path) -> None:
    env = clean_env(venv)
    workdir.mkdir()
    out = run([str(venv / "bin" / "python"), "-c", IMPORT_ALL, json.dumps(source_modules())], env=env, cwd=workdir,
              timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}, out.stdout

    script = workdir / "train.py"
    script.write_text(TRAIN)
    run_dir = workdir / "run"
    run_dir.mkdir()
    flag = run_dir / "finished.flag"
    # the sections API sends no heartbeats: its heartbeat timeouts are off (docs/lightning.md)
    if kind == "heartbeats":
        timeouts = ["--ft-param-initial_rank_heartbeat_timeout=120", "--ft-param-rank_heartbeat_timeout=60"]
    else:
        timeouts = ["--ft-param-initial_rank_heartbeat_timeout=null", "--ft-param-rank_heartbeat_timeout=null",
                    "--ft-param-rank_section_timeouts=setup:600,step:180,checkpointing:420",
                    "--ft-param-rank_out_of_section_timeout=300"]
    launch = [str(venv / "bin" / "ft_launcher"), "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
              *timeouts, str(script), str(run_dir), kind]
    out = subprocess.run(launch, env={**env, "FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}, cwd=workdir,
                         capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, f"ft_launcher exited {out.returncode}:\n{log[-6000:]}"
    assert flag.exists(), log[-4000:]
    assert "straggler report" in log, log[-4000:]


def test_source_modules_are_found():
    # A guard on the helper itself: an empty list would make the import check pass vacuously.
    modules = source_modules()
    assert {"ft_core.straggler.detector", "ptl_resiliency.straggler_det_callback", "launcher.resume.policy"} <= set(
        modules)
    assert len(modules) > 100


def test_the_wheel_and_the_sdist_import_every_module_and_train(artifacts, user_venv, tmp_path):
    # one test for both: they share the venv (torch and Lightning installed once), one after the other
    for kind, (artifact_name, ft_kind) in {"wheel": ("wheel", "heartbeats"), "sdist": ("sdist", "sections")}.items():
        install(user_venv, artifacts[artifact_name])
        check_installed(user_venv, ft_kind, tmp_path / kind)
