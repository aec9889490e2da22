"""Check the launcher's torch hooks against the sources of every supported torch release.

``make check-torch-versions`` runs this. For each version it downloads the Linux wheel once
(``pip download --no-deps``, about 0.9 GB each from PyPI), keeps only the Python sources the
launcher depends on (``torch/distributed/``, ``torch/version.py``: a few MB) in a cache, deletes
the wheel, and runs the static checks of :mod:`tests.torch_source_checks` on the extracted
sources. Nothing is installed and nothing is imported from those sources.

Usage::

    python -m tests.torch_versions [--cache DIR] [VERSION ...]

Exit status 0 when every version passes, 1 when one fails, 2 when one cannot be fetched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.torch_source_checks import run_checks  # noqa: E402

SUPPORTED = ("2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
"""The newest patch release of each torch minor the package supports (``pyproject.toml``: the last eight).

The releases differ in what the launcher hooks (``launcher/torch_compat.py``): before 2.12 the
agent has no shutdown timeout (``_shutdown(death_sig)``, no ``--shutdown-timeout``, no
``LaunchConfig.shutdown_timeout``; ``FaultTolerantAgent._shutdown`` bounds the stop itself),
before 2.10 no ``LaunchConfig.signals_to_handle`` (a fixed set), before 2.12 torchrun's ``--master-port``
defaults to 29500; ``WorkerSpec`` gained fields in 2.9 and 2.10. The checks expect each
release's own shape."""
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ptl-resiliency" / "torch-src"
KEEP = ("torch/distributed/", "torch/version.py")


def fetch(version: str, cache: Path) -> tuple[Path, dict]:
    """Extracted sources of torch ``version`` (downloaded on first use) and the download facts.

    Raises:
        RuntimeError: pip could not download the wheel (its output is in the message).
    """
    root = cache / version
    stamp = root / "download.json"
    if stamp.exists():
        return root, json.loads(stamp.read_text())
    with tempfile.TemporaryDirectory(prefix="torch-wheel-") as tmp:
        started = time.monotonic()
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", tmp,
                   f"torch=={version}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        wheels = list(Path(tmp).glob("torch-*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download torch=={version} failed:\n{done.stdout}\n{done.stderr}")
        wheel = wheels[0]
        partial = cache / f".{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith(KEEP) and m.endswith(".py")]
            archive.extractall(partial, members)
        facts = {"version": version, "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size,
                 "download_s": round(seconds, 1), "python_files": len(members)}
        (partial / "download.json").write_text(json.dumps(facts, indent=1) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    return root, facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="*", default=list(SUPPORTED), metavar="VERSION")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"default {DEFAULT_CACHE}")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    status = 0
    for version in args.versions:
        try:
            root, facts = fetch(version, args.cache)
        except RuntimeError as err:
            print(f"torch {version}: cannot fetch: {err}", flush=True)
            status = max(status, 2)
            continue
        problems = run_checks(root)
        size = facts["wheel_bytes"] / 1e6
        verdict = "ok" if not problems else f"{len(problems)} problem(s)"
        print(f"torch {version}: {verdict} ({facts['python_files']} source files from {facts['wheel']}, "
              f"{size:.0f} MB, downloaded in {facts['download_s']} s)", flush=True)
        for problem in problems:
            print(f"  - {problem}", flush=True)
        if problems:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
