"""Static checks of what the launcher relies on in torch, run on a torch source tree.

``FaultTolerantAgent`` overrides private ``LocalElasticAgent`` hooks and touches a few private
attributes, and ``launcher/launch.py`` rebuilds torch's ``launch_agent`` (which hard-codes
``LocalElasticAgent``) from torch's own building blocks (``launcher/launch_config.py``). These checks
read torch's Python sources with :mod:`ast` only (nothing is imported), so they run against any
release's sources: the installed torch (``tests/unit/test_torch_hooks.py``) and every supported
release (``make check-torch-versions``, :mod:`tests.torch_versions`).

:func:`run_checks` returns a list of problems, each naming what changed and where we depend on
it; an empty list means this torch is compatible with the launcher's hooks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUR_PACKAGES = ("ft_core", "launcher", "ptl_resiliency")

HOOKS = {
    "_start_workers": ["self", "worker_group"],
    "_stop_workers": ["self", "worker_group"],
    "_monitor_workers": ["self", "worker_group"],
    "_shutdown": ["self", "death_sig", "timeout"],
    "_restart_workers": ["self", "worker_group"],
    "_rendezvous": ["self", "worker_group"],
    "_assign_worker_ranks": ["self", "store", "group_rank", "group_world_size", "spec"],
    "_setup_local_watchdog": ["self", "envs"],
    "run": ["self", "role"],
}
"""The private hooks FaultTolerantAgent overrides, with torch's parameter names (and ``run``,
whose ``None`` after a graceful rendezvous exit the agent turns into a success for a spare)."""

TORCH_PRIVATE_ATTRIBUTES = {
    "_remaining_restarts": "read for the restart count in records and decisions; set to 0 so that "
                           "torch's loop stops instead of restarting (ShutdownWorkload, ExcludeThisNode)",
    "_store": "read after super()._rendezvous(): the round's store, for the cross-node channel",
    "_pcontext": "read when torch's _monitor_workers cannot parse an error file: the workers' process "
                 "context's error_files, to drop the unreadable ones",
}
"""Every private torch attribute agent.py touches (besides the hooks), as ``self._x`` or
``getattr(self, "_x")``. ``_shutdown_timeout`` is set only through the constructor's
``shutdown_timeout`` argument (see the checks below)."""

DYNAMIC_RENDEZVOUS_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
TORCH_PRIVATE_NAMES = {
    "launch_config.py": {
        "_parse_rendezvous_config": ("torch.distributed.elastic.rendezvous.utils",
                                     "torchrun's own reading of --rdzv-conf, to check it before the run"),
    },
    "torch_compat.py": {
        "_shutdown": ("torch.distributed.elastic.agent.server.local_elastic_agent",
                      "its signature: whether this torch's agent takes a stop timeout (a hook, see HOOKS)"),
    },
    "rendezvous/poll.py": {
        "_delay": (DYNAMIC_RENDEZVOUS_MODULE,
                   "wrapped while a launcher runs: the one-second poll (check_rendezvous_poll)"),
        "_state_holder": (DYNAMIC_RENDEZVOUS_MODULE, "the handler's state holder, whose cache duration is set"),
        "_cache_duration": (DYNAMIC_RENDEZVOUS_MODULE, "how long the state holder serves its cached state"),
    },
    "rendezvous/store_counter.py": {  # FT_STORE_COUNTS only (a debug counter): check_store_counter
        "_store": (DYNAMIC_RENDEZVOUS_MODULE, "the handler's store, swapped for the counting one"),
        "_state_holder": (DYNAMIC_RENDEZVOUS_MODULE, "the way to the c10d backend"),
        "_backend": (DYNAMIC_RENDEZVOUS_MODULE, "the state holder's c10d backend, whose store is swapped too"),
    },
    "rendezvous/round_failure.py": {  # check_rank_assignment
        "_settings": (DYNAMIC_RENDEZVOUS_MODULE, "settings.keep_alive_interval / keep_alive_max_attempt: "
                                                 "the bound of the rank assignment's wait"),
    },
    "rendezvous/membership.py": {  # check_membership
        "_state_holder": (DYNAMIC_RENDEZVOUS_MODULE, "the shared rendezvous state (participants, wait list)"),
        "_settings": (DYNAMIC_RENDEZVOUS_MODULE, "settings.min_nodes / max_nodes"),
        "_heartbeat_lock": (DYNAMIC_RENDEZVOUS_MODULE, "held while the state is read"),
    },
}
"""Every private torch name a launcher module other than agent.py touches (an attribute of an
object that is not ``self``, a name given to ``getattr``/``hasattr``/``setattr``, a private name
imported from torch): module (relative to launcher/) -> name -> (the torch module that has it, why).
:func:`check_private_names` requires the list to be complete and each name to be in its torch module."""
NOT_TORCH_PRIVATE_NAMES = {"_exit", "_run_exitfuncs", "_option_string_actions"}
"""Private names of the standard library the launcher uses: ``os._exit``, ``atexit._run_exitfuncs``
(the warm template), argparse's ``_option_string_actions`` (a close option name in cli.py)."""

