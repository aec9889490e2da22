"""What we rely on in torch's elastic agent and launcher, so that a torch upgrade fails here, loudly.

``FaultTolerantAgent`` overrides private ``LocalElasticAgent`` hooks and touches a few private
attributes, and ``launcher/launch.py`` rebuilds torch's ``launch_agent`` (which hard-codes
``LocalElasticAgent``) from torch's own building blocks. Each test names what changed and where
we depend on it.
"""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import signal
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed import run as torch_run
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.agent.server import local_elastic_agent
from torch.distributed.elastic.agent.server.api import (
    RunResult,
    SimpleElasticAgent,
    WorkerGroup,
    WorkerSpec,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
from torch.distributed.launcher import api as launcher_api

from launcher import launch as our_launch
from launcher import launch_config, torch_compat
from launcher.agent import FaultTolerantAgent
from launcher.cli import get_args_parser
from launcher.node import environment
from launcher.rendezvous.store_channel import STORE_ERRORS
from tests.torch_source_checks import (
    HOOKS,
    INVOKE_RUN_FRAGMENTS,
    LAUNCH_AGENT_CALLS,
    LAUNCH_CONFIG_FIELDS_READ,
    LOCAL_ELASTIC_AGENT_ARGS_LEFT_OUT,
    MEMBERSHIP_HANDLER_ATTRIBUTES,
    NOT_TORCH_PRIVATE_NAMES,
    OUR_AGENT_ARG_NAMES,
    TORCH_PRIVATE_ATTRIBUTES,
    TORCH_PRIVATE_NAMES,
    check_private_attributes,
    check_private_names,
    run_checks,
    torchrun_run_fragments,
)

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"

# One list of what we rely on, shared with the static checks that run on every supported
# release's sources (make check-torch-versions).
# The unit tests below check the installed torch at run time; the last ones run the static
# checks on the installed torch's sources.


def function_ast(func) -> ast.FunctionDef:
    return ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]


def calls_in(tree: ast.AST) -> dict[str, ast.Call]:
    return {ast.unparse(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}


def keywords(call: ast.Call) -> set[str]:
    return {k.arg for k in call.keywords if k.arg is not None}


def spec(**overrides) -> WorkerSpec:
    return WorkerSpec(**{"role": "trainer", "local_world_size": 1, "rdzv_handler": None,
                         "entrypoint": "/bin/true", "max_restarts": 3, **overrides})


# ---------------------------------------------------------------------- the hooks


def test_overridden_hooks_match_torch():
    for name, params in HOOKS.items():
        theirs = list(inspect.signature(getattr(LocalElasticAgent, name)).parameters)
        ours = list(inspect.signature(getattr(FaultTolerantAgent, name)).parameters)
        # torch < 2.12: _shutdown(death_sig) without a timeout; ours still takes one (and defaults it)
        expected = params[:-1] if name == "_shutdown" and not torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT else params
        assert theirs == expected, f"torch changed LocalElasticAgent.{name}: {theirs}"
        assert ours == params, f"FaultTolerantAgent.{name} drifted: {ours}"
    # torch < 2.12 calls _shutdown() and _shutdown(sig) without a timeout: ours then takes --term-timeout
    assert inspect.signature(FaultTolerantAgent._shutdown).parameters["timeout"].default is None


def test_the_installed_torch_is_of_one_shape():
    # launcher.torch_compat gates the agent's constructor argument and the _shutdown call on one flag.
    init = inspect.signature(LocalElasticAgent.__init__).parameters
    assert ("shutdown_timeout" in init) == torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT
    assert ("shutdown_timeout" in torch_compat.LAUNCH_CONFIG_FIELDS) == torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT
    assert torch_compat.agent_shutdown_kwargs(1.5) == (
        {"shutdown_timeout": 1.5} if torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT else {})
    assert torch_compat.torch_shutdown_kwargs(1.5) == (
        {"timeout": 2} if torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT else {})


def test_torch_calls_the_env_hook_with_per_rank_envs():
    # We inject per-rank variables through _setup_local_watchdog(envs); torch must call it from
    # _start_workers with the per-local-rank environment dicts, before starting processes.
    source = inspect.getsource(LocalElasticAgent._start_workers)
    assert "self._setup_local_watchdog(envs=envs)" in source, "torch no longer hands us the worker envs"
    assert source.index("_setup_local_watchdog") < source.index("start_processes(")


def test_torchs_stop_workers_is_only_shutdown_with_its_default_timeout():
    # FaultTolerantAgent._stop_workers replaces it with self._shutdown(timeout=--term-timeout).
    body = function_ast(LocalElasticAgent._stop_workers).body
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstring
    assert [ast.unparse(s) for s in body] == ["self._shutdown()"], (
        "torch's LocalElasticAgent._stop_workers now does more than self._shutdown(); "
        "FaultTolerantAgent._stop_workers must do it too")


def test_torch_passes_shutdown_timeout_only_to_shutdown():
    # We hand torch a fractional --term-timeout as shutdown_timeout (typed int in torch) and rely
    # on torch using it only as _shutdown(timeout=...), which is our override.
    uses = [node for module in (agent_api, local_elastic_agent)
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Attribute) and node.attr == "_shutdown_timeout"]
    if not torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT:  # torch < 2.12: none, and run() passes no timeout
        assert not uses
        run_calls = [ast.unparse(c) for c in ast.walk(function_ast(SimpleElasticAgent.run))
                     if isinstance(c, ast.Call) and ast.unparse(c.func) == "self._shutdown"]
        assert sorted(run_calls) == ["self._shutdown()", "self._shutdown(e.sigval)"], run_calls
        return
    assert uses, "torch no longer has _shutdown_timeout"
    tree = ast.parse(inspect.getsource(agent_api))
    allowed = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "self._shutdown_timeout" for t in node.targets):
            assert ast.unparse(node.value) == "shutdown_timeout"
            allowed += 1
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "self._shutdown":
            allowed += sum(1 for k in node.keywords if ast.unparse(k.value) == "self._shutdown_timeout")
    assert allowed == len(uses), "torch uses _shutdown_timeout elsewhere than in __init__ and _shutdown(timeout=...)"
    run_calls = [ast.unparse(c) for c in ast.walk(function_ast(SimpleElasticAgent.run))
                 if isinstance(c, ast.Call) and ast.unparse(c.func) == "self._shutdown"]
    assert sorted(run_calls) == sorted(["self._shutdown(e.sigval, timeout=self._shutdown_timeout)",
                                        "self._shutdown(timeout=self._shutdown_timeout)"]), run_calls


