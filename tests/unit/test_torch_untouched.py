"""torch is changed only while a launcher runs: importing our modules changes nothing of torch.

The launcher puts a few things of its own into torch (the workers' store port picker, the
rendezvous poll wrapper: ``LauncherRun._change_torch``). They are installed when a
:class:`launcher.launch.LauncherRun` starts and undone at its teardown, so that a program that
only imports ``ft_core``, ``launcher`` or ``ptl_resiliency`` (a training script, a test, a
plain ``torchrun`` that loads our rendezvous plug-in) runs on an unchanged torch.

Each check runs in a fresh interpreter (:data:`PROBE`): it records torch's attributes, imports
every module of ours, and reports

- every attribute of a torch module, of a class defined there, or of a container or object one
  level below, whose value is a function, class or object of ours (wherever it was put: before or
  after the record);
- every function or class of a ``torch.distributed`` module or class recorded before our imports
  that is another object afterwards.

The one thing of ours torch may hold is the ``ft-barrier`` creator in its rendezvous handler
registry: torch itself puts it there from our ``torchrun.handlers`` entry point (its plug-in
mechanism), in every process that uses its rendezvous, whether we are imported or not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = r'''
import ast, importlib, json, pathlib, pkgutil, sys, types

OURS = ("ft_core", "launcher", "ptl_resiliency")
REPO = pathlib.Path(sys.argv[1])
# torch's plug-in mechanism: the torchrun.handlers entry point registers our creator (the registry
# object is reachable from several torch modules)
ALLOWED_SUFFIX = "_registry._registry['ft-barrier']"


def ours(value):
    if isinstance(value, types.ModuleType):
        return value.__name__.split(".")[0] in OURS
    owner = getattr(value, "__module__", None)
    if not isinstance(owner, str):
        owner = getattr(type(value), "__module__", None)
    return isinstance(owner, str) and owner.split(".")[0] in OURS


def torch_modules():
    return {name: module for name, module in list(sys.modules.items())
            if (name == "torch" or name.startswith("torch.")) and isinstance(module, types.ModuleType)}


def attributes(module):
    """(where, value) of a torch module's attributes, its classes' attributes, and one level below
    its containers and plain objects."""
    try:
        items = list(vars(module).items())
    except TypeError:
        return
    for name, value in items:
        where = f"{module.__name__}.{name}"
        yield where, value
        if isinstance(value, type) and value.__module__ == module.__name__:
            for attr, inner in list(vars(value).items()):
                yield f"{where}.{attr}", inner
        elif isinstance(value, dict):
            for key, inner in list(value.items())[:1000]:
                yield f"{where}[{key!r}]", inner
        elif isinstance(value, (list, tuple, set, frozenset)):
            for index, inner in enumerate(list(value)[:1000]):
                yield f"{where}[{index}]", inner
        elif not isinstance(value, (types.ModuleType, types.FunctionType, type)) and hasattr(value, "__dict__"):
            try:
                inner_items = list(vars(value).items())
            except TypeError:
                continue
            for attr, inner in inner_items:
                yield f"{where}.{attr}", inner
                if isinstance(inner, dict):
                    for key, deeper in list(inner.items())[:1000]:
                        yield f"{where}.{attr}[{key!r}]", deeper


def record():
    """The functions and classes of torch.distributed's modules and classes, by identity (torch
    itself sets flags and caches lazily, and wraps some of torch's top-level functions when its
    compiler is imported: those are not compared)."""
    out = {}
    for name, module in torch_modules().items():
        if not name.startswith("torch.distributed"):
            continue
        for where, value in attributes(module):
            if "[" not in where and callable(value) and not isinstance(value, types.ModuleType):
                out[where] = id(value)
    return out, [value for module in torch_modules().values() for _, value in attributes(module)]


def torch_imports():
    """Every torch module our sources import (so that they are loaded before the record)."""
    names = set()
    for package in OURS:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module)
                elif isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
    return sorted(name for name in names if name == "torch" or name.startswith("torch."))


def our_modules():
    for package in OURS:
        root = importlib.import_module(package)
        yield package
        for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                yield info.name


for name in torch_imports():
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # an optional torch module (a name imported from a module, or a missing extra)
before, kept = record()  # kept: no id is reused while the comparison runs
imported = []
for name in our_modules():
    importlib.import_module(name)
    imported.append(name)
after, _ = record()
changed = sorted(where for where, ident in before.items() if where in after and after[where] != ident)
placed = sorted({where for module in torch_modules().values() for where, value in attributes(module)
                 if ours(value) and not where.endswith(ALLOWED_SUFFIX) and not isinstance(value, types.ModuleType)})
print(json.dumps({"imported": imported, "changed": changed, "ours_in_torch": placed}))
'''


def probe() -> dict:
    """Run :data:`PROBE` in a fresh interpreter and return its findings."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROBE, str(REPO)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_importing_every_module_of_ours_leaves_torch_unchanged():
    found = probe()
    # every package's modules were imported (walk_packages found the tree)
    for module in ("launcher.launch_config", "launcher.launch", "ft_core", "ptl_resiliency"):
        assert module in found["imported"], found["imported"]
    assert found["ours_in_torch"] == [], f"importing our modules put these into torch: {found['ours_in_torch']}"
    assert found["changed"] == [], f"importing our modules changed these attributes of torch: {found['changed']}"