LAUNCH_AGENT_CALLS = {
    # what torch's launch_agent calls -> how launcher/launch.py and launch_config.py rebuild it
    "uuid.uuid4": "launch_config.ensure_run_id: a random run id when none is given",
    "str": "(plumbing)",
    "int": "(plumbing)",
    "tuple": "(plumbing)",
    "isinstance": "(plumbing)",
    "logger.warning": "(logging)",
    "logger.info": "(logging)",
    "_get_entrypoint_name": "(logging only)",
    "RendezvousParameters": "launch_config.rendezvous_parameters",
    "rdzv_registry.get_rendezvous_handler": "launch_config.create_rendezvous_handler (bounded, on a helper thread)",
    "_get_addr_and_port": "launch_config.static_master",
    "WorkerSpec": "worker_spec / worker_spec_kwargs",
    "LocalElasticAgent": "FaultTolerantAgent(...)",
    "metrics.initialize_metrics": "LauncherRun._start",
    "metrics.MetricsConfig": "LauncherRun._start",
    "agent.run": "LauncherRun._supervise",
    "result.is_failed": "LauncherRun._supervise: exit code 1",
    "spec.rdzv_handler.shutdown": "launch_config.close_rendezvous (not after a signal or an exclusion)",
    "ChildFailedError": "not rebuilt: main's @record reports the launcher's own errors; worker "
                        "failures are in the event log and the exit code",
    "events.record": "not rebuilt: torch's agent-level elastic events (event_log_handler); the "
                     "agent's run() still records the worker events",
    "agent.get_event_succeeded": "not rebuilt (see events.record)",
    "agent.get_event_failed": "not rebuilt (see events.record)",
    "os.getenv": "not rebuilt: the early health check server (TORCHELASTIC_HEALTH_CHECK_PORT)",
    "justknobs_check": "not rebuilt: the early health check server",
    "create_healthcheck_server": "not rebuilt: the early health check server",
    "health_check_server.start": "not rebuilt: the early health check server",
    "_AliveCallbackProxy": "not rebuilt: the early health check server",
    "cb.set_delegate": "not rebuilt: the early health check server",
    "alive_callback_proxy.set_delegate": "not rebuilt: the early health check server (torch 2.12)",
    "logger.exception": "(logging: a failed rendezvous close, torch 2.15; close_rendezvous logs it too)",
}
"""Every call torch's ``launch_agent`` makes in any supported release (a release may make fewer)."""
LOCAL_ELASTIC_AGENT_ARGS_LEFT_OUT = {"health_check_server": "the early health check server is not rebuilt"}
OUR_AGENT_ARG_NAMES = {"shutdown_timeout": "stop"}  # LocalElasticAgent's name -> FaultTolerantAgent's
"""torch's ``shutdown_timeout`` is ``StopSettings.term_timeout`` (``--term-timeout``), in the agent's ``stop``."""

LAUNCH_CONFIG_FIELDS_READ = {
    "role", "nproc_per_node", "max_restarts", "monitor_interval", "local_addr", "event_log_handler",
    "numa_options", "duplicate_stdout_filters", "duplicate_stderr_filters", "virtual_local_rank",
    "signals_to_handle", "rdzv_backend", "rdzv_endpoint", "run_id", "min_nodes", "max_nodes",
    "rdzv_configs", "shutdown_timeout", "logs_specs", "start_method", "log_line_prefix_template",
    "metrics_cfg",
}
"""The ``LaunchConfig`` attributes launcher/launch.py and launch_config.py read."""

TORCHRUN_OPTIONS_READ = ("--standalone", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--nnodes",
                         "--master-port", "--log-dir", "--redirects", "--tee", "--shutdown-timeout")
"""torchrun options whose values the launcher reads from the parsed arguments (or their defaults
from torchrun's parser: ``launcher.options.torchrun_default``)."""

INVOKE_RUN_FRAGMENTS = [
    ("monitor_interval = spec.monitor_interval", "we shrink spec.monitor_interval before the loop reads it"),
    ("time.sleep(monitor_interval)", "the loop sleeps before each _monitor_workers; we wait there instead"),
    ("if self._remaining_restarts > 0:", "_remaining_restarts = 0 must make the loop stop"),
    ("self._remaining_restarts -= 1", "restart counts in cycle_start records"),
    ("self._restart_workers(self._worker_group)", "our _restart_workers hook"),
    ("self._stop_workers(self._worker_group)", "our _stop_workers hook when no restart is left"),
    ("num_nodes_waiting", "HEALTHY while min-healthy waits: torch still restarts for joining nodes"),
]

AGENT_API = "torch.distributed.elastic.agent.server.api"
LOCAL_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent"
LAUNCHER_API = "torch.distributed.launcher.api"
RUN = "torch.distributed.run"


class TorchSource:
    """Parsed modules of one torch source tree (the directory that holds ``torch/``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._trees: dict[str, ast.Module] = {}

    def path(self, module: str) -> Path:
        base = self.root.joinpath(*module.split("."))
        package = base / "__init__.py"
        return package if package.exists() else base.with_suffix(".py")

    def text(self, module: str) -> str:
        return self.path(module).read_text(encoding="utf-8")

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.text(module))
        return self._trees[module]

    def cls(self, module: str, name: str) -> ast.ClassDef:
        for node in self.tree(module).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise LookupError(f"{module} has no class {name}")

    def function(self, module: str, name: str) -> ast.FunctionDef:
        for node in self.tree(module).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return node  # type: ignore[return-value]
        raise LookupError(f"{module} has no function {name}")

    def segment(self, module: str, node: ast.AST) -> str:
        return ast.get_source_segment(self.text(module), node) or ""


# The agent classes from the most derived up, with their modules (LocalElasticAgent's bases).
AGENT_CHAIN = ((LOCAL_AGENT, "LocalElasticAgent"), (AGENT_API, "SimpleElasticAgent"), (AGENT_API, "ElasticAgent"))


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}  # type: ignore[misc]


def agent_method(src: TorchSource, name: str) -> tuple[str, ast.FunctionDef]:
    """The first definition of method ``name`` along LocalElasticAgent's class chain."""
    for module, cls_name in AGENT_CHAIN:
        method = _methods(src.cls(module, cls_name)).get(name)
        if method is not None:
            return module, method
    raise LookupError(f"LocalElasticAgent has no method {name}")


def params(func: ast.FunctionDef) -> list[str]:
    args = func.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


def self_attributes_assigned(cls: ast.ClassDef) -> set[str]:
    found = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return found


def class_fields(cls: ast.ClassDef) -> set[str]:
    """Dataclass fields (annotated class attributes) of ``cls``."""
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def torch_agent_attributes(src: TorchSource) -> set[str]:
    names: set[str] = set()
    for module, cls_name in AGENT_CHAIN:
        cls = src.cls(module, cls_name)
        names |= set(_methods(cls)) | self_attributes_assigned(cls) | class_fields(cls)
    return names