def test_the_loop_we_plug_into():
    source = inspect.getsource(SimpleElasticAgent._invoke_run)
    for fragment, why in INVOKE_RUN_FRAGMENTS:
        assert fragment in source, f"torch's _invoke_run changed ({fragment!r}): {why}"
    assert "self._store = store" in inspect.getsource(SimpleElasticAgent._rendezvous), (
        "torch's _rendezvous no longer sets self._store; StoreChannel.attach reads it")


# ---------------------------------------------------------------------- private attributes


def our_agent_source() -> ast.Module:
    return ast.parse((LAUNCHER / "agent.py").read_text())


def private_self_attributes(tree: ast.AST) -> set[str]:
    """``self._x`` and ``getattr(self, "_x", ...)`` (``hasattr``, ``setattr``) in ``tree``."""
    named = {node.args[1].value for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
             and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
             and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"}
    return {name for name in named | attributes if name.startswith("_") and not name.startswith("__")}


def ours_defined(tree: ast.Module) -> set[str]:
    """Attributes FaultTolerantAgent.__init__ assigns and the methods it defines."""
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FaultTolerantAgent")
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return methods | assigned


def torch_attributes() -> set[str]:
    agent = LocalElasticAgent(spec(), logs_specs=DefaultLogsSpecs(log_dir=os.devnull))
    return set(vars(agent)) | set(dir(LocalElasticAgent))


def test_every_private_torch_attribute_we_touch_is_listed_and_exists():
    tree = our_agent_source()
    ours = ours_defined(tree) - set(HOOKS)
    theirs = private_self_attributes(tree) - ours - set(HOOKS)
    assert theirs == set(TORCH_PRIVATE_ATTRIBUTES), (
        f"agent.py touches private torch attributes {sorted(theirs - set(TORCH_PRIVATE_ATTRIBUTES))} not listed "
        f"in TORCH_PRIVATE_ATTRIBUTES (or no longer touches {sorted(set(TORCH_PRIVATE_ATTRIBUTES) - theirs)})")
    torch_names = torch_attributes()
    missing = set(TORCH_PRIVATE_ATTRIBUTES) - torch_names
    assert not missing, f"torch's LocalElasticAgent no longer has {sorted(missing)}"


def test_our_attributes_do_not_shadow_torchs():
    clashes = (ours_defined(our_agent_source()) - set(HOOKS) - {"__init__"}) & torch_attributes()
    assert not clashes, f"FaultTolerantAgent's attributes {sorted(clashes)} now shadow torch's: rename ours"


def test_private_attribute_values_after_construction():
    agent = LocalElasticAgent(spec(max_restarts=5), logs_specs=DefaultLogsSpecs(log_dir=os.devnull),
                              **torch_compat.agent_shutdown_kwargs(1.5))
    assert agent._remaining_restarts == 5
    assert agent._store is None  # set by _rendezvous
    if torch_compat.AGENT_SHUTDOWN_TAKES_TIMEOUT:
        assert agent._shutdown_timeout == 1.5  # stored as given (torch types it int; we pass a float)
        assert inspect.signature(LocalElasticAgent._shutdown).parameters["timeout"].default == 30
    else:  # its process context's close gives the 30 s launch_config supplies as shutdown_timeout
        close = inspect.signature(mp_api.PContext.close).parameters["timeout"].default
        assert close == launch_config.LAUNCH_CONFIG_WITHOUT_FIELD["shutdown_timeout"]


def test_nothing_outside_the_agent_reads_private_attributes_of_other_objects():
    # Each private torch name is listed with the torch module that has it (torch_source_checks
    # checks them on every supported release); the standard library's are listed apart.
    allowed = set(NOT_TORCH_PRIVATE_NAMES)
    allowed_in = {module: set(names) for module, names in TORCH_PRIVATE_NAMES.items()}
    assert set(MEMBERSHIP_HANDLER_ATTRIBUTES) == allowed_in["rendezvous/membership.py"]
    found = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        name = path.relative_to(LAUNCHER).as_posix()
        if name == "agent.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr not in allowed | allowed_in.get(name, set())):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


# ---------------------------------------------------------------------- data we read


def test_the_data_torch_hands_us():
    group = WorkerGroup(spec(local_world_size=2))
    for name in ("workers", "group_rank", "group_world_size", "spec", "store"):
        assert hasattr(group, name), f"torch's WorkerGroup has no {name!r} any more"
    for name in ("local_rank", "global_rank"):
        assert hasattr(group.workers[0], name), f"torch's Worker has no {name!r} any more"
    assert {f.name for f in fields(RunResult)} >= {"state", "failures"}
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file="<N/A>")
    for name in ("local_rank", "pid", "exitcode", "message"):
        assert hasattr(failure, name), f"torch's ProcessFailure has no {name!r} any more"
    assert SignalException("x", sigval=signal.SIGTERM).sigval == signal.SIGTERM


