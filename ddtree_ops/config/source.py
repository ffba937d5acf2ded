"""YAML text to plain data, with the file:line every key came from (`Sourced`).

Only plain values get through (strings, numbers, booleans, null, mappings, lists): any other tag is a
problem named with its line and key, never constructed. `--set key.path=value` is read here too, by
the same rules. Layering several `Sourced` into one is `layers.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ddtree_ops.errors import ProfileError

Loc = tuple[str, ...]


@dataclass
class Sourced:
    """Raw profile data plus where each key came from (file:line or the --set that set it)."""

    data: dict[str, Any] = field(default_factory=dict)
    origin: dict[Loc, str] = field(default_factory=dict)


# libyaml when PyYAML has it: composing a profile is ~15x faster (the profile fuzz loads 10k of them);
# the nodes carry the same line marks, and construction stays PyYAML's safe constructor
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# a profile is ~150 values a few levels deep; these bounds stop alias bombs and runaway nesting
MAX_VALUES = 10_000
MAX_DEPTH = 24
_PLAIN = (str, int, float, bool, type(None))
_SCALAR_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "timestamp")}
_COLLECTION_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


def _tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _short(text: str, width: int = 40) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def _yaml_problem(exc: yaml.YAMLError, text: str, filename: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    # libyaml marks an error at the end of a file without a final newline one line past it
    where = f"{filename}:{min(mark.line + 1, text.count(chr(10)) + 1)}" if mark else filename
    if isinstance(exc, yaml.reader.ReaderError):
        # libyaml counts the position in UTF-8 bytes, PyYAML in characters
        before = text.encode("utf-8")[: exc.position] if _YAML_LOADER is not yaml.SafeLoader else text[: exc.position]
        line = before.count(b"\n" if isinstance(before, bytes) else "\n") + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        return f"{filename}:{line} YAML syntax error: {exc.reason} (character {char:#x})"
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where} YAML syntax error: {problem}"


def compose(text: str, filename: str) -> Sourced:
    try:
        node = yaml.compose(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise ProfileError([_yaml_problem(exc, text, filename)]) from None
    out = Sourced()
    if node is None:
        return out
    if not isinstance(node, yaml.MappingNode):
        raise ProfileError([f"{filename}:{node.start_mark.line + 1} top level must be a mapping"])
    problems: list[str] = []
    out.data = _Walk(lambda n: f"{filename}:{n.start_mark.line + 1}", out.origin, problems).value(node, ())
    if problems:
        raise ProfileError(problems)
    return out


class _Walk:
    """Plain data from composed YAML nodes, recording where each key came from. Only plain values
    (strings, numbers, booleans, null, mappings, lists) get through: any other tag is a problem
    named with its line and key, never constructed, so no YAML tag can run code or build objects."""

    def __init__(self, where: Callable[[yaml.Node], str], origin: dict[Loc, str], problems: list[str]) -> None:
        self.where, self.origin, self.problems = where, origin, problems
        self.count = 0
        self.open: set[int] = set()  # collections being walked: an alias to one of them is a cycle
        self.constructor = yaml.constructor.SafeConstructor()

    def value(self, node: yaml.Node, loc: Loc) -> Any:
        self.count += 1
        where = self.origin[loc] = self.where(node)
        if self.count > MAX_VALUES:
            raise ProfileError([f"{where} {_path(loc)}: the profile expands to more than {MAX_VALUES} values "
                                "(YAML aliases referring to each other?)"])
        if len(loc) > MAX_DEPTH:
            raise ProfileError([f"{where} {_path(loc)}: nested deeper than {MAX_DEPTH} levels"])
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, where, loc)
        if node.tag != _COLLECTION_TAGS[type(node)]:
            self.problems.append(f"{where} {_path(loc)}: the YAML tag {_tag(node.tag)} is not allowed "
                                 "(a profile holds plain values, mappings and lists)")
            return None
        if id(node) in self.open:
            raise ProfileError([f"{where} {_path(loc)}: a YAML alias refers to a mapping or list that contains it"])
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, loc)
            return [self.value(v, loc + (str(i),)) for i, v in enumerate(node.value)]
        finally:
            self.open.discard(id(node))

    def mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(f"{self.where(key_node)} {_path(loc)}: keys must be plain words")
                continue
            key = str(key_node.value)
            if key in result:
                self.problems.append(f"{self.where(key_node)} {_path(loc + (key,))}: duplicate key")
                continue
            result[key] = self.value(value_node, loc + (key,))
            self.origin[loc + (key,)] = self.where(key_node)
        return result

    def scalar(self, node: yaml.ScalarNode, where: str, loc: Loc) -> Any:
        build = self.constructor.yaml_constructors.get(node.tag) if node.tag in _SCALAR_TAGS else None
        if build is None:  # python/*, !!binary, !custom and any other tag
            self.problems.append(f"{where} {_path(loc)}: the YAML tag {_tag(node.tag)} is not allowed "
                                 "(a profile holds plain values)")
            return None
        try:
            value = build(self.constructor, node)
        except Exception as exc:  # noqa: BLE001 - PyYAML's scalar constructors raise what int()/float() raise
            self.problems.append(f"{where} {_path(loc)}: cannot read {_short(str(node.value))} as {_tag(node.tag)} "
                                 f"({str(exc)[:80]})")
            return None
        if isinstance(value, _PLAIN):
            return value
        kind = "date" if node.tag == "tag:yaml.org,2002:timestamp" else _tag(node.tag)
        self.problems.append(f"{where} {_path(loc)}: {_short(str(node.value))} reads as a YAML {kind}; "
                             "quote it to make it a string")
        return None


def _path(loc: Loc) -> str:
    return ".".join(loc) or "(top level)"


def parse_override(spec: str) -> tuple[Loc, Any]:
    """`memory.mem_fraction_static=0.9` -> (("memory", "mem_fraction_static"), 0.9). The value is a
    YAML scalar, mapping or list, held to the same rules as a profile file; text that is not YAML
    at all is taken as a string."""
    try:
        spec.encode("utf-8")
    except UnicodeEncodeError:
        raise ProfileError([f"--set {ascii(spec)}: not valid UTF-8"]) from None
    if "=" not in spec:
        raise ProfileError([f"--set {spec}: expected key.path=value"])
    key, _, raw = spec.partition("=")
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", key):
        raise ProfileError([f"--set {spec}: {key!r} is not a dotted key path"])
    loc = tuple(key.split("."))
    if not raw.strip():
        return loc, ""
    try:
        node = yaml.compose(raw, Loader=_YAML_LOADER)
    except yaml.YAMLError:
        return loc, raw
    if node is None:
        return loc, None
    problems: list[str] = []
    value = _Walk(lambda _n: f"--set {spec}", {}, problems).value(node, loc)
    if problems:
        raise ProfileError(problems)
    return loc, value


def read_file(path: Path, shown: str) -> Sourced:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError([f"{shown}: cannot read ({exc.strerror})"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ProfileError([f"{shown}:{line} not valid UTF-8 (byte {raw[exc.start]:#04x})"]) from None
    return compose(text, shown)


def display_path(path: Path) -> str:
    """A path as messages name it: relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