def calls_in(tree: ast.AST) -> dict[str, ast.Call]:
    return {ast.unparse(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}


def keywords(call: ast.Call) -> set[str]:
    return {k.arg for k in call.keywords if k.arg is not None}


def body_without_docstring(func: ast.FunctionDef) -> list[str]:
    return [ast.unparse(s) for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]


# ---------------------------------------------------------------------- our side (version independent)


def _our_tree(relative: str) -> ast.Module:
    return ast.parse((REPO / relative).read_text(encoding="utf-8"))


def our_agent_defined() -> set[str]:
    """Attributes FaultTolerantAgent.__init__ assigns and the methods it defines."""
    tree = _our_tree("launcher/agent.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FaultTolerantAgent")
    init = _methods(cls)["__init__"]
    return set(_methods(cls)) | self_attributes_assigned(ast.Module(body=[init], type_ignores=[]))  # type: ignore[arg-type]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _named_in_getattr(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(object, name) of ``getattr(obj, "_x", ...)``, ``hasattr`` or ``setattr`` with a private name."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)):
        return node.args[0], node.args[1].value
    return None


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def our_private_uses() -> set[str]:
    """Private ``self.`` attributes agent.py touches (also through ``getattr(self, "_x")``) that
    FaultTolerantAgent does not define."""
    tree = _our_tree("launcher/agent.py")
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and _is_self(node.value) and _private(node.attr)}
    used |= {found[1] for found in map(_named_in_getattr, ast.walk(tree)) if found and _is_self(found[0])}
    return used - our_agent_defined() - set(HOOKS)