def test_store_errors_are_what_we_catch():
    # launcher.rendezvous.store_channel catches STORE_ERRORS around every store operation
    for error in (dist.DistStoreError, dist.DistNetworkError, dist.DistError):
        assert issubclass(error, STORE_ERRORS), f"torch's {error.__name__} is no longer a {STORE_ERRORS}"


def test_environment_variables_torch_still_reads():
    assert environment.SHARE_STORE_ENV in inspect.getsource(dynamic_rendezvous), (
        "torch's c10d rendezvous no longer reads TORCH_DISABLE_SHARE_RDZV_TCP_STORE (fresh store per round)")
    # torch < 2.10 handles a fixed set of signals (LAUNCH_CONFIG_WITHOUT_FIELD) and reads no variable
    reads = environment.SIGNALS_TO_HANDLE_ENV in inspect.getsource(mp_api)
    assert reads == ("signals_to_handle" in torch_compat.LAUNCH_CONFIG_FIELDS)


# ---------------------------------------------------------------------- the launch_agent we rebuild


def test_launch_agent_does_nothing_we_do_not_know_about():
    calls = set(calls_in(function_ast(launcher_api.launch_agent)))
    assert calls <= set(LAUNCH_AGENT_CALLS), (
        f"torch's launch_agent now also calls {sorted(calls - set(LAUNCH_AGENT_CALLS))}: check "
        "launcher/launch.py, which rebuilds it")
    source = inspect.getsource(launcher_api.launch_agent)
    # launcher.node.environment.set_up_environment sets it as launch_agent does (torch >= 2.10)
    assert (f'os.environ["{environment.SIGNALS_TO_HANDLE_ENV}"] = config.signals_to_handle' in source) == (
        "signals_to_handle" in torch_compat.LAUNCH_CONFIG_FIELDS)
    assert "shutdown_rdzv = False" in source  # not after a signal: the others keep the rendezvous


