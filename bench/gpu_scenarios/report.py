"""The GPU check's results: one record per scenario, the table, the JSON file, the docs section.

Pure and stdlib only: ``bench/gpu_check.py`` and ``bench/run_all.py`` use it without torch, and
``tests/unit/test_gpu_check.py`` checks it on CPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ft_core.wire.atomic import atomic_write_text

FORMAT = 1
RESULTS = ("pass", "fail", "skipped", "error")
SECTION_TITLE = "## Reference: GPU check (`make gpu-check`)"


@dataclass(frozen=True)
class Scenario:
    """What the check runs: its number in issue 34, id, title and the ranks it needs."""

    number: int
    id: str
    title: str
    ranks: int  # ranks on NCCL it needs at once (2: one device each unless NCCL accepts two on one)
    proves: str = ""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(1, "nccl_hang", "rank hung in an NCCL all-reduce: detected, all stopped, restarted", 2,
             "rank 1 stops calling the all-reduce, rank 0 waits in it on the GPU; the heartbeat timeout "
             "(10 s) catches it before NCCL's watchdog (60 s process group timeout) fires, both ranks are "
             "stopped and restarted, training finishes, no worker is left (none in `D` state) and no process "
             "of ours holds the GPU afterwards"),
    Scenario(2, "gpu_memory", "GPU memory free before the restarted workers allocate", 1,
             "a worker holding 60% of the GPU's memory is killed while a kernel runs (hang) and then crashes; "
             "each restarted worker finds that memory free before its first allocation (which takes 60% again "
             "and must succeed) and no dead worker in the GPU's process list"),
    Scenario(3, "warm_template", "warm template never initialises CUDA; warm restart trains on the GPU", 1,
             "on a GPU node the warm template reports CUDA not initialised and has no libcuda mapped; a worker "
             "script that touches CUDA at import works when forked from it, and the warm-started worker trains "
             "the same losses on the GPU as the first one"),
    Scenario(4, "straggler_cuda", "straggler detection with CUDA events flags a slowed GPU", 1,
             "`bench/straggler_cuda_check.py`: CUDA events measure the forward/backward and the half of the "
             "run slowed on the GPU scores below every report of the normal half"),
    Scenario(5, "examples_gpu", "examples and make demo on gpu (Lightning, NCCL) with a hang and a crash", 1,
             "`examples/lightning_heartbeats.py` on `accelerator=gpu` (one rank per GPU, NCCL) with a simulated "
             "hang and a simulated crash is restarted and finishes; `make demo` (2 ranks) where 2 GPUs exist"),
    Scenario(6, "jit_state_gpu", "just-in-time state: a survivor blocked in a hung all-reduce copies its state", 2,
             "rank 1 freezes, rank 0 is blocked in the NCCL all-reduce; before the stop rank 0 copies its "
             "state to host memory and the restarted ranks resume from it (or the check says why not)"),
)
BY_ID = {s.id: s for s in SCENARIOS}


@dataclass
class Result:
    """One scenario's outcome: ``result`` is one of :data:`RESULTS`; ``figures`` what it measured."""

    id: str
    result: str
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"result must be one of {', '.join(RESULTS)}, got {self.result!r}")
        if self.id not in BY_ID:
            raise ValueError(f"unknown scenario {self.id!r} (known: {', '.join(BY_ID)})")


def all_skipped(reason: str, ids: Iterable[str] | None = None) -> list[Result]:
    """Every scenario (or those of ``ids``) marked skipped with ``reason``."""
    chosen = list(ids) if ids is not None else [s.id for s in SCENARIOS]
    return [Result(i, "skipped", reason) for i in chosen]