def private_names_elsewhere() -> dict[str, set[str]]:
    """Private names each launcher module but agent.py touches on objects other than ``self``,
    names through ``getattr``/``hasattr``/``setattr``, or imports from torch (see
    :data:`TORCH_PRIVATE_NAMES`); by module relative to launcher/, the standard library's left out."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "launcher").rglob("*.py")):
        name = path.relative_to(REPO / "launcher").as_posix()
        if name == "agent.py":
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
                names.add(node.attr)
            elif (named := _named_in_getattr(node)) is not None and not _is_self(named[0]):
                names.add(named[1])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                names |= {alias.name for alias in node.names if _private(alias.name)}
        names -= NOT_TORCH_PRIVATE_NAMES
        if names:
            found[name] = names
    return found


def our_torch_imports() -> list[tuple[str, str, str]]:
    """``(our file, torch module, name or "")`` for every ``from torch... import`` / ``import torch...``."""
    found = []
    for package in OUR_PACKAGES:
        for path in sorted((REPO / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                where = f"{package}/{path.name}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
                    found += [(where, node.module, alias.name) for alias in node.names]
                elif isinstance(node, ast.Import):
                    found += [(where, alias.name, "") for alias in node.names if alias.name.split(".")[0] == "torch"]
    return found


def _our_launcher_option_strings() -> set[str]:
    tree = _our_tree("launcher/cli.py")
    options = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            options |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and a.value.startswith("--")}
    return options


# ---------------------------------------------------------------------- the checks


def shutdown_takes_timeout(src: TorchSource) -> bool:
    """Whether this torch's agent bounds its stops itself (``_shutdown(death_sig, timeout)``, torch >= 2.12);
    older releases call ``_shutdown(death_sig)`` and ours applies ``--term-timeout`` (launcher.torch_compat)."""
    return "timeout" in params(agent_method(src, "_shutdown")[1])


def _defaults(func: ast.FunctionDef) -> dict[str, str]:
    return {name: ast.unparse(value) for name, value in
            zip(reversed(params(func)), reversed(func.args.defaults), strict=False)}


def check_hooks(src: TorchSource) -> Iterator[str]:
    with_timeout = shutdown_takes_timeout(src)
    for name, expected in HOOKS.items():
        module, method = agent_method(src, name)
        if name == "_shutdown" and not with_timeout:
            expected = expected[:-1]  # torch < 2.12: no timeout; ours takes one and defaults it
        if params(method) != expected:
            yield f"LocalElasticAgent.{name} ({module}) now takes {params(method)}, we override it as {HOOKS[name]}"
    _, shutdown = agent_method(src, "_shutdown")
    if with_timeout:
        if _defaults(shutdown).get("timeout") != "30":
            yield "LocalElasticAgent._shutdown's default timeout is no longer 30 s (docs: --term-timeout default)"
        return
    # Without a timeout torch's _shutdown closes its process context with that context's default,
    # which launcher.launch_config.LAUNCH_CONFIG_WITHOUT_FIELD["shutdown_timeout"] stands for.
    from launcher.launch_config import LAUNCH_CONFIG_WITHOUT_FIELD

    if "self._pcontext.close(death_sig)" not in src.segment(LOCAL_AGENT, shutdown):
        yield "LocalElasticAgent._shutdown no longer closes its process context with death_sig"
    close = _methods(src.cls("torch.distributed.elastic.multiprocessing.api", "PContext"))["close"]
    if _defaults(close).get("timeout") != str(LAUNCH_CONFIG_WITHOUT_FIELD["shutdown_timeout"]):
        yield (f"PContext.close's default timeout is {_defaults(close).get('timeout')}, not "
               f"LAUNCH_CONFIG_WITHOUT_FIELD's {LAUNCH_CONFIG_WITHOUT_FIELD['shutdown_timeout']}")
    ours = next(n for n in _our_tree("launcher/agent.py").body if isinstance(n, ast.ClassDef)
                and n.name == "FaultTolerantAgent")
    if _defaults(_methods(ours)["_shutdown"]).get("timeout") != "None":
        yield "FaultTolerantAgent._shutdown's timeout must default to None (--term-timeout): torch calls it without"


def check_start_workers_hands_us_envs(src: TorchSource) -> Iterator[str]:
    module, method = agent_method(src, "_start_workers")
    source = src.segment(module, method)
    if "self._setup_local_watchdog(envs=envs)" not in source:
        yield "LocalElasticAgent._start_workers no longer calls self._setup_local_watchdog(envs=envs): " \
              "we inject the per-rank environment there"
    elif "start_processes(" in source and source.index("_setup_local_watchdog") > source.index("start_processes("):
        yield "LocalElasticAgent._start_workers now starts processes before _setup_local_watchdog(envs)"


def check_stop_workers(src: TorchSource) -> Iterator[str]:
    _, method = agent_method(src, "_stop_workers")
    if body_without_docstring(method) != ["self._shutdown()"]:
        yield ("LocalElasticAgent._stop_workers now does more than self._shutdown(); "
               "FaultTolerantAgent._stop_workers must do it too")


def check_shutdown_timeout(src: TorchSource) -> Iterator[str]:
    # We hand torch a fractional --term-timeout as shutdown_timeout and rely on torch using it
    # only as _shutdown(timeout=...), which is our override. A torch whose _shutdown takes no
    # timeout must have none of it (launcher.torch_compat passes it only with the timeout).
    with_timeout = shutdown_takes_timeout(src)
    shape = {
        "LocalElasticAgent(shutdown_timeout=...)":
            "shutdown_timeout" in params(_methods(src.cls(LOCAL_AGENT, "LocalElasticAgent"))["__init__"]),
        "LaunchConfig.shutdown_timeout": "shutdown_timeout" in class_fields(src.cls(LAUNCHER_API, "LaunchConfig")),
        "torchrun --shutdown-timeout": "--shutdown-timeout" in torchrun_option_strings(src),
    }
    for what, present in shape.items():
        if present != with_timeout:
            yield (f"torch's _shutdown {'takes' if with_timeout else 'takes no'} timeout but {what} is "
                   f"{'missing' if with_timeout else 'there'} (launcher.torch_compat expects both or neither)")
    if not with_timeout:
        yield from _check_run_shuts_down_without_timeout(src)
        return
    uses = allowed = 0
    for module in (AGENT_API, LOCAL_AGENT):
        for node in ast.walk(src.tree(module)):
            if isinstance(node, ast.Attribute) and node.attr == "_shutdown_timeout":
                uses += 1
            if isinstance(node, ast.Assign) and any(ast.unparse(t) == "self._shutdown_timeout" for t in node.targets):
                if ast.unparse(node.value) != "shutdown_timeout":
                    yield f"torch sets _shutdown_timeout from {ast.unparse(node.value)}, not the argument"
                allowed += 1
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "self._shutdown":
                allowed += sum(1 for k in node.keywords if ast.unparse(k.value) == "self._shutdown_timeout")
    if not uses:
        yield "torch no longer has _shutdown_timeout"
    elif allowed != uses:
        yield "torch uses _shutdown_timeout elsewhere than in __init__ and _shutdown(timeout=...)"
    run = _methods(src.cls(AGENT_API, "SimpleElasticAgent"))["run"]
    calls = sorted(ast.unparse(c) for c in ast.walk(run)
                   if isinstance(c, ast.Call) and ast.unparse(c.func) == "self._shutdown")
    if calls != sorted(["self._shutdown(e.sigval, timeout=self._shutdown_timeout)",
                        "self._shutdown(timeout=self._shutdown_timeout)"]):
        yield f"SimpleElasticAgent.run now calls {calls}"


def _check_run_shuts_down_without_timeout(src: TorchSource) -> Iterator[str]:
    for module in (AGENT_API, LOCAL_AGENT):
        if any(isinstance(n, ast.Attribute) and n.attr == "_shutdown_timeout" for n in ast.walk(src.tree(module))):
            yield f"{module} has _shutdown_timeout but its _shutdown takes no timeout"
    run = _methods(src.cls(AGENT_API, "SimpleElasticAgent"))["run"]
    calls = sorted(ast.unparse(c) for c in ast.walk(run)
                   if isinstance(c, ast.Call) and ast.unparse(c.func) == "self._shutdown")
    if calls != ["self._shutdown()", "self._shutdown(e.sigval)"]:
        yield f"SimpleElasticAgent.run now calls {calls} (FaultTolerantAgent._shutdown defaults the timeout)"


def check_invoke_run(src: TorchSource) -> Iterator[str]:
    module, method = agent_method(src, "_invoke_run")
    source = src.segment(module, method)
    for fragment, why in INVOKE_RUN_FRAGMENTS:
        if fragment not in source:
            yield f"torch's _invoke_run changed ({fragment!r} is gone): {why}"
    module, method = agent_method(src, "_rendezvous")
    if "self._store = store" not in src.segment(module, method):
        yield "torch's _rendezvous no longer sets self._store; StoreChannel.attach reads it"
    module, method = agent_method(src, "run")
    if "except RendezvousGracefulExitError" not in src.segment(module, method):
        yield ("torch's run no longer ends quietly on RendezvousGracefulExitError; FaultTolerantAgent._rendezvous "
               "raises it for a spare whose job ended (exit 0)")


def check_private_attributes(src: TorchSource) -> Iterator[str]:
    touched = our_private_uses()
    if touched != set(TORCH_PRIVATE_ATTRIBUTES):
        yield (f"agent.py touches private torch attributes {sorted(touched - set(TORCH_PRIVATE_ATTRIBUTES))} "
               f"not listed in TORCH_PRIVATE_ATTRIBUTES (or no longer touches "
               f"{sorted(set(TORCH_PRIVATE_ATTRIBUTES) - touched)})")
    theirs = torch_agent_attributes(src)
    missing = set(TORCH_PRIVATE_ATTRIBUTES) - theirs
    if missing:
        yield f"torch's LocalElasticAgent no longer has {sorted(missing)}"
    clashes = (our_agent_defined() - set(HOOKS) - {"__init__"}) & theirs
    if clashes:
        yield f"FaultTolerantAgent's attributes {sorted(clashes)} now shadow torch's: rename ours"


def _has_name(src: TorchSource, module: str, name: str) -> bool:
    """``module`` defines or imports ``name``, or one of its classes keeps ``self.name`` or has it."""
    if _defines(src, module, name):
        return True
    return any(name in self_attributes_assigned(node) | class_fields(node) | set(_methods(node))
               for node in ast.walk(src.tree(module)) if isinstance(node, ast.ClassDef))


def check_private_names(src: TorchSource) -> Iterator[str]:
    """Every private torch name the launcher touches outside agent.py is listed, and still torch's."""
    found = private_names_elsewhere()
    listed = {module: set(names) for module, names in TORCH_PRIVATE_NAMES.items()}
    for module in sorted(set(found) | set(listed)):
        ours, theirs = found.get(module, set()), listed.get(module, set())
        new, gone = ours - theirs, theirs - ours
        if new:
            yield f"launcher/{module} touches private names {sorted(new)} not listed in TORCH_PRIVATE_NAMES"
        if gone:
            yield f"launcher/{module} no longer touches {sorted(gone)}: remove them from TORCH_PRIVATE_NAMES"
    for module, names in TORCH_PRIVATE_NAMES.items():
        for name, (torch_module, why) in names.items():
            if not _has_name(src, torch_module, name):
                yield f"{torch_module} no longer has {name} (launcher/{module}: {why})"


