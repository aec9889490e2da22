"""Every fenced block of README.md and docs/*.md is run, compiled, or excluded for a stated reason.

Each block is named by a piece of its text found in no other block of its file. ``RUN`` names the
test that runs it as written (or checks it against real output); ``COMPILED_ONLY`` says why it is
only compiled; ``EXCLUDED`` why a text block is neither (output excerpts, diagrams, synopses).
Every ``python`` block must parse and every ``bash`` block must pass ``bash -n``, whatever its
entry. A new block that is in none of the three tables fails ``test_every_block_is_accounted_for``,
so none is left out silently. docs/porting.md has no blocks: its table's imports are run here.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]

SNIPPETS = "tests/integration/test_docs_snippets.py"
LIGHTNING_RUN = f"{SNIPPETS}::test_lightning_md_snippets_run_under_ft_launcher"
PER_NODE_RUN = f"{SNIPPETS}::test_launcher_md_command_and_ft_report_on_per_node_logs"
AUTORESUME_RUN = f"{SNIPPETS}::test_autoresume_local_command_and_ft_report_on_its_run_dir"
BENCH = "benchmark: minutes each; the nvrx lines need the reference's venv (.venv-peer)"
DOCS_TEST = "tests/integration/test_docs.py"

RUN: dict[tuple[str, str], str] = {
    ("README.md", "pip install '/path/to/ptl-resiliency[lightning]'"): "tests/integration/test_install.py::fresh_venv",
    ("README.md", "source .venv/bin/activate"): f"{DOCS_TEST}::test_the_readme_example_runs_as_written",
    ("docs/autoresume.md", "# On a workstation: the loop runs in place."):
        AUTORESUME_RUN,
    ("docs/integration.md", "import ft_core.integration as ft_integration"):
        f"{DOCS_TEST}::test_the_loop_integration_snippet_and_command_run_as_written",
    ("docs/integration.md", "ft_launcher --standalone --nproc-per-node 8"):
        f"{DOCS_TEST}::test_the_loop_integration_snippet_and_command_run_as_written",
    ("docs/integration.md", "graceful_stop=True)"):
        f"{SNIPPETS}::test_integration_md_graceful_stop_and_simulated_fault_snippets_run",
    ("docs/integration.md", "ft_integration.maybe_setup_simulated_fault("):
        f"{SNIPPETS}::test_integration_md_graceful_stop_and_simulated_fault_snippets_run",
    ("docs/launcher.md", "# one node, 2 workers"): PER_NODE_RUN,
    ("docs/launcher.md", "ft_report runs/a "): f"{AUTORESUME_RUN} and {PER_NODE_RUN}",
    ("docs/lightning.md", "import lightning.pytorch as pl"):
        f"{DOCS_TEST}::test_the_quick_start_keeps_its_calculated_timeouts_across_runs",
    ("docs/lightning.md", "FAULT_TOL_FINISHED_FLAG_FILE=$PWD/finished.flag"):
        f"{DOCS_TEST}::test_the_quick_start_keeps_its_calculated_timeouts_across_runs",
    ("docs/lightning.md", "from ptl_resiliency import FaultToleranceSectionsCallback"):
        LIGHTNING_RUN,
    ("docs/lightning.md", "graceful_stop=True)"): LIGHTNING_RUN,
    ("docs/lightning.md", "def policy(exc: BaseException)"): LIGHTNING_RUN,
    ("docs/lightning.md", "if torch.distributed.is_initialized():"):
        LIGHTNING_RUN,
    ("docs/lightning.md", "SimulatedFaultParams(fault_type"): LIGHTNING_RUN,
    ("docs/lightning.md", "requested ShutdownWorkload: ConfigError"):
        f"{DOCS_TEST}::test_the_quoted_config_error_line_is_the_launchers",
    ("docs/multinode.md", "#SBATCH --nodes=3"):
        "tests/cluster/test_documented_sbatch.py::test_documented_sbatch_example_survives_a_node_loss_and_requeues_on_the_nodes_left",
    ("docs/stragglers.md", "from ptl_resiliency import StragglerDetectionCallback"):
        f"{SNIPPETS}::test_stragglers_md_example_runs_under_ft_launcher",
}

COMPILED_ONLY: dict[tuple[str, str], str] = {
    ("README.md", "make demo"):
        "make targets: `make test` is the suite itself; `make demo` runs examples/demo/run_demo.py, "
        "which tests/integration/test_demo.py runs as the Makefile does",
    ("docs/autoresume.md", "#SBATCH --signal=B:USR1@300"):
        "a fragment of an sbatch file (its arguments are `...`); multinode.md's whole sbatch example "
        "is run on the cluster",
    ("docs/benchmarks.md", "bench/client_overhead.py"): BENCH,
    ("docs/benchmarks.md", "bench/hang_detection.py"): BENCH,
    ("docs/benchmarks.md", "bench/restart_latency.py"): BENCH,
    ("docs/benchmarks.md", "bench/monitor_footprint.py"): BENCH,
    ("docs/benchmarks.md", "bench/lightning_overhead.py"): BENCH,
    ("docs/benchmarks.md", "bench/goodput.py"): BENCH,
    ("docs/local-checkpoints.md", "bench/local_checkpoint_overhead.py"): BENCH,
    ("docs/local-checkpoints.md", "bench/nvrx_local_checkpoint_cpu.py"):
        "needs the reference's venv (.venv-peer); tests/unit/test_nvrx_local_checkpoint_cpu.py runs it there",
    ("docs/benchmarks.md", "bench/goodput_node_loss.py"):
        "benchmark: 2 tools x 2 runs of three launchers, about 8 minutes here; its --quick mode runs in "
        "tests/integration/test_goodput_node_loss.py",
    ("docs/local-checkpoints.md", "LazyCliqueReplicationStrategy(),"):
        "needs a process group and node-local paths; tests/workers/local_ckpt_train.py builds the same objects "
        "with the same arguments and tests/integration/test_local_checkpoints.py runs it under ft_launcher",
    ("docs/benchmarks.md", "bench/goodput_realistic.py"): "benchmark: 3 tools x 2 runs, about 12 minutes here",
    ("docs/benchmarks.md", "bench/soak.py"): "soak test: 11 and 4 minutes",
    ("docs/benchmarks.md", "bench/scale.py"): "scale benchmark: up to 128 simulated nodes",
    ("docs/benchmarks.md", "bench/straggler_overhead.py"): "benchmark: minutes",
    ("docs/lightning.md", "timeout=300 \\\n    --ft-param-initial_rank_heartbeat_timeout=null"):
        "8 Lightning ranks on CPU are too heavy for CI; integration.md's command, with the same options, "
        "is run as written (8 plain-torch ranks) by test_docs.py",
    ("docs/lightning.md", "#SBATCH --nodes=2"):
        "an sbatch script: needs a SLURM cluster (multinode.md's sbatch example, the same pattern, "
        "is run by tests/cluster/test_documented_sbatch.py)",
    ("docs/multinode.md", "scontrol show hostnames"): "srun and scontrol: runs only inside a SLURM allocation",
    ("docs/jit-state.md", "ft_integration.track_state(model, optimizer, extra="):
        "a fragment (your model, optimizer and checkpoint loader); tests/workers/jit_plain_train.py makes "
        "the same calls under ft_launcher in tests/integration/test_jit_state_plain.py",
}

EXCLUDED: dict[tuple[str, str], str] = {
    ("docs/jit-state.md", "cycle 0: rank 0 saved its state of step 137"): "output: the launcher's two lines",
    ("docs/jit-state.md", "cycle 1: the newest just-in-time state"): "output: the agreement's fallback line",
    ("docs/jit-state.md", "healed from node 0 (host-a)"): "output: the restart's line after a heal",
    ("docs/jit-state.md", "healing from node 0 (host-a) failed"): "output: the fallback line after a failed heal",
    ("docs/jit-state.md", "that the previous job copied to"): "output: a requeued plain loop's line",
    ("docs/autoresume.md", "attempt\tjob_id"): "output: an example history.tsv",
    ("docs/autoresume.md", "srun --nodes=$SLURM_NNODES"):
        "a synopsis ([optional] parts, <placeholders>), not a command",
    ("docs/design.md", "├── sentinel"): "a diagram of the processes",
    ("docs/design.md", "ft_core/             the reference's public paths"): "a diagram of the source tree",
    ("docs/integration.md", "==== demo summary ===="): "output: the demo's summary (times and pids of one run)",
    ("docs/launcher.md", "INFO: effective configuration"): "output: a log excerpt (example values)",
    ("docs/launcher.md", "unknown fault tolerance config key(s)"): "output: an error message excerpt",
    ("docs/launcher.md", "rank 1 froze (its process was stopped)"): "output: failure lines of one run",
    ("docs/launcher.md", "a node of its round was dropped from the rendezvous); restarting"):
        "output: a survivor's line after a node was dropped (its text checked by tests/integration/test_detection.py)",
    ("docs/launcher.md", "[ft_launcher] summary: 3 cycles"): "output: summary lines of two runs",
    ("docs/launcher.md", "wall time 17.1 s"): "output: ft_report's figures for one run",
    ("docs/launcher.md", "[n1] cycle 1: rank 0 saved its just-in-time state"):
        "output: ft_report's timeline lines of what failures cost (example values)",
    ("docs/stragglers.md", "GPU relative performance:"): "output: a 32-GPU run's log excerpt",
    ("docs/stragglers.md", "not replaced: no spare node waits"):
        "output: the launcher's line (tests/integration/test_stragglers.py::test_replace_with_no_spare_... asserts it)",
}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def doc_blocks(doc: str) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of ``doc`` (a path relative to the repository)."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((REPO / doc).read_text())]


def block_containing(doc: str, marker: str) -> str:
    """The one fenced block of ``doc`` whose text contains ``marker``; fails if none or several do."""
    found = [text for _, text in doc_blocks(doc) if marker in text]
    assert len(found) == 1, f"{len(found)} blocks of {doc} contain {marker!r} (the doc changed?)"
    return found[0]


def test_every_block_is_accounted_for():
    tables = {**RUN, **COMPILED_ONLY, **EXCLUDED}
    assert len(tables) == len(RUN) + len(COMPILED_ONLY) + len(EXCLUDED), "an entry is in two tables"
    missing, claimed = [], {}
    for doc in DOC_FILES:
        for index, (_, text) in enumerate(doc_blocks(doc)):
            entries = [key for key in tables if key[0] == doc and key[1] in text]
            if not entries:
                missing.append(f"{doc}: block {index + 1}: {text.splitlines()[0]!r}")
            assert len(entries) <= 1, f"{doc}: block {index + 1} is named by {entries}"
            claimed.update(dict.fromkeys(entries, index))
    assert not missing, ("blocks that no test runs, compiles or excludes; add each to RUN, COMPILED_ONLY or "
                         f"EXCLUDED in {__file__}: {missing}")
    stale = [key for key in tables if key not in claimed]
    assert not stale, f"entries that name no block (the doc changed?): {stale}"


def test_run_entries_name_existing_tests():
    for target in RUN.values():
        for one in target.split(" and "):
            path, name = one.split("::")
            tree = ast.parse((REPO / path).read_text())
            names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name in names, f"{path} has no {name}"


def test_excluded_blocks_are_text_and_not_commands():
    for doc, marker in EXCLUDED:
        [language] = [lang for lang, text in doc_blocks(doc) if marker in text]
        assert language == "", f"{doc}: {marker!r} is a {language} block: compile it (COMPILED_ONLY) or run it"


@pytest.mark.parametrize("doc", DOC_FILES)
def test_python_blocks_parse_and_bash_blocks_pass_bash_n(doc):
    for language, text in doc_blocks(doc):
        if language == "python":
            ast.parse(text, filename=doc)
        elif language == "bash":
            check = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True, timeout=30)
            assert check.returncode == 0, f"{doc}: bash -n: {check.stderr}\n{text}"
        else:
            assert language == "", f"{doc}: a {language} block: add its compile check here"


def porting_imports() -> list[str]:
    """``from MODULE import NAMES`` for each row of docs/porting.md's first table, the one that says
    "Every name above imports from the module shown" (the names in the reference column's
    parentheses, imported from the module in the ptl-resiliency column)."""
    statements = []
    text = (REPO / "docs" / "porting.md").read_text()
    for line in text[:text.index("Every name above imports from the module shown")].splitlines():
        row = re.fullmatch(r"\| `nvidia_resiliency_ext[.\w]*`(?: \((.*)\))? \| `([\w.]+)`.*\|", line)
        if row:
            names = re.findall(r"`(\w+)`", row.group(1) or "")
            statements.append(f"from {row.group(2)} import {', '.join(names)}" if names else f"import {row.group(2)}")
    return statements


def test_porting_md_imports_import():
    statements = porting_imports()
    assert len(statements) >= 9, statements
    assert "from ft_core.rank_monitor_client import RankMonitorClient, RankMonitorClientError" in statements
    for statement in statements:
        namespace: dict[str, object] = {}
        exec(statement, namespace)  # noqa: S102 - the doc's own import lines
        module = importlib.import_module(statement.split()[1])
        assert module is not None