def _figure(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_figures(figures: Mapping[str, Any]) -> str:
    """``name value; name value`` in the order measured; ``-`` when there are none."""
    if not figures:
        return "-"
    return "; ".join(f"{k} {_figure(v)}" for k, v in figures.items())


def table_lines(results: Sequence[Result]) -> list[str]:
    """The results as a Markdown table: number, scenario, result (with its reason), figures."""
    lines = ["| # | scenario | result | figures |", "|---|---|---|---|"]
    for r in results:
        s = BY_ID[r.id]
        outcome = r.result if not r.reason else f"{r.result}: {r.reason}"
        cells = [str(s.number), f"{s.id}: {s.title}", outcome, format_figures(r.figures)]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return lines


def summary_line(results: Sequence[Result]) -> str:
    """``gpu-check: 4 pass, 1 fail, 1 skipped`` (counts of each result, in :data:`RESULTS` order)."""
    counts = [f"{sum(r.result == kind for r in results)} {kind}" for kind in RESULTS
              if any(r.result == kind for r in results)]
    return "gpu-check: " + ", ".join(counts)


def exit_code(results: Sequence[Result]) -> int:
    """0 unless a scenario failed or broke (skipped scenarios do not fail the check)."""
    return 1 if any(r.result in ("fail", "error") for r in results) else 0


def to_json(results: Sequence[Result], machine: Mapping[str, Any], wall_s: float, date: str) -> dict[str, Any]:
    """The JSON document of a run."""
    return {"format": FORMAT, "date": date, "wall_s": round(wall_s, 1), "machine": dict(machine),
            "scenarios": [asdict(r) | {"number": BY_ID[r.id].number, "title": BY_ID[r.id].title}
                          for r in results]}


def write_json(path: str | os.PathLike, document: Mapping[str, Any]) -> None:
    """Write ``document`` to ``path`` atomically (its directory is created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(str(path), json.dumps(document, indent=1) + "\n")


def from_json(document: Mapping[str, Any]) -> list[Result]:
    """The results of a document written by :func:`to_json`.

    Raises:
        ValueError: Not a GPU check document of this format.
    """
    if document.get("format") != FORMAT or not isinstance(document.get("scenarios"), list):
        raise ValueError(f"not a gpu-check results document of format {FORMAT}")
    return [Result(s["id"], s["result"], s.get("reason", ""), dict(s.get("figures", {})),
                   float(s.get("seconds", 0.0))) for s in document["scenarios"]]


def doc_section(document: Mapping[str, Any] | None) -> list[str]:
    """The GPU check section of ``docs/benchmarks.md`` for the last recorded GPU run (or none yet)."""
    lines = [SECTION_TITLE, "",
             "Not run by `make bench`: it needs CUDA. `make gpu-check` (`bench/gpu_check.py`) runs the six "
             "GPU scenarios below on the GPUs of the machine it runs on, within 8 minutes on one GPU, and prints "
             "this table (JSON in `bench/results/gpu-check.json`). It needs no venv and no network: it picks the "
             "first Python whose torch sees CUDA (`GPU_CHECK_PYTHON=...` to choose), puts the repository on "
             "`PYTHONPATH` and runs `python -m launcher` as `ft_launcher`; `GPU_CHECK_ARGS='--only nccl_hang "
             "--keep'` runs one scenario and keeps its logs. Without CUDA it prints one line and exits 0, every "
             "scenario skipped; "
             "`make gpu-check GPU_CHECK_ARGS=--record` also writes it here (and its JSON to "
             "`gpu_check_last.json` beside the bench scripts). "
             "Where the machine has one GPU, a scenario that needs two ranks on NCCL runs only if NCCL accepts "
             "two ranks on one device (the check tries it first; NCCL refuses that: \"Duplicate GPU "
             "detected\"), else it is skipped with that reason. What each scenario proves:", ""]
    lines += [f"{s.number}. **{s.id}**: {s.proves}." for s in SCENARIOS]
    lines.append("")
    if document is None:
        return lines + ["No GPU run recorded yet: the table is owed by the first session with a GPU "
                        "(every scenario passing, or a follow-up named for each that does not).", ""]
    machine = document.get("machine", {})
    lines.append(f"Last run: {document.get('date', '?')}, {document.get('wall_s', '?')} s, "
                 f"{machine.get('gpu_summary', '?')}; torch {machine.get('torch', '?')}, "
                 f"NCCL {machine.get('nccl', '?')}.")
    lines.append("")
    return lines + table_lines(from_json(document)) + [""]


def replace_section(page: str, section: Sequence[str]) -> str:
    """``page`` with its GPU check section replaced by ``section`` (appended when it has none)."""
    lines = page.rstrip("\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line == SECTION_TITLE), None)
    if start is None:
        return "\n".join([*lines, "", *section]).rstrip("\n") + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join([*lines[:start], *section, *lines[end:]]).rstrip("\n") + "\n"
