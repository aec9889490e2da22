"""The event log's schema at its documented path (``launcher.records.read_events``, docs/launcher.md).

The code is :mod:`launcher.events.records`; every name of it can be read from here.
"""

from typing import Any

from launcher.events import records as _records
from launcher.events.records import SCHEMA_VERSION, EventRecord, read_events, schema_table

__all__ = ["SCHEMA_VERSION", "EventRecord", "read_events", "schema_table"]


def __getattr__(name: str) -> Any:
    # The record classes (CycleStart, Failure, ...) without listing all of them twice.
    return getattr(_records, name)
