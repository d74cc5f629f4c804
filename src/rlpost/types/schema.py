"""The one check every file rlpost reads back goes through: a schema, and one line naming the file
and the field that does not fit it.

What rlpost wrote once and reads again (a checkpoint's manifest and state, metrics.jsonl, a
pipeline stage's summary.json, data rows) may have been edited, truncated or swapped for another
run's since. Each reader declares what it needs as a schema and calls ``check``; a value that does
not fit is a ``DataError`` saying ``FILE: FIELD: expected WHAT, got VALUE`` instead of a KeyError or
TypeError from deep inside the code that would have used it.

A schema is
  a type or a tuple of types    isinstance (a bool is neither an int nor a float here)
  a dict {key: schema}          a mapping holding those keys; 'key?' marks one that may be absent
  ListOf(schema), MapOf(schema) a list, or a mapping of string keys, whose every item fits
  Where(test, 'what it is')     any other rule, said in words
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rlpost.types.errors import DataError, clip


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    item: Any


@dataclass(frozen=True)
class Where:
    test: Callable[[Any], bool]
    what: str


NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping",
         list: "a list", type(None): "null"}


def describe(schema) -> str:
    if isinstance(schema, tuple):
        return " or ".join(describe(s) for s in schema)
    if isinstance(schema, type):
        return NAMES.get(schema, f"a {schema.__name__}")
    if isinstance(schema, dict):
        return "a mapping"
    if isinstance(schema, ListOf):
        return "a list"
    if isinstance(schema, MapOf):
        return "a mapping"
    return schema.what


def _is(value, typ: type) -> bool:
    if typ in (int, float) and isinstance(value, bool):
        return False
    if typ is float:
        return isinstance(value, (int, float))
    return isinstance(value, typ)


def fits(value, schema) -> str | None:
    """None when ``value`` fits ``schema``; else 'FIELD: expected WHAT, got VALUE' (FIELD dotted, may be empty)."""
    if isinstance(schema, tuple) and all(isinstance(s, type) for s in schema):
        ok = any(_is(value, s) for s in schema)
    elif isinstance(schema, type):
        ok = _is(value, schema)
    elif isinstance(schema, Where):
        ok = bool(_safe(schema.test, value))
    elif isinstance(schema, ListOf):
        if not isinstance(value, list):
            ok = False
        else:
            return next((_join(f"[{i}]", p) for i, v in enumerate(value) if (p := fits(v, schema.item))), None)
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            ok = False
        else:
            return next((_join(str(k), p) for k, v in value.items()
                         if (p := "key: expected a string" if not isinstance(k, str) else fits(v, schema.item))), None)
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            ok = False
        else:
            for key, sub in schema.items():
                name, optional = key.rstrip("?"), key.endswith("?")
                if name not in value:
                    if optional:
                        continue
                    return f"{name}: missing"
                problem = fits(value[name], sub)
                if problem:
                    return _join(name, problem)
            return None
    else:  # pragma: no cover - a schema written wrong is a bug, not bad input
        raise TypeError(f"not a schema: {schema!r}")
    return None if ok else f": expected {describe(schema)}, got {_shown(value)}"


def check(value, schema, source: str) -> Any:
    """``value`` if it fits ``schema``; else DataError('SOURCE: FIELD: expected ..., got ...')."""
    problem = fits(value, schema)
    if problem:
        raise DataError(f"{source}{'' if problem.startswith((':', '[')) else ': '}{problem}")
    return value


def _join(name: str, problem: str) -> str:
    sep = "" if problem.startswith((":", "[")) else "."
    return f"{name}{sep}{problem}"


def _safe(test, value) -> bool:
    try:
        return test(value)
    except Exception:  # noqa: BLE001 - a test that cannot even look at the value: it does not fit
        return False


def _shown(value) -> str:
    if isinstance(value, (dict, list)) and len(repr(value)) > 60:
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, (str, int, float, bool, type(None), dict, list)):
        return clip(repr(value), 60)
    return f"a {type(value).__name__}"