def check_data_we_read(src: TorchSource) -> Iterator[str]:
    worker_group = src.cls(AGENT_API, "WorkerGroup")
    group = self_attributes_assigned(worker_group) | set(_methods(worker_group))
    for name in ("workers", "group_rank", "group_world_size", "spec", "store"):
        if name not in group:
            yield f"torch's WorkerGroup has no {name!r} any more"
    worker = self_attributes_assigned(src.cls(AGENT_API, "Worker")) | set(_methods(src.cls(AGENT_API, "Worker")))
    for name in ("local_rank", "global_rank"):
        if name not in worker:
            yield f"torch's Worker has no {name!r} any more"
    if not class_fields(src.cls(AGENT_API, "RunResult")) >= {"state", "failures"}:
        yield "torch's RunResult lost 'state' or 'failures'"
    failure = src.cls("torch.distributed.elastic.multiprocessing.errors", "ProcessFailure")
    names = class_fields(failure) | self_attributes_assigned(failure)
    for name in ("local_rank", "pid", "exitcode", "message", "error_file"):
        if name not in names:
            yield f"torch's ProcessFailure has no {name!r} any more"
    pcontext = src.cls("torch.distributed.elastic.multiprocessing.api", "PContext")
    if "error_files" not in self_attributes_assigned(pcontext):  # agent.py reads it through _pcontext
        yield "torch's PContext no longer keeps self.error_files"
    signal_exc = _methods(src.cls("torch.distributed.elastic.multiprocessing.api", "SignalException"))["__init__"]
    if "sigval" not in params(signal_exc):
        yield "torch's SignalException no longer takes sigval"
    exported = src.text("torch.distributed")
    for name in ("DistStoreError", "DistNetworkError", "DistError"):  # launcher.rendezvous.store_channel.STORE_ERRORS
        if name not in exported:
            yield f"torch.distributed no longer exports {name}"
    spec_fields = class_fields(src.cls(AGENT_API, "WorkerSpec"))
    if "monitor_interval" not in spec_fields:
        yield "torch's WorkerSpec has no monitor_interval any more"


MP_API = "torch.distributed.elastic.multiprocessing.api"


def reads_signals_to_handle(src: TorchSource) -> bool:
    """Whether this torch's workers' context handles the signals TORCHELASTIC_SIGNALS_TO_HANDLE names
    (torch >= 2.10, with ``LaunchConfig.signals_to_handle``); older ones handle a fixed set."""
    return "TORCHELASTIC_SIGNALS_TO_HANDLE" in src.text(MP_API)


def check_environment_variables(src: TorchSource) -> Iterator[str]:
    if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in src.text("torch.distributed.elastic.rendezvous.dynamic_rendezvous"):
        yield "torch's c10d rendezvous no longer reads TORCH_DISABLE_SHARE_RDZV_TCP_STORE (fresh store per round)"
    has_field = "signals_to_handle" in class_fields(src.cls(LAUNCHER_API, "LaunchConfig"))
    if reads_signals_to_handle(src) != has_field:
        yield "torch reads TORCHELASTIC_SIGNALS_TO_HANDLE without LaunchConfig.signals_to_handle, or the reverse"
    if has_field:
        return
    # The fixed set stands in for the field (launcher.launch_config.LAUNCH_CONFIG_WITHOUT_FIELD);
    # it must not hold the signals the launcher relays (launcher.node.environment.RELAYED_BY_US).
    from launcher.launch_config import LAUNCH_CONFIG_WITHOUT_FIELD

    handled = sorted(ast.unparse(c.args[0]).removeprefix("signal.") for c in ast.walk(src.tree(MP_API))
                     if isinstance(c, ast.Call) and ast.unparse(c.func) == "signal.signal"
                     and ast.unparse(c.args[1]) == "_terminate_process_handler")
    if handled != sorted(LAUNCH_CONFIG_WITHOUT_FIELD["signals_to_handle"].split(",")):
        yield (f"torch's workers' context handles {handled}, not LAUNCH_CONFIG_WITHOUT_FIELD's "
               f"{LAUNCH_CONFIG_WITHOUT_FIELD['signals_to_handle']}")


