"""Layering: how several sources of settings become one, the piece the profile loader and the
inventory share.

A host's profile is built from layers, lowest first (defaults, its groups, its own entry and file,
then `--set`); a later layer's value wins key by key, and the origin of every key (file:line, or the
`--set` that set it) comes along, so a problem is named where it was written.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ddtree_ops.config.source import Loc, Sourced, parse_override


def merge(base: Sourced, over: Sourced) -> Sourced:
    """`over` on top of `base`: mappings merge key by key, anything else is replaced."""
    def merge(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            merged = dict(a)
            for k, v in b.items():
                merged[k] = merge(a[k], v) if k in a else v
            return merged
        return b

    origin = dict(base.origin)
    origin.update(over.origin)
    return Sourced(merge(base.data, over.data), origin)


def apply_overrides(src: Sourced, overrides: Sequence[str]) -> Sourced:
    """`--set key.path=value` specs on top of `src`, each key's origin the spec that set it."""
    data = json.loads(json.dumps(src.data))  # deep copy of plain data
    origin = dict(src.origin)
    for spec in overrides:
        loc, value = parse_override(spec)
        cursor = data
        for part in loc[:-1]:
            nxt = cursor.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                cursor[part] = nxt
            cursor = nxt
        cursor[loc[-1]] = value
        for i in range(1, len(loc) + 1):
            origin.setdefault(loc[:i], f"--set {spec}")
        origin[loc] = f"--set {spec}"
    return Sourced(data, origin)


def leaves(data: Any, loc: Loc = ()) -> list[tuple[Loc, Any]]:
    """Every (key path, value) of nested mappings, depth first."""
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in leaves(v, loc + (str(k),))]
    return [(loc, data)]


def differences(resolved: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(what every host shares, flattened; per host, the keys where hosts differ). The host's own
    name (and an ssh_host equal to it) differ by nature and are left out."""
    flat = {h: dict(leaves(doc)) for h, doc in resolved.items()}
    keys = dict.fromkeys(k for f in flat.values() for k in f)
    shared: dict[str, Any] = {}
    differ: dict[str, dict[str, Any]] = {h: {} for h in flat}
    missing = object()
    for key in keys:
        if key == ("name",):
            continue
        values = {h: f.get(key, missing) for h, f in flat.items()}
        if key == ("host", "ssh_host") and all(v == h for h, v in values.items()):
            continue
        distinct = {repr(v) for v in values.values()}
        if len(distinct) == 1:
            shared[".".join(key)] = next(iter(values.values()))
            continue
        for h, v in values.items():
            differ[h][".".join(key)] = None if v is missing else v
    return shared, differ
