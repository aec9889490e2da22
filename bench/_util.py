"""Shared helpers for the benchmark scripts."""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    """Median, min, max and count of a sample."""
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "n": len(ordered),
    }


def proc_memory_kb(pid: int) -> dict[str, int]:
    """RSS, PSS and USS (private clean + dirty) of a process, in kB, from smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as stream:
        for line in stream:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {
        "rss_kb": fields.get("Rss", 0),
        "pss_kb": fields.get("Pss", 0),
        "uss_kb": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds consumed by a process so far."""
    with open(f"/proc/{pid}/stat") as stream:
        fields = stream.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def emit(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        json.dump(result, sys.stdout, indent=2)
        print()
