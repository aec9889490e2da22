"""One codec for the typed dataclasses that cross a process boundary as JSON objects.

The monitor's messages (:mod:`ft_core.wire.messages`) and the launcher's event records
(:mod:`launcher.events.records`) are dataclasses written and read by the same class: :func:`to_fields`
turns one into a JSON-safe dict (nested typed values as dicts, or merged into the parent when
their field says ``flatten``), :func:`from_fields` builds one from a dict that an older or newer
writer may have produced: a missing field or a value of the wrong type takes the field's default,
unknown keys are ignored, and only a missing or wrong *required* field makes the input
malformed (:class:`MalformedError`).

Standard library only: the rank monitor uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

FLATTEN = "flatten"
"""Field metadata key: the nested dataclass's fields are written into the parent's dict."""
OMIT_NONE = "omit_none"
"""Field metadata key: the field is left out of the dict while it is None (as older writers did)."""
WRITTEN_WITH = "written_with"
"""Field metadata key: while None, the field is written only if the field it names is not None
(details that come as a group, e.g. a hang's, are written together, a null one included)."""
DOC = "doc"
"""Field metadata key: a note on the field, for generated documentation."""


class MalformedError(ValueError):
    """A dict lacks a required field of the class, or holds a value of the wrong type in one."""


def meta(doc: str = "", *, omit_none: bool = False, flatten: bool = False,
         written_with: str | None = None) -> dict[str, Any]:
    """Field metadata: ``field(default=None, metadata=meta("when known", omit_none=True))``."""
    return {DOC: doc, OMIT_NONE: omit_none, FLATTEN: flatten, WRITTEN_WITH: written_with}


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass's init fields (cached)."""
    resolved = typing.get_type_hints(cls)
    return {f.name: resolved[f.name] for f in dataclasses.fields(cls) if f.init}


def to_fields(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a JSON-safe dict, in declaration order (see the module docstring)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        if not f.init:
            continue
        item = getattr(value, f.name)
        if f.metadata.get(FLATTEN):
            if item is not None:
                out.update(to_fields(item))
            continue
        if item is None and f.metadata.get(OMIT_NONE):
            continue
        group = f.metadata.get(WRITTEN_WITH)
        if item is None and group is not None and getattr(value, group) is None:
            continue
        out[f.name] = _plain(item)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_fields(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def from_fields(cls: type[T], data: Mapping[str, Any]) -> T:
    """An instance of the dataclass ``cls`` from ``data`` (see the module docstring).

    Raises:
        MalformedError: A required field is missing or has the wrong type.
    """
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints(cls)[f.name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.metadata.get(FLATTEN):
            nested = _dataclass_of(hint)
            names = {g.name for g in dataclasses.fields(nested)}
            if any(name in data for name in names):
                try:
                    kwargs[f.name] = from_fields(nested, data)
                except MalformedError:
                    if required:
                        raise
            elif required:
                raise MalformedError(f"{cls.__name__}: no {f.name}")
            continue
        if f.name not in data:
            if required:
                raise MalformedError(f"{cls.__name__}: missing field {f.name!r}")
            continue
        ok, value = _convert(data[f.name], hint)
        if ok:
            kwargs[f.name] = value
        elif required:
            raise MalformedError(f"{cls.__name__}: field {f.name!r} has the wrong type: {data[f.name]!r:.80}")
    return cls(**kwargs)


def _dataclass_of(hint: Any) -> type:
    for option in _options(hint):
        if dataclasses.is_dataclass(option):
            return option
    raise TypeError(f"not a dataclass field: {hint!r}")


@functools.cache  # hints are few and hashable; readers call this per field per record
def _options(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _convert(value: Any, hint: Any) -> tuple[bool, Any]:
    """(True, the value as ``hint`` wants it) or (False, None) if it is not of that type."""
    for option in _options(hint):
        ok, converted = _convert_one(value, option)
        if ok:
            return True, converted
    return False, None


def _convert_one(value: Any, hint: Any) -> tuple[bool, Any]:
    if hint is Any:
        return True, value
    if hint is type(None):
        return value is None, None
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return True, float(value)
        return False, None
    if hint is str:
        return isinstance(value, str), value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            return False, None
        try:
            return True, from_fields(hint, value)
        except MalformedError:
            return False, None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, None
        item = args[0] if args else Any
        items = [_convert(v, item) for v in value]
        if not all(ok for ok, _ in items):
            return False, None
        converted = [v for _, v in items]
        return True, tuple(converted) if origin is tuple else converted
    if origin is dict:
        if not isinstance(value, Mapping):
            return False, None
        item = args[1] if len(args) == 2 else Any
        items = {str(k): _convert(v, item) for k, v in value.items()}
        if not all(ok for ok, _ in items.values()):
            return False, None
        return True, {k: v for k, (_, v) in items.items()}
    raise TypeError(f"unsupported field type {hint!r}")