RUN_PROBE = r'''
import json, sys
from torch.distributed.elastic.rendezvous import api, dynamic_rendezvous

torchs = {"get_free_port": api.get_free_port, "_delay": dynamic_rendezvous._delay}  # before any import of ours

import launcher.launch as launch_module
from launcher import cli

during = {}
create = launch_module.create_rendezvous_handler


def create_and_look(config):
    # what torch's rendezvous uses while the run creates its handler
    during["get_free_port"] = api.get_free_port.__module__
    during["_delay"] = dynamic_rendezvous._delay.__module__
    return create(config)


launch_module.create_rendezvous_handler = create_and_look
code = 0  # torch's @record around main returns instead of exiting 0
try:
    cli.main(sys.argv[1:])
except SystemExit as end:
    code = end.code
except BaseException as err:
    code = repr(err)
after = {"get_free_port": api.get_free_port is torchs["get_free_port"],
         "_delay": dynamic_rendezvous._delay is torchs["_delay"]}
print(json.dumps({"code": code, "during": during, "restored": after}))
'''


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("exit_code", "expected"), [(0, 0), (3, 1)])
def test_a_launcher_run_changes_torch_while_it_runs_and_undoes_it_at_its_teardown(tmp_path, exit_code, expected):
    # A real ft_launcher run in a fresh interpreter (a 2-node-capable c10d rendezvous, so that the
    # poll interval is installed too); the worker succeeds, or fails and the run ends with exit 1.
    script = tmp_path / "worker.py"
    script.write_text(f"import sys\nsys.exit({exit_code})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path)}
    argv = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "untouched", "--max-restarts", "0",
            "--rdzv-conf", "last_call_timeout=1", str(script)]
    done = subprocess.run([sys.executable, "-c", RUN_PROBE, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-4000:]
    found = json.loads(lines[-1])
    assert found["code"] == expected, done.stderr[-4000:]
    assert found["during"] == {"get_free_port": "launcher.rendezvous.master_port",
                               "_delay": "launcher.rendezvous.poll"}
    assert found["restored"] == {"get_free_port": True, "_delay": True}


# Module-level state that stays, and why: each is process-wide by nature (a hook of the
# interpreter, a signal handler's view, a one-time note) or a debug counter of one process.
MODULE_STATE_KEPT = {
    "launcher/rendezvous/store_counter.py": {
        "_marks", "_class", "_counts", "_write_lock", "_current",  # FT_STORE_COUNTS: the process's counts
    },
    "ft_core/wire/errors.py": {"_previous_excepthook"},  # sys.excepthook is the interpreter's
    "ft_core/straggler/engine.py": {"_CPU_NOTE_LOGGED"},  # a note logged once per process
    "ft_core/client/graceful_stop.py": {"_ARMED", "_AT_EXIT_REGISTERED", "_AT_FORK_REGISTERED"},  # atexit, fork
    "ft_core/client/straggler_channel.py": {"_said_no_launcher"},  # a note logged once per process
    "ft_core/client/rank_monitor_client.py": {"_live_clients"},  # closed at exit (atexit is process-wide)
    # one rank per process: its just-in-time state, saved from the process-wide excepthook
    "ft_core/client/jit_state.py": {"_default"},
    # the plain loop's tracked model, and the step and source it resumed from
    "ft_core/client/plain_state.py": {"_provider", "_restored_step", "_restored_source"},
}
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "collections.defaultdict", "deque", "collections.deque",
                  "OrderedDict", "collections.OrderedDict", "weakref.WeakSet", "weakref.WeakKeyDictionary",
                  "weakref.WeakValueDictionary", "threading.Lock", "threading.RLock", "contextvars.ContextVar"}


def module_state(path: Path) -> set[str]:
    """Names a module binds at its top level to a mutable container (or a lock guarding one), and
    names it rebinds through ``global`` statements; ALL_CAPS literals are constants."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if not isinstance(target, ast.Name) or target.id == "__all__":
                continue
            literal = isinstance(value, (ast.Dict, ast.List, ast.Set))
            if (literal and not target.id.isupper()) or (
                    isinstance(value, ast.Call) and ast.unparse(value.func) in _MUTABLE_CALLS):
                names.add(target.id)
    return names


def test_no_module_global_mutable_state_in_the_launcher_and_ft_core():
    found = {}
    for package in ("launcher", "ft_core"):
        for path in sorted((REPO / package).rglob("*.py")):
            name = path.relative_to(REPO).as_posix()
            state = module_state(path) - MODULE_STATE_KEPT.get(name, set())
            if state:
                found[name] = sorted(state)
    # e.g. the leftover sweep's helper pids belong to the run (launcher.node.sentinel.HelperPids)
    assert found == {}, f"module-level mutable state: {found}"
    for name in MODULE_STATE_KEPT:  # the list is kept true
        assert (REPO / name).exists(), name
