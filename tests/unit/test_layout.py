"""Issue 20 item 6: the folders show the runtimes, and the monitor stays stdlib-only.

The rank monitor is a separate small process so that it survives what the rank does; it must
never load torch (hundreds of MB, seconds of start-up) nor the rank-side client. These tests
import each runtime in a fresh interpreter in which ``import torch`` fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A fresh interpreter in which importing torch (or anything under it) raises ImportError.
BLOCK_TORCH = """
import importlib.abc, json, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
        return None
sys.meta_path.insert(0, _Block())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("ft_core", "launcher", "torch"))))
"""


def _import_fresh(*modules: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, *modules], cwd=REPO, capture_output=True, text=True,
        timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _package_modules(package: str) -> list[str]:
    folder = REPO / package.replace(".", "/")
    return [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]


@pytest.mark.timeout(120)
def test_the_monitor_package_imports_with_torch_blocked_and_loads_no_client():
    loaded = _import_fresh(*_package_modules("ft_core.monitor"))
    assert "ft_core.monitor.server" in loaded
    assert not [m for m in loaded if m.startswith("ft_core.client")], loaded
    assert not [m for m in loaded if m.startswith("torch")], loaded


@pytest.mark.timeout(120)
def test_the_wire_package_imports_nothing_of_the_other_runtimes():
    loaded = _import_fresh(*_package_modules("ft_core.wire"))
    assert not [m for m in loaded if m.startswith(("ft_core.client", "ft_core.monitor", "torch"))]


@pytest.mark.timeout(120)
def test_the_client_and_public_paths_import_without_torch():
    loaded = _import_fresh("ft_core", "ft_core.integration", *_package_modules("ft_core.client"))
    assert not [m for m in loaded if m.startswith("torch")], loaded


def test_ft_core_top_level_holds_only_public_paths():
    # Reference module paths and our documented ones are thin aliases; code lives in subpackages.
    top = sorted(p.stem for p in (REPO / "ft_core").glob("*.py"))
    assert top == ["__init__", "config", "data", "integration", "rank_monitor_client",
                   "rank_monitor_server", "simulated_fault", "timeouts_calc"]
    for stem in top[1:]:
        text = (REPO / "ft_core" / f"{stem}.py").read_text()
        assert "sys.modules[__name__] = _module" in text, stem


def test_a_public_path_is_the_same_module_as_its_home():
    import ft_core.config
    import ft_core.integration
    import ft_core.rank_monitor_server
    import ft_core.wire.config
    from ft_core.client import integration
    from ft_core.monitor import server

    assert ft_core.integration is integration
    assert ft_core.config is ft_core.wire.config
    assert ft_core.rank_monitor_server is server


def test_launchers_documented_paths_are_the_modules_in_their_folders():
    # launcher/ is in folders by concern (issue 30); the paths users and installs name stay
    import launcher.events.records
    import launcher.events.report
    import launcher.records
    import launcher.rendezvous.plugin
    import launcher.rendezvous_plugin
    import launcher.report

    assert launcher.records is launcher.events.records
    assert launcher.records.read_events is launcher.events.records.read_events
    assert launcher.report is launcher.events.report and callable(launcher.report.main)
    assert launcher.rendezvous_plugin is launcher.rendezvous.plugin
    assert launcher.rendezvous_plugin.torchrun_handler() is launcher.rendezvous.plugin.create_ft_barrier_handler


def test_launchers_top_level_holds_the_run_and_the_documented_paths():
    top = sorted(p.stem for p in (REPO / "launcher").glob("*.py"))
    assert top == ["__init__", "__main__", "agent", "agent_phase", "attempt_result", "autoresume", "clean_end",
                   "cli", "exit_codes", "launch", "launch_config", "options", "records", "rendezvous_plugin",
                   "report", "torch_compat"]
    for stem in ("records", "rendezvous_plugin", "report"):
        assert "sys.modules[__name__] = _module" in (REPO / "launcher" / f"{stem}.py").read_text(), stem


@pytest.mark.timeout(120)
def test_python_m_launcher_report_runs_ft_report(tmp_path):
    out = subprocess.run([sys.executable, "-m", "launcher.report", str(tmp_path / "missing.jsonl")], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "ft_report" in out.stderr, out.stderr