def check_launch_agent(src: TorchSource) -> Iterator[str]:
    launch_agent = src.function(LAUNCHER_API, "launch_agent")
    theirs = calls_in(launch_agent)
    unknown = set(theirs) - set(LAUNCH_AGENT_CALLS)
    if unknown:
        yield (f"torch's launch_agent now also calls {sorted(unknown)}: check launcher/launch.py, which "
               "rebuilds it, and list the calls in LAUNCH_AGENT_CALLS")
    source = src.segment(LAUNCHER_API, launch_agent)
    sets_signals = 'os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle' in source
    if sets_signals != reads_signals_to_handle(src):
        yield ("launch_agent no longer sets TORCHELASTIC_SIGNALS_TO_HANDLE as "
               "launcher.node.environment.set_up_environment does")
    if "shutdown_rdzv = False" not in source:
        yield "launch_agent now closes the rendezvous after a signal (we keep it open for the other nodes)"
    config_tree = _our_tree("launcher/launch_config.py")
    ours = calls_in(_our_tree("launcher/launch.py")) | calls_in(config_tree)
    if "WorkerSpec" in theirs:
        from launcher.launch_config import WORKER_SPEC_FIELDS_SINCE

        kwargs_func = next(n for n in config_tree.body
                           if isinstance(n, ast.FunctionDef) and n.name == "worker_spec_kwargs")
        spec_fields = class_fields(src.cls(AGENT_API, "WorkerSpec"))
        always = {ast.literal_eval(k) for n in ast.walk(kwargs_func) if isinstance(n, ast.Dict)
                  for k in n.keys if k is not None}
        our_fields = always | (set(WORKER_SPEC_FIELDS_SINCE) & spec_fields)  # as worker_spec_kwargs passes them
        their_fields = keywords(theirs["WorkerSpec"])
        if our_fields != their_fields:
            yield f"launch_agent's WorkerSpec fields changed: {sorted(their_fields ^ our_fields)}"
        unknown = always - spec_fields
        if unknown:
            yield f"torch's WorkerSpec has no fields {sorted(unknown)}"
    if "LocalElasticAgent" in theirs:
        agent_args = keywords(theirs["LocalElasticAgent"]) - set(LOCAL_ELASTIC_AGENT_ARGS_LEFT_OUT)
        passed = keywords(ours["FaultTolerantAgent"]) | {"spec", "logs_specs"}  # the first two are positional
        missing = {a for a in agent_args if OUR_AGENT_ARG_NAMES.get(a, a) not in passed}
        if missing:
            yield f"torch's launch_agent now gives LocalElasticAgent {sorted(missing)}; we do not"
        init = params(_methods(src.cls(LOCAL_AGENT, "LocalElasticAgent"))["__init__"])
        if not keywords(theirs["LocalElasticAgent"]) <= set(init):
            yield f"LocalElasticAgent.__init__ takes {init}"
    if ("RendezvousParameters" in theirs
            and keywords(theirs["RendezvousParameters"]) != keywords(ours["RendezvousParameters"])):
        yield "launch_agent builds RendezvousParameters with other arguments than launcher.launch_config"
    rdzv = _methods(src.cls("torch.distributed.elastic.rendezvous.api", "RendezvousParameters"))["__init__"]
    names = set(params(rdzv)) | ({rdzv.args.kwarg.arg} if rdzv.args.kwarg else set())
    if not names >= {"backend", "endpoint", "run_id", "min_nodes", "max_nodes", "local_addr", "kwargs"}:
        yield f"RendezvousParameters.__init__ takes {sorted(names)}"


def check_launch_config(src: TorchSource) -> Iterator[str]:
    from launcher.launch_config import LAUNCH_CONFIG_WITHOUT_FIELD, WORKER_SPEC_FIELDS_SINCE

    config_fields = class_fields(src.cls(LAUNCHER_API, "LaunchConfig"))
    # An older torch lacks some: read_launch_config supplies LAUNCH_CONFIG_WITHOUT_FIELD's, and
    # worker_spec_kwargs reads WORKER_SPEC_FIELDS_SINCE only where torch's WorkerSpec has them.
    optional = set(LAUNCH_CONFIG_WITHOUT_FIELD) | (set(WORKER_SPEC_FIELDS_SINCE)
                                                   - class_fields(src.cls(AGENT_API, "WorkerSpec")))
    missing = LAUNCH_CONFIG_FIELDS_READ - config_fields - optional
    if missing:
        yield f"torch's LaunchConfig no longer has {sorted(missing)}"


def torchrun_run_fragments() -> tuple[str, ...]:
    """What torchrun's ``run()`` does that ``launcher.launch_config.apply_torchrun_defaults`` repeats."""
    from launcher.launch_config import TORCHRUN_MASTER_PORT

    return ('args.rdzv_backend = "c10d"', 'args.rdzv_endpoint = "localhost:0"',
            "parse_min_max_nnodes(args.nnodes)", f"args.master_port = {TORCHRUN_MASTER_PORT}")


def torchrun_option_strings(src: TorchSource) -> set[str]:
    """Every ``--option`` string in torchrun's ``get_args_parser``."""
    return {n.value for n in ast.walk(src.function(RUN, "get_args_parser"))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("--")}


def master_port_defaults_in_run(src: TorchSource) -> bool:
    """Whether torchrun's ``run()`` picks ``--master-port`` (torch >= 2.12: the parser's default is None,
    and a single-node static run becomes c10d on localhost); older parsers default it to 29500."""
    return any(isinstance(n, ast.keyword) and n.arg == "default" and ast.unparse(n.value) == "None"
               for call in ast.walk(src.function(RUN, "get_args_parser")) if isinstance(call, ast.Call)
               and "--master-port" in [ast.unparse(a).strip("'\"") for a in call.args] for n in call.keywords)


