"""The private LocalElasticAgent hooks we override still have the signatures we rely on."""

import inspect

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from launcher.agent import FaultTolerantAgent

EXPECTED = {
    "_start_workers": ["self", "worker_group"],
    "_stop_workers": ["self", "worker_group"],
    "_monitor_workers": ["self", "worker_group"],
    "_shutdown": ["self", "death_sig", "timeout"],
    "_restart_workers": ["self", "worker_group"],
    "_rendezvous": ["self", "worker_group"],
    "_setup_local_watchdog": ["self", "envs"],
}


def test_overridden_hooks_match_torch():
    for name, params in EXPECTED.items():
        theirs = list(inspect.signature(getattr(LocalElasticAgent, name)).parameters)
        ours = list(inspect.signature(getattr(FaultTolerantAgent, name)).parameters)
        assert theirs == params, f"torch changed LocalElasticAgent.{name}: {theirs}"
        assert ours == params, f"FaultTolerantAgent.{name} drifted: {ours}"


def test_torch_calls_the_env_hook_with_per_rank_envs():
    # We inject per-rank variables through _setup_local_watchdog(envs); torch must call it from
    # _start_workers with the per-local-rank environment dicts, before starting processes.
    source = inspect.getsource(LocalElasticAgent._start_workers)
    assert "self._setup_local_watchdog(envs=envs)" in source
    assert source.index("_setup_local_watchdog") < source.index("start_processes(")


def test_agent_constructor_accepts_what_we_pass():
    params = inspect.signature(LocalElasticAgent.__init__).parameters
    for name in ("spec", "logs_specs", "start_method", "log_line_prefix_template", "shutdown_timeout"):
        assert name in params
