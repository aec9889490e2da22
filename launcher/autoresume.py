"""``ft_autoresume``: ``scripts/autoresume.sh``, installed with the package.

An sbatch script can then run ``ft_autoresume [OPTIONS] -- train.py ...`` without a checkout of
this repository. The console entry point replaces itself (``exec``) with ``bash autoresume.sh``,
so the loop keeps this process's pid: SLURM's ``--signal=B:USR1@...`` reaches it as it would
reach the script. Standard library only: it runs before anything else is imported.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SCRIPT_NAME = "autoresume.sh"
LAUNCHER_ENV_VAR = "FT_LAUNCHER"  # autoresume.sh's --launcher variable
PYTHON_ENV_VAR = "AUTORESUME_PYTHON"  # the interpreter autoresume.sh runs launcher.resume with


def script_path() -> Path:
    """The ``autoresume.sh`` this installation ships.

    In a wheel install it is package data, ``launcher/scripts/autoresume.sh``; in a checkout
    (editable install) it is ``scripts/autoresume.sh`` next to the ``launcher`` package.

    Raises:
        FileNotFoundError: Neither exists (a broken installation); the message names both.
    """
    here = Path(__file__).resolve().parent
    candidates = (here / "scripts" / SCRIPT_NAME, here.parent / "scripts" / SCRIPT_NAME)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{SCRIPT_NAME} is missing from this installation (looked at "
                            f"{', '.join(str(c) for c in candidates)}); reinstall ptl-resiliency")


def main(argv: list[str] | None = None) -> None:
    """Run ``autoresume.sh`` with ``argv`` (default: this process's arguments); never returns.

    Unless ``--launcher`` or ``FT_LAUNCHER`` says otherwise, the loop uses the ``ft_launcher``
    installed next to this entry point, so the job works without activating the environment.
    The script's decisions (``python -m launcher.resume``) run with this interpreter, which has
    this installation's ``launcher.resume``, unless ``AUTORESUME_PYTHON`` names another.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        script = script_path()
    except FileNotFoundError as err:
        print(f"ft_autoresume: error: {err}", file=sys.stderr)
        sys.exit(2)
    bash = shutil.which("bash")
    if bash is None:
        print("ft_autoresume: error: bash is not on PATH", file=sys.stderr)
        sys.exit(2)
    launcher = Path(sys.argv[0]).resolve().parent / "ft_launcher"
    if LAUNCHER_ENV_VAR not in os.environ and launcher.is_file() and os.access(launcher, os.X_OK):
        os.environ[LAUNCHER_ENV_VAR] = str(launcher)
    os.environ.setdefault(PYTHON_ENV_VAR, sys.executable)
    os.execv(bash, ["bash", str(script), *args])


if __name__ == "__main__":
    main()