def test_we_build_the_worker_spec_as_launch_agent_does(tmp_path):
    theirs = keywords(calls_in(function_ast(launcher_api.launch_agent))["WorkerSpec"])
    tree = function_ast(launch_config.worker_spec_kwargs)
    always = {ast.literal_eval(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys}
    ours = always | (set(launch_config.WORKER_SPEC_FIELDS_SINCE) & torch_compat.WORKER_SPEC_FIELDS)
    assert ours == theirs, f"launch_agent's WorkerSpec fields changed: {sorted(theirs ^ ours)}"
    assert ours <= {f.name for f in fields(WorkerSpec)}
    built = launch_config.worker_spec_kwargs(launch_config.read_launch_config(
        get_args_parser().parse_args(["--standalone", "train.py"]), str(tmp_path))[0], "python", [], None, None, None)
    assert set(built) == theirs


def test_we_build_the_agent_and_rendezvous_parameters_as_launch_agent_does():
    theirs = calls_in(function_ast(launcher_api.launch_agent))
    ours = calls_in(ast.parse(inspect.getsource(our_launch)))  # the agent is built there
    ours_rdzv = calls_in(ast.parse(inspect.getsource(launch_config)))  # the rendezvous there
    agent_args = keywords(theirs["LocalElasticAgent"]) - set(LOCAL_ELASTIC_AGENT_ARGS_LEFT_OUT)
    passed = keywords(ours["FaultTolerantAgent"]) | {"spec", "logs_specs"}  # the first two are positional
    missing = {a for a in agent_args if OUR_AGENT_ARG_NAMES.get(a, a) not in passed}
    assert not missing, f"torch's launch_agent now gives LocalElasticAgent {sorted(missing)}; we do not"
    params = inspect.signature(LocalElasticAgent.__init__).parameters
    assert keywords(theirs["LocalElasticAgent"]) <= set(params)
    assert keywords(theirs["RendezvousParameters"]) == keywords(ours_rdzv["RendezvousParameters"])
    assert inspect.signature(RendezvousParameters.__init__).parameters.keys() >= {
        "backend", "endpoint", "run_id", "min_nodes", "max_nodes", "local_addr", "kwargs"}


def test_config_from_args_gives_what_we_read(tmp_path):
    args = get_args_parser().parse_args(["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                                         "--nproc-per-node", "1", "--log-dir", str(tmp_path), "train.py", "--x"])
    launch_config.apply_torchrun_defaults(args)
    config, entrypoint, entry_args = torch_run.config_from_args(args)
    absent_in_this_torch = set(launch_config.WORKER_SPEC_FIELDS_SINCE) - torch_compat.WORKER_SPEC_FIELDS
    # what torch < 2.12 lacks is read through launch_config_value
    supplied = set(launch_config.LAUNCH_CONFIG_WITHOUT_FIELD) - torch_compat.LAUNCH_CONFIG_FIELDS
    missing = {name for name in LAUNCH_CONFIG_FIELDS_READ - absent_in_this_torch - supplied
               if not hasattr(config, name)}
    for name in launch_config.LAUNCH_CONFIG_WITHOUT_FIELD:
        assert launch_config.launch_config_value(config, name) is not None
    assert not missing, f"torch's LaunchConfig no longer has {sorted(missing)}"
    assert isinstance(entrypoint, str) and entry_args[0] == "-u" and entry_args[-2:] == ["train.py", "--x"]


@pytest.mark.parametrize(("argv", "backend", "endpoint"), [
    (["--standalone"], "c10d", "localhost:0"),
    ([], "c10d", "localhost:0"),  # torchrun's single-node static default
    (["--nnodes", "2", "--master-addr", "h", "--master-port", "1234"], "static", ""),
])
def test_torchrun_defaults_are_applied_as_torchrun_does(argv, backend, endpoint):
    source = inspect.getsource(torch_run.run)
    if torch_run.get_args_parser().get_default("master_port") is None:
        for fragment in torchrun_run_fragments():
            assert fragment in source, f"torchrun's run() changed ({fragment!r}); see apply_torchrun_defaults"
    else:  # torch < 2.12: the parser's 29500 counts as not given (the same single-node c10d run)
        assert torch_run.get_args_parser().get_default("master_port") == launch_config.TORCHRUN_MASTER_PORT
    args = get_args_parser().parse_args([*argv, "train.py"])
    launch_config.apply_torchrun_defaults(args)
    assert (args.rdzv_backend, args.rdzv_endpoint) == (backend, endpoint)


def test_the_torchrun_defaults_we_compare_with_are_torchruns_own():
    # launcher.options.torchrun_default reads torchrun's parser: no copies of its defaults.
    from launcher.options import torchrun_default

    theirs = torch_run.get_args_parser()
    for dest in ("redirects", "tee", "shutdown_timeout", "log_dir"):
        assert torchrun_default(dest) == theirs.get_default(dest)
    args = get_args_parser().parse_args(["train.py"])
    assert not launch_config.keeps_torch_logs(args)
    assert launch_config.keeps_torch_logs(get_args_parser().parse_args(["--tee", "3", "train.py"]))


def test_c10d_defaults_we_rely_on_are_torchs():
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    source = inspect.getsource(c10d_rendezvous_backend)
    assert f'"read_timeout", {launch_config.C10D_DEFAULT_READ_TIMEOUT:g})' in source
    assert launch_config.C10D_DEFAULT_PORT == c10d_rendezvous_backend.DEFAULT_PORT


# ---------------------------------------------------------------------- the static checks


TORCH_SOURCES = Path(torch_run.__file__).resolve().parents[2]


def test_static_checks_pass_on_the_installed_torch():
    # The same checks make check-torch-versions runs on each supported release's sources.
    assert run_checks(TORCH_SOURCES) == []


def problems_with_an_edit(tmp_path: Path, relative: str, old: str, new: str) -> list[str]:
    """The static checks' problems on a copy of the installed torch.distributed with ``old``
    replaced by ``new`` in ``relative`` (a path under torch/distributed/elastic)."""
    shutil.copytree(TORCH_SOURCES / "torch" / "distributed", tmp_path / "torch" / "distributed")
    edited = tmp_path / "torch" / "distributed" / "elastic" / relative
    text = edited.read_text()
    assert old in text
    edited.write_text(text.replace(old, new))
    return run_checks(tmp_path)


def test_static_checks_find_a_changed_hook(tmp_path):
    problems = problems_with_an_edit(tmp_path, "agent/server/local_elastic_agent.py",
                                     "def _setup_local_watchdog(self, envs",
                                     "def _setup_local_watchdog(self, worker_envs")
    assert len(problems) == 1 and "_setup_local_watchdog" in problems[0], problems


def test_static_checks_find_a_renamed_store_of_the_c10d_backend(tmp_path):
    # launcher/rendezvous/store_counter.py (FT_STORE_COUNTS) swaps C10dRendezvousBackend._store
    problems = problems_with_an_edit(tmp_path, "rendezvous/c10d_rendezvous_backend.py",
                                     "self._store = store", "self._the_store = store")
    assert any(p.startswith("check_store_counter") and "C10dRendezvousBackend" in p for p in problems), problems


def test_static_checks_find_a_rank_assignment_under_other_keys(tmp_path):
    # launcher/rendezvous/round_failure.py names the members whose role info is missing by torch's key
    problems = problems_with_an_edit(tmp_path, "agent/server/api.py",
                                     'ROLE_INFO_PREFIX = "torchelastic/role_info/"', 'ROLE_INFO_PREFIX = "role/"')
    assert any(p.startswith("check_rank_assignment") for p in problems), problems


def test_static_checks_find_a_rendezvous_that_picks_its_port_another_way(tmp_path):
    # launcher/rendezvous/master_port.py replaces the get_free_port that RendezvousStoreInfo.build calls
    problems = problems_with_an_edit(tmp_path, "rendezvous/api.py",
                                     "server_port or get_free_port()", "server_port or _any_port()")
    assert any(p.startswith("check_master_port") for p in problems), problems


def test_torchs_log_lines_that_name_a_pid_are_the_ones_we_rewrite():
    # launcher.node.torch_logs._WorkerPidLogFilter makes these name the worker's own pid (under warm
    # restarts torch knows only the stand-in): the messages and argument positions must be torch's.
    from launcher.node.torch_logs import TORCH_PID_LINES, TORCH_PROCESS_LOGGER

    assert mp_api.logger.name == TORCH_PROCESS_LOGGER
    source = inspect.getsource(mp_api)
    for message, index in TORCH_PID_LINES.items():
        assert f'"{message}"' in source, message
        assert message.split("%s")[index].endswith(("pid: ", "process ")), message


def test_static_checks_find_a_private_torch_name_that_is_not_listed(monkeypatch):
    import tests.torch_source_checks as checks

    src = checks.TorchSource(Path(dist.__file__).parents[1])
    unlisted = {k: v for k, v in TORCH_PRIVATE_ATTRIBUTES.items() if k != "_pcontext"}
    monkeypatch.setattr(checks, "TORCH_PRIVATE_ATTRIBUTES", unlisted)
    assert any("'_pcontext'" in problem for problem in check_private_attributes(src))
    without_poll = {k: v for k, v in TORCH_PRIVATE_NAMES.items() if k != "rendezvous/poll.py"}
    monkeypatch.setattr(checks, "TORCH_PRIVATE_NAMES", without_poll)
    assert any("rendezvous/poll.py" in problem and "_delay" in problem for problem in check_private_names(src))