def check_torchrun(src: TorchSource) -> Iterator[str]:
    run = src.segment(RUN, src.function(RUN, "run"))
    if master_port_defaults_in_run(src):
        for fragment in torchrun_run_fragments():
            if fragment not in run:
                yield f"torchrun's run() changed ({fragment!r}); see launch_config.apply_torchrun_defaults"
    else:
        # Such a torchrun's parser defaults --master-port to 29500 and its run() only applies
        # --standalone: apply_torchrun_defaults takes that default as "not given" (same behaviour
        # on every release).
        from launcher.launch_config import TORCHRUN_MASTER_PORT

        if f"default={TORCHRUN_MASTER_PORT}" not in src.segment(RUN, src.function(RUN, "get_args_parser")):
            yield f"torchrun's --master-port defaults neither to None nor to {TORCHRUN_MASTER_PORT}"
        if "args.master_port =" in run:
            yield "torchrun's run() sets args.master_port although its parser gives a default"
    parser_source = src.segment(RUN, src.function(RUN, "get_args_parser"))
    strings = torchrun_option_strings(src)
    # --shutdown-timeout: only with the agent's shutdown timeout (check_shutdown_timeout)
    read = [o for o in TORCHRUN_OPTIONS_READ if o != "--shutdown-timeout" or shutdown_takes_timeout(src)]
    for option in read:
        if option not in strings and option.replace("-", "_").replace("__", "--", 1) not in strings:
            yield f"torchrun has no {option} option any more (the launcher reads it)"
    clashes = sorted(o for o in _our_launcher_option_strings() if o in strings)
    if clashes:
        yield f"torchrun now has options of ours: {clashes} (argparse would refuse to add them)"
    if "def config_from_args" not in src.text(RUN) or "get_args_parser" not in parser_source + src.text(RUN):
        yield "torch.distributed.run no longer has config_from_args / get_args_parser"


def _defines(src: TorchSource, module: str, name: str) -> bool:
    tree = src.tree(module)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name
                                                                   or a.name == "*" for a in node.names):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
    return False


def check_our_imports(src: TorchSource) -> Iterator[str]:
    for where, module, name in our_torch_imports():
        if not module.startswith("torch.distributed"):
            continue  # only the distributed sources are kept; torch itself is checked at install
        if not src.path(module).exists():
            yield f"{where}: torch has no module {module}"
            continue
        submodule = f"{module}.{name}"
        if name and not src.path(submodule).exists() and not _defines(src, module, name):
            yield f"{where}: {module} no longer defines {name}"


C10D_BACKEND = "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"


def check_c10d_read_timeout(src: TorchSource) -> Iterator[str]:
    """launcher.launch_config bounds the handler's creation by c10d's default read timeout."""
    from launcher.launch_config import C10D_DEFAULT_READ_TIMEOUT

    fragment = f'"read_timeout", {C10D_DEFAULT_READ_TIMEOUT:g})'
    if fragment not in src.text(C10D_BACKEND):
        yield (f"torch's c10d rendezvous backend no longer defaults read_timeout as {fragment!r} "
               "(launcher.launch_config.C10D_DEFAULT_READ_TIMEOUT)")


DYNAMIC_RENDEZVOUS = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def check_rendezvous_poll(src: TorchSource) -> Iterator[str]:
    """launcher/rendezvous/poll.py wraps the module's ``_delay`` and shortens the one-second poll
    of ``_DistributedRendezvousOpExecutor.run``: both must still be there."""
    from launcher.rendezvous.poll import TORCH_POLL_SECONDS

    tree = src.tree(DYNAMIC_RENDEZVOUS)
    imported = any(isinstance(node, ast.ImportFrom) and any(a.name == "_delay" for a in node.names)
                   for node in tree.body)
    if not imported and not _defines(src, DYNAMIC_RENDEZVOUS, "_delay"):
        yield f"{DYNAMIC_RENDEZVOUS} no longer has _delay (launcher/rendezvous/poll.py wraps it)"
        return
    run = _methods(src.cls(DYNAMIC_RENDEZVOUS, "_DistributedRendezvousOpExecutor")).get("run")
    if run is None:
        yield "_DistributedRendezvousOpExecutor has no run method (launcher/rendezvous/poll.py)"
        return
    polls = [call for call in ast.walk(run) if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
             and call.func.id == "_delay"
             and any(isinstance(k.value, ast.Constant) and k.value.value == TORCH_POLL_SECONDS for k in call.keywords)]
    if not polls:
        yield (f"_DistributedRendezvousOpExecutor.run no longer polls with _delay(seconds={TORCH_POLL_SECONDS}); "
               "launcher/rendezvous/poll.py has no effect")
    handler = src.cls(DYNAMIC_RENDEZVOUS, "DynamicRendezvousHandler")
    if "_state_holder" not in self_attributes_assigned(handler):
        yield "DynamicRendezvousHandler no longer keeps self._state_holder (launcher/rendezvous/poll.py)"
    holder = src.cls(DYNAMIC_RENDEZVOUS, "_BackendRendezvousStateHolder")
    sync = _methods(holder).get("sync")
    if "_cache_duration" not in self_attributes_assigned(holder) or sync is None or "self._cache_duration" not in \
            src.segment(DYNAMIC_RENDEZVOUS, sync):
        yield ("_BackendRendezvousStateHolder no longer serves its cached state for self._cache_duration "
               "(launcher/rendezvous/poll.py sets it)")


MEMBERSHIP_HANDLER_ATTRIBUTES = {
    "_state_holder": "the shared rendezvous state (participants, wait list, redundancy list) is read from it",
    "_settings": "settings.min_nodes / max_nodes: whether a new node may join the round now",
    "_heartbeat_lock": "held while the state is read (torch holds it while it syncs the state)",
}
"""Private attributes of torch's ``DynamicRendezvousHandler`` that launcher/rendezvous/membership.py reads."""


