"""``ft_report --plot``: the timeline of :mod:`launcher.events.report` drawn with matplotlib.

One row per node: each cycle as a bar (yellow while its workers start, green while they are all
up), hatched red where the work was redone after a failure (the seconds before it since the step
the restart resumed from: :mod:`launcher.events.failure_cost`), each failure as a marker (a red
cross for a root cause, an orange dot for a worker stopped as a consequence), each straggler report
as a purple triangle under the bar, dashed lines where autoresume attempts start.

The drawing scales with the log, not with what a picture can show: a long run has more cycles
and failures than the chart has pixels, and one matplotlib artist per item (a bar, a marker, a
label each) made a 100 000-record log take minutes and gigabytes. So the bars of one row and
colour that start within one pixel column of the chart become one bar as
wide as their total (the colours keep their share of the time, so a long run of short restarts
reads as mostly green with a yellow tint), each colour drawn as one collection; markers are kept
one per marker width (:data:`MARKER_COLUMNS`), again one collection per kind; and the per-item
labels (cycle numbers, failure kinds, outcomes, attempt numbers) are written only while there are
few enough of them to read (:data:`MAX_LABELS`). The title keeps the counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launcher.events.records import ROLE_ROOT, Straggler
from launcher.events.runs import ReportError, RunReport, failed_at, failure_kind, role, seconds_text, timeline_origin

MAX_LABELS = 60
"""Most text labels of one kind on a chart; with more, none of that kind is written."""
MARKER_COLUMNS = 150
"""Most failure markers of one kind in a row: about one per marker width."""
_STARTING, _UP, _ROOT, _COLLATERAL, _STRAGGLER = "#f2c14e", "#4caf50", "#d32f2f", "#ff9800", "#7b1fa2"
_REDONE = "#b71c1c"


def aggregate_spans(spans: Iterable[tuple[float, float]], resolution: float) -> list[tuple[float, float]]:
    """``(start, width)`` spans reduced to at most one bar per ``resolution``-wide column.

    Each column's bar starts where the first span in it does (or at the column's edge for a
    span that began before it) and is as wide as the time the spans cover in that column; bars
    that touch are joined, so a few long spans come back unchanged.

    Returns:
        Bars as ``broken_barh`` takes them, sorted, with the same total width as the input
        (where the spans do not overlap).
    """
    columns: dict[int, list[float]] = {}  # column -> [first start in it, time covered]
    for start, width in spans:
        end = start + max(0.0, width)
        column = math.floor(start / resolution)
        while column * resolution < end or column == math.floor(start / resolution):
            left, right = column * resolution, (column + 1) * resolution
            covered = max(0.0, min(end, right) - max(start, left))
            cell = columns.setdefault(column, [max(start, left), 0.0])
            cell[0], cell[1] = min(cell[0], max(start, left)), cell[1] + covered
            column += 1
    bars: list[list[float]] = []
    for column in sorted(columns):
        x, width = columns[column]
        if bars and x <= bars[-1][0] + bars[-1][1] + resolution * 1e-6:
            bars[-1][1] = max(bars[-1][1], x + width - bars[-1][0])
        else:
            bars.append([x, width])
    return [(x, width) for x, width in bars]


def thin_points(points: Iterable[tuple[float, float]], resolution: float) -> tuple[list[float], list[float]]:
    """The x and y lists of ``points``, the first of each ``resolution``-wide column and row."""
    seen: dict[tuple[int, float], tuple[float, float]] = {}
    for x, y in points:
        seen.setdefault((int(x // resolution) if resolution > 0 else 0, y), (x, y))
    return [x for x, _ in seen.values()], [y for _, y in seen.values()]


def draw(report: RunReport, values: dict[str, Any], path: str | Path) -> None:
    """Draw the timeline to ``path`` (PNG, SVG or PDF by its suffix).

    Raises:
        ReportError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install 'ptl-resiliency[plot]'") from None
    origin = timeline_origin(report)
    nodes = sorted({r.node for r in report.runs})
    rows = {node: index for index, node in enumerate(nodes)}
    end = max([r.ended for r in report.runs] + [a.end or a.start or origin for a in report.attempts]) - origin
    fig, ax = plt.subplots(figsize=(12, 2.2 + 0.9 * len(nodes)), dpi=110)
    # seconds per pixel column of the axes (set_xlim below shows 1.1 x end)
    resolution = 1.1 * max(end, 1.0) / max(1.0, ax.get_window_extent().width)

    starts = [a for a in report.attempts if a.start is not None]
    if starts:
        ax.vlines([a.start - origin for a in starts], -0.8, len(nodes) - 0.2, colors="0.55", linestyles="--",
                  linewidth=1)
    if len(starts) <= MAX_LABELS:
        for attempt in starts:
            ax.text(attempt.start - origin, len(nodes) - 0.45, f" attempt {attempt.number}", fontsize=9,
                    color="0.3", va="bottom")

    cycles = [(run, cycle) for run in report.runs for cycle in run.cycles]
    failures = [(rows[run.node], failure) for run, cycle in cycles for failure in cycle.failures]
    roots = [(y, f) for y, f in failures if role(f) == ROLE_ROOT]
    starting: dict[int, list[tuple[float, float]]] = {}
    up: dict[int, list[tuple[float, float]]] = {}
    for run, cycle in cycles:
        y = rows[run.node]
        cycle_end = (cycle.ended if cycle.ended is not None else run.ended) - origin
        ready = (cycle.ready - origin) if cycle.ready is not None else cycle_end
        began = cycle.started - origin
        starting.setdefault(y, []).append((began, ready - began))
        up.setdefault(y, []).append((ready, cycle_end - ready))
        if len(cycles) <= MAX_LABELS:
            ax.text(began, y + 0.3, f"cycle {cycle.index}", fontsize=8, va="bottom")
    for y in rows.values():
        ax.broken_barh(aggregate_spans(up.get(y, ()), resolution), (y - 0.25, 0.5), facecolors=_UP, snap=False)
        ax.broken_barh(aggregate_spans(starting.get(y, ()), resolution), (y - 0.25, 0.5), facecolors=_STARTING,
                       snap=False)

    # the work each failure threw away (launcher.events.failure_cost): hatched over the bar, up to the failure
    redone: dict[int, list[tuple[float, float]]] = {}
    for cost in values.get("failure_costs", []):
        if cost.get("seconds_redone"):
            for node in dict.fromkeys(cost["nodes"]):
                until = cost.get("failed_step_at") or cost["failed_at"]  # a hang: its last progress, not detection
                seconds = cost["seconds_redone"]
                redone.setdefault(rows[node], []).append((until - seconds - origin, seconds))
    for y, spans in redone.items():
        ax.broken_barh(aggregate_spans(spans, resolution), (y - 0.25, 0.5), facecolors="none", edgecolors=_REDONE,
                       hatch="////", linewidth=0.8, snap=False, zorder=2)

    # collateral first, so that the root causes are drawn on top
    spacing = max(end, 1.0) / MARKER_COLUMNS
    xs, ys = thin_points(((failed_at(f) - origin, y + 0.14) for y, f in failures if role(f) != ROLE_ROOT),
                         spacing)
    ax.scatter(xs, ys, marker="o", s=36, c=_COLLATERAL, edgecolors="black", zorder=3)
    xs, ys = thin_points(((failed_at(f) - origin, y) for y, f in roots), spacing)
    ax.scatter(xs, ys, marker="X", s=121, c=_ROOT, edgecolors="black", zorder=4)
    if len(roots) <= MAX_LABELS:
        for y, failure in roots:
            ax.text(failed_at(failure) - origin, y - 0.3, failure_kind(failure), fontsize=8, ha="center", va="top",
                    color="#b71c1c", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1})
    stragglers = [(rows[run.node], record) for run in report.runs for record in run.events
                  if isinstance(record, Straggler)]
    xs, ys = thin_points(((record.ts - origin, y - 0.38) for y, record in stragglers if record.ts is not None),
                         spacing)
    ax.scatter(xs, ys, marker="^", s=49, c=_STRAGGLER, edgecolors="black", zorder=4)
    ended = [run for run in report.runs if run.result is not None]
    if len(ended) <= MAX_LABELS:
        for run in ended:
            ax.text(run.ended - origin, rows[run.node], f"  {run.result.outcome}", fontsize=8, va="center")

    ax.set_yticks(range(len(nodes)), [f"node {n}" for n in nodes])
    ax.set_ylim(-0.8, len(nodes) - 0.2)
    ax.set_xlim(-0.02 * max(end, 1.0), end * 1.08 + 0.5)
    ax.set_xlabel("seconds since the run started")
    goodput = "-" if values["goodput"] is None else f"{values['goodput']:.2f}"
    ax.set_title(f"{values['failures']} failure(s), {values['cycles']} cycle(s); goodput <= {goodput}, "
                 f"mean time to recover {seconds_text(values['mttr_s'])}")
    ax.legend(handles=[Patch(color=_STARTING, label="workers starting"), Patch(color=_UP, label="workers up"),
                       Patch(facecolor="none", edgecolor=_REDONE, hatch="////", label="work redone after the failure"),
                       Line2D([], [], marker="X", color=_ROOT, markeredgecolor="black", linestyle="none",
                              markersize=10, label="failure (root cause)"),
                       Line2D([], [], marker="o", color=_COLLATERAL, markeredgecolor="black", linestyle="none",
                              label="stopped as a consequence"),
                       Line2D([], [], marker="^", color=_STRAGGLER, markeredgecolor="black", linestyle="none",
                              label="straggler flagged")],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize=9, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
