"""The Lightning callbacks' default timeouts state file is keyed to the run (issue 29, item 11):
an unrelated later job submitted from the same directory must not load another's timeouts."""

from __future__ import annotations

import os

import pytest

from ptl_resiliency._lightning import pl
from ptl_resiliency._training_state import default_state_dir, state_file_for_trainer

# (name, environment) -> the directory under root ("" = root itself), or an absolute directory
ROWS = [
    ("plain local run", {}, "ft_state"),
    ("SLURM job", {"SLURM_JOB_ID": "812"}, "ft_state/slurm-812"),
    ("another SLURM job: another file", {"SLURM_JOB_ID": "813"}, "ft_state/slurm-813"),
    ("array task", {"SLURM_JOB_ID": "820", "SLURM_ARRAY_JOB_ID": "819", "SLURM_ARRAY_TASK_ID": "1"},
     "ft_state/slurm-819_1"),
    ("auto-resume run wins over the job", {"SLURM_JOB_ID": "812", "AUTORESUME_RUN_DIR": "/runs/a"},
     "/runs/a/ft_state"),
    ("auto-resume run, local", {"AUTORESUME_RUN_DIR": "/runs/b"}, "/runs/b/ft_state"),
]


@pytest.mark.parametrize(("env", "expected"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_default_state_dir(env: dict[str, str], expected: str) -> None:
    assert default_state_dir("/work/exp", env) == os.path.join("/work/exp", expected)


def test_two_slurm_jobs_from_one_directory_do_not_share_the_file(tmp_path) -> None:
    trainer = pl.Trainer(default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    first = state_file_for_trainer(trainer, None, {"SLURM_JOB_ID": "1"})
    second = state_file_for_trainer(trainer, None, {"SLURM_JOB_ID": "2"})
    assert first != second
    assert first == str(tmp_path / "ft_state" / "slurm-1" / "_ft_state.json")
    # An explicit exp_dir is kept as given.
    assert state_file_for_trainer(trainer, str(tmp_path / "x"), {"SLURM_JOB_ID": "1"}) == \
        str(tmp_path / "x" / "_ft_state.json")
