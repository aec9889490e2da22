"""The private Lightning names ptl_resiliency relies on, checked on the installed Lightning.

Just-in-time state (``ptl_resiliency._jit_state``, ``_jit_restore``) reads the Trainer's
checkpoint connector and wraps the method that starts a run's restore. These tests pin what
that relies on: the names exist with the arguments we pass, the restore starts after the
callbacks' ``setup`` (where the wrapper is installed), a restore reads its file through
``strategy.load_checkpoint``, and building the checkpoint dict runs no collective. The first test
requires the list below to be complete: a new private name used anywhere in ptl_resiliency must
be added here (and so checked). ``make check-lightning-versions`` runs this file on every
supported Lightning minor.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

from ptl_resiliency._lightning import pl

LIGHTNING = f"lightning {pl.__version__}"
REPO = Path(__file__).resolve().parents[2]

LIGHTNING_PRIVATE_NAMES = {
    "_checkpoint_connector": "Trainer's checkpoint connector: dump_checkpoint() is the state a just-in-time save "
                            "copies (_jit_state.LightningProvider.capture); its restore is wrapped (_jit_restore)",
    "_restore_modules_and_callbacks": "the connector's method that starts a run's restore with the checkpoint "
                                      "path: wrapped on the instance to load FT_JIT_RESUME instead",
    "_combined_loader": "the fit loop's CombinedLoader: its resumable loaders' states at each batch end "
                        "(_jit_state.LightningProvider._rewind_loaders)",
    "_state_dicts": "the CombinedLoader's states of its resumable loaders, as the fit loop saves them under "
                    "loops.fit_loop.state_dict.combined_loader",
}
"""Every private Lightning name ptl_resiliency touches (an attribute or a name given to getattr/setattr)."""
NOT_LIGHTNING_PRIVATE_NAMES = {"_fields": "a namedtuple's field names (cpu_copy keeps namedtuples whole)"}

COLLECTIVES = ("barrier", "broadcast", "all_gather", "all_reduce", "reduce", "reduce_boolean_decision")


def _private_names_used() -> dict[str, set[str]]:
    """Private names ptl_resiliency reads that neither it nor ft_core defines."""
    ours: set[str] = set()
    for package in ("ptl_resiliency", "ft_core"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    ours.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    ours.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    ours.add(node.id)
    used: dict[str, set[str]] = {}
    for path in (REPO / "ptl_resiliency").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                name = node.value
            else:
                continue
            if name.startswith("_") and not name.startswith("__") and name not in ours:
                used.setdefault(name, set()).add(path.name)
    return used


def test_the_list_of_private_lightning_names_is_complete():
    used = _private_names_used()
    unknown = {name: files for name, files in used.items()
               if name not in LIGHTNING_PRIVATE_NAMES and name not in NOT_LIGHTNING_PRIVATE_NAMES}
    assert not unknown, f"private names used but not listed (and checked) here: {unknown}"
    unused = set(LIGHTNING_PRIVATE_NAMES) - set(used)
    assert not unused, f"listed but no longer used (remove them): {unused}"


def test_the_checkpoint_connector_has_the_methods_and_arguments_we_call():
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    connector = trainer._checkpoint_connector
    restore = inspect.signature(connector._restore_modules_and_callbacks)
    assert next(iter(restore.parameters)) == "checkpoint_path", f"{LIGHTNING}: {restore}"
    dump = inspect.signature(connector.dump_checkpoint)
    assert "weights_only" in dump.parameters, f"{LIGHTNING}: {dump}"
    assert "checkpoint_path" in inspect.signature(trainer.strategy.load_checkpoint).parameters


def _calls_in(function) -> list[str]:
    """The dotted names of the calls in ``function``'s source, in source order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    return [ast.unparse(node.func) for node in calls]


def test_the_restore_starts_after_the_callbacks_setup_and_reads_through_the_strategy():
    calls = _calls_in(pl.Trainer._run)
    setup = calls.index("call._call_setup_hook")
    restores = [i for i, name in enumerate(calls) if name.endswith("._restore_modules_and_callbacks")]
    assert restores and all(i > setup for i in restores), f"{LIGHTNING}: {calls}"
    connector = type(pl.Trainer(logger=False)._checkpoint_connector)
    assert "self.resume_start" in _calls_in(connector._restore_modules_and_callbacks), LIGHTNING
    assert "self.trainer.strategy.load_checkpoint" in _calls_in(connector.resume_start), LIGHTNING


def test_building_the_checkpoint_dict_runs_no_collective():
    """What a state thread runs while the main thread may be blocked in a collective: no collective
    of its own (the only one, a ZeRO optimizer's consolidation, is refused by sharding_reason)."""
    from lightning.pytorch.strategies import DDPStrategy, Strategy

    connector = type(pl.Trainer(logger=False)._checkpoint_connector)
    functions = [connector.dump_checkpoint, connector._get_lightning_module_state_dict,
                 Strategy.lightning_module_state_dict, DDPStrategy.lightning_module_state_dict]
    for function in functions:
        called = [name.rsplit(".", 1)[-1] for name in _calls_in(function)]
        assert not set(called) & set(COLLECTIVES), f"{LIGHTNING}: {function.__qualname__} calls {called}"
    optimizer_state = [name.rsplit(".", 1)[-1] for name in _calls_in(DDPStrategy.optimizer_state)]
    assert not set(optimizer_state) & set(COLLECTIVES) - {"consolidate_state_dict"}, LIGHTNING


def test_the_fit_loop_saves_and_loads_the_loaders_states_under_combined_loader():
    """LightningProvider._rewind_loaders replaces loops.fit_loop.state_dict.combined_loader."""
    from lightning.pytorch.loops.fit_loop import _FitLoop

    assert "self._combined_loader._state_dicts" in _calls_in(_FitLoop.on_save_checkpoint), LIGHTNING
    for function in (_FitLoop.on_save_checkpoint, _FitLoop.on_load_checkpoint):
        assert '"combined_loader"' in inspect.getsource(function), f"{LIGHTNING}: {function.__qualname__}"
    assert "processed" in vars(type(pl.Trainer(logger=False).fit_loop.epoch_loop.batch_progress.current))[
        "__dataclass_fields__"], LIGHTNING
