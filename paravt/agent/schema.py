"""Check a tool call's arguments against the tool's JSON schema (the subset tools use).

Required arguments, unknown arguments, `type` (string, number, integer, boolean, array,
object), `enum`, `minimum` and `maximum`: what a model gets wrong in a call. The result is a
short text naming the argument, for the model; nothing here raises on a bad call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


def check_arguments(parameters: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """None when `args` fit the JSON schema `parameters` (required, types, enums, numeric
    bounds, no unknown argument), else a short text naming the argument."""
    props = parameters.get("properties", {})
    for key in parameters.get("required", ()):
        if key not in args:
            return f"missing required argument {key!r}"
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            return f"unknown argument {key!r}; arguments: {', '.join(props) or 'none'}"
        problem = _check_value(spec, value)
        if problem is not None:
            return f"argument {key!r} {problem}"
    return None


def _check_value(spec: Mapping[str, Any], value: Any) -> str | None:
    kind = spec.get("type")
    allowed = _TYPES.get(kind) if isinstance(kind, str) else None
    wrong_bool = isinstance(value, bool) and kind in ("number", "integer")
    if allowed is not None and (wrong_bool or not isinstance(value, allowed)):
        return f"must be a {kind}, got {_short(value)}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {', '.join(map(str, spec['enum']))}, got {_short(value)}"
    if kind in ("number", "integer") and "minimum" in spec and value < spec["minimum"]:
        return f"must be >= {spec['minimum']}, got {value}"
    if kind in ("number", "integer") and "maximum" in spec and value > spec["maximum"]:
        return f"must be <= {spec['maximum']}, got {value}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