def check_membership(src: TorchSource) -> Iterator[str]:
    """launcher/rendezvous/membership.py reads the dynamic rendezvous state to decide which waiting nodes
    count: the handler's private attributes, the state's participants and wait list, the
    settings' min_nodes and max_nodes, and torch's own count must still be the wait list's size."""
    handler = src.cls(DYNAMIC_RENDEZVOUS, "DynamicRendezvousHandler")
    assigned = self_attributes_assigned(handler)
    for name, why in MEMBERSHIP_HANDLER_ATTRIBUTES.items():
        if name not in assigned:
            yield f"DynamicRendezvousHandler no longer keeps self.{name} (launcher/rendezvous/membership.py: {why})"
    methods = _methods(handler)
    for name in ("next_rendezvous", "num_nodes_waiting"):
        if name not in methods:
            yield f"DynamicRendezvousHandler has no {name} (launcher/rendezvous/membership.py wraps it)"
    waiting = methods.get("num_nodes_waiting")
    if waiting is not None and "state.wait_list" not in src.segment(DYNAMIC_RENDEZVOUS, waiting):
        yield ("DynamicRendezvousHandler.num_nodes_waiting no longer counts state.wait_list "
               "(launcher/rendezvous/membership.py refines that count)")
    state_fields = class_fields(src.cls(DYNAMIC_RENDEZVOUS, "_RendezvousState"))
    for name in ("participants", "wait_list", "redundancy_list", "last_heartbeats"):
        if name not in state_fields:
            yield f"_RendezvousState has no {name} (launcher/rendezvous/membership.py reads it)"
    settings_fields = class_fields(src.cls(DYNAMIC_RENDEZVOUS, "RendezvousSettings"))
    for name in ("min_nodes", "max_nodes"):
        if name not in settings_fields:
            yield f"RendezvousSettings has no {name} (launcher/rendezvous/membership.py reads it)"


C10D_RENDEZVOUS_BACKEND = "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"


def check_store_counter(src: TorchSource) -> Iterator[str]:
    """launcher/rendezvous/store_counter.py (FT_STORE_COUNTS) swaps the store under torch's dynamic rendezvous:
    the handler's ``_store``, the state holder's ``_backend`` and the c10d backend's ``_store``."""
    wanted = ((DYNAMIC_RENDEZVOUS, "DynamicRendezvousHandler", "_store"),
              (DYNAMIC_RENDEZVOUS, "_BackendRendezvousStateHolder", "_backend"),
              (C10D_RENDEZVOUS_BACKEND, "C10dRendezvousBackend", "_store"))
    for module, cls, name in wanted:
        if name not in self_attributes_assigned(src.cls(module, cls)):
            yield f"{cls} no longer keeps self.{name} (launcher/rendezvous/store_counter.py swaps the store there)"


def check_rank_assignment(src: TorchSource) -> Iterator[str]:
    """launcher/rendezvous/round_failure.py bounds torch's rank assignment after a round (the store's
    timeout, set around our ``_assign_worker_ranks`` hook) and names the members whose role info is not
    in the store: ``_rendezvous`` must call the hook with the round's store, the hook must exchange
    role infos through that store under torch's key, and c10d's settings must hold the keep-alive rule."""
    from launcher.rendezvous.round_failure import ROLE_INFO_PREFIX

    module, method = agent_method(src, "_rendezvous")
    if "self._assign_worker_ranks(" not in src.segment(module, method).replace("\n", "").replace(" ", ""):
        yield "torch's _rendezvous no longer calls self._assign_worker_ranks (launcher/rendezvous/round_failure.py)"
    module, method = agent_method(src, "_assign_worker_ranks")
    source = src.segment(module, method)
    # the role-info prefix: torch's local constant where it names one, else the literal in its keys
    prefixes = {ast.unparse(node.value) for node in ast.walk(method) if isinstance(node, ast.Assign)
                and any(ast.unparse(t) == "ROLE_INFO_PREFIX" for t in node.targets)}
    known = prefixes == {repr(ROLE_INFO_PREFIX)} if prefixes else ROLE_INFO_PREFIX in source
    if not known or "store.multi_get(" not in source:
        yield (f"torch's _assign_worker_ranks no longer reads the role infos ({ROLE_INFO_PREFIX!r}) with "
               "store.multi_get (launcher/rendezvous/round_failure.py)")
    settings_fields = class_fields(src.cls(DYNAMIC_RENDEZVOUS, "RendezvousSettings"))
    for name in ("keep_alive_interval", "keep_alive_max_attempt"):
        if name not in settings_fields:
            yield f"RendezvousSettings has no {name} (launcher/rendezvous/round_failure.py reads it)"


def check_master_port(src: TorchSource) -> Iterator[str]:
    """launcher/rendezvous/master_port.py replaces the ``get_free_port`` name of torch's rendezvous api module,
    which ``RendezvousStoreInfo.build`` calls for the workers' store port of a fresh store."""
    module = "torch.distributed.elastic.rendezvous.api"
    build = next((node for node in ast.walk(src.cls(module, "RendezvousStoreInfo"))
                  if isinstance(node, ast.FunctionDef) and node.name == "build"), None)
    calls = {ast.unparse(c.func) for c in ast.walk(build) if isinstance(c, ast.Call)} if build else set()
    if "get_free_port" not in calls:
        yield ("RendezvousStoreInfo.build no longer calls get_free_port() "
               "(launcher/rendezvous/master_port.py replaces it)")


CHECKS: tuple[Callable[[TorchSource], Iterator[str]], ...] = (
    check_hooks, check_start_workers_hands_us_envs, check_stop_workers, check_shutdown_timeout,
    check_invoke_run, check_private_attributes, check_private_names, check_data_we_read, check_environment_variables,
    check_launch_agent, check_launch_config, check_torchrun, check_our_imports, check_rendezvous_poll,
    check_c10d_read_timeout, check_membership, check_store_counter, check_master_port, check_rank_assignment,
)


def run_checks(root: Path) -> list[str]:
    """Every problem the launcher would have with the torch sources under ``root``.

    Args:
        root: The directory that contains the ``torch`` package's sources (at least
            ``torch/distributed/``).

    Returns:
        One message per problem, ``"check_name: what changed"``; empty when compatible.
    """
    src = TorchSource(root)
    problems = []
    for check in CHECKS:
        try:
            problems += [f"{check.__name__}: {p}" for p in check(src)]
        except (LookupError, OSError, SyntaxError, KeyError, StopIteration) as err:
            problems.append(f"{check.__name__}: cannot check: {type(err).__name__}: {err}")
    return problems
