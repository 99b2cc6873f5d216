"""What the API server does with a CRD schema besides type checks, redone here: defaulting and the
CEL rules.

On a real cluster the API server has already applied both. The operator redoes them because an
object can still reach it undefaulted or unchecked (a CRD from an older chart, a cluster without CEL
validation, a test emulator), and a spec the rules refuse must surface as a Degraded condition
rather than as a half-made deployment.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import celpy

Schema = dict[str, Any]


def apply_defaults(schema: Schema, value: Any) -> Any:
    """A defaulted deep copy of `value`, as structural-schema defaulting does it (defaults inside
    defaults too)."""
    value = copy.deepcopy(value)
    _default_in_place(schema, value)
    return value


def _default_in_place(schema: Schema, value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default_in_place(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in set(value) - set(schema.get("properties", {})):
                _default_in_place(extra, value[key])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default_in_place(schema["items"], item)


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _rule_holds(expression: str, value: Any) -> bool:
    try:
        result = _program(expression).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError:
        return False
    return not isinstance(result, celpy.CELEvalError) and bool(result)


def rule_violations(schema: Schema, value: Any, path: str = "") -> list[str]:
    """'path: message' for every x-kubernetes-validations rule and list-map key uniqueness that
    `value` breaks."""
    problems = [
        f"{path or '.'}: {rule['message']}" for rule in schema.get("x-kubernetes-validations", [])
        if not _rule_holds(rule["rule"], value)
    ]
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                problems += rule_violations(sub, value[name], f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in sorted(set(value) - set(schema.get("properties", {}))):
                problems += rule_violations(extra, value[key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        problems += _duplicate_keys(schema, value, path)
        for i, item in enumerate(value):
            problems += rule_violations(schema["items"], item, f"{path}[{i}]")
    return problems


def _duplicate_keys(schema: Schema, value: list[Any], path: str) -> list[str]:
    if schema.get("x-kubernetes-list-type") != "map":
        return []
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: set[tuple[Any, ...]] = set()
    problems = []
    for item in value:
        key = tuple(item.get(k) for k in keys) if isinstance(item, dict) else (item,)
        if key in seen:
            problems.append(
                f"{path}: duplicate entries for {', '.join(keys)} = {', '.join(map(str, key))}")
        seen.add(key)
    return problems
