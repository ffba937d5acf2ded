"""Raw settings (`Sourced`) to a validated `Profile`, or every problem at once with its file and line.

pydantic checks the fields (strict types, unknown keys forbidden, bounds); its error locations are
mapped back to the YAML line they came from, so a typo reads
`profiles/ct129.yaml:14 memory.mem_fraction_static: 1.4 is not in (0, 1)`. Then the rules that span
fields (`rules.py`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from ddtree_ops.config.model import ABS_PATH, ENV_NAME, Profile
from ddtree_ops.config.rules import check_rules
from ddtree_ops.config.source import Loc, Sourced
from ddtree_ops.errors import ProfileError

def validate(src: Sourced, *, fallback: str) -> Profile:
    try:
        profile = Profile.model_validate(src.data)
    except ValidationError as exc:
        raise ProfileError([_format_error(e, src, fallback) for e in exc.errors()]) from None
    problems = [f"{_where(loc, src, fallback)} {'.'.join(loc)}: {msg}" for loc, msg in check_rules(profile)]
    if problems:
        raise ProfileError(problems)
    return profile


def _where(loc: Loc, src: Sourced, fallback: str) -> str:
    for i in range(len(loc), -1, -1):
        if loc[:i] in src.origin:
            return src.origin[loc[:i]]
    return fallback


def _format_error(e: Any, src: Sourced, fallback: str) -> str:
    loc: Loc = tuple(str(p) for p in e["loc"])
    # pydantic reports union members as extra loc parts ("int", "constrained-int"); drop them
    loc = tuple(p for p in loc if not re.fullmatch(r"(constrained-)?(int|float|str|bool|none|function-.*)", p))
    path = ".".join(loc)
    where = _where(loc, src, fallback)
    kind = e["type"]
    value = e.get("input")
    ctx = e.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _fields_at(loc[:-1])
        close = difflib.get_close_matches(loc[-1], parent, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else (f" (known: {', '.join(parent)})" if parent else "")
        return f"{where} {path}: unknown key{hint}"
    if kind == "missing":
        return f"{where} {path}: required but missing"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        return f"{where} {path}: {value!r} is not in {_interval(loc) or _bound(kind, ctx)}"
    if kind == "literal_error":
        return f"{where} {path}: {value!r} is not one of {ctx.get('expected')}"
    if kind == "string_pattern_mismatch":
        return f"{where} {path}: {value!r} does not match {_pattern_hint(ctx.get('pattern', ''))}"
    if kind in ("model_type", "model_attributes_type") and len(loc) == 2 and loc[0] == "gpus":
        return f"{where} {path}: expected a card index (0, 1, ...) or a mapping {{index: N, ...}}, got {value!r}"
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "model_type":
        want = kind.removesuffix("_type").removesuffix("_parsing").replace("model", "mapping").replace("dict", "mapping")
        return f"{where} {path}: expected {want}, got {type(value).__name__} {value!r}"
    return f"{where} {path}: {e['msg']}"


def _pattern_hint(pattern: str) -> str:
    return {
        ABS_PATH: "an absolute path",
        ENV_NAME: "an environment variable name",
    }.get(pattern, f"the pattern {pattern}")


def _bound(kind: str, ctx: dict[str, Any]) -> str:
    sym = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
    return f"the range {sym} {next(iter(ctx.values()))}"


def _field_info(loc: Loc) -> Any:
    model: Any = Profile
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if fields is None:
            return None
        info = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if info is None:
            return None
        model = _model_of(info.annotation)
    return info


def _model_of(annotation: Any) -> Any:
    args = getattr(annotation, "__args__", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in args or ():
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _fields_at(loc: Loc) -> list[str]:
    model: Any = Profile if not loc else _model_of(getattr(_field_info(loc), "annotation", None))
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _interval(loc: Loc) -> str | None:
    info = _field_info(loc)
    if info is None:
        return None
    metas = list(info.metadata)
    for a in getattr(info.annotation, "__args__", ()) or ():
        metas += list(getattr(a, "__metadata__", ()))
        for m in getattr(a, "__metadata__", ()):
            metas += list(getattr(m, "metadata", ()))
    lo = hi = None
    lo_open = hi_open = False
    for m in metas:
        for name in ("gt", "ge", "lt", "le"):
            v = getattr(m, name, None)
            if v is None:
                continue
            if name in ("gt", "ge"):
                lo, lo_open = v, name == "gt"
            else:
                hi, hi_open = v, name == "lt"
    if lo is None and hi is None:
        return None
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
