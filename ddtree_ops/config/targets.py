"""Groups and targets: which hosts a name means.

A target is a host, a group (its members and its children's, each once, in order), a glob
(`ct13*`), a range (`ct13[0:5]`) or `!host` to leave one out. A host's groups come parents before
children, which is the order their settings layer in (`inventory.py`). Pure functions over the
groups and the host list, so resolution reads alone and is tested as data.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ddtree_ops.config.hostnames import expand
from ddtree_ops.config.source import Sourced
from ddtree_ops.errors import ProfileError, UsageError, did_you_mean


@dataclass
class Group:
    name: str
    hosts: list[str] = field(default_factory=list)  # direct members, in order
    children: list[str] = field(default_factory=list)
    settings: list[Sourced] = field(default_factory=list)  # group file, then inventory vars
    files: list[str] = field(default_factory=list)  # where the group is defined
    where: str = ""


Groups = Mapping[str, Group]


def is_group(groups: Groups, name: str) -> bool:
    return name in groups or name == "all"


def members(groups: Groups, group: str, every: Sequence[str]) -> list[str]:
    """A group's hosts, its own first, then each child's, in order, each once (`all`: every host)."""
    if group == "all":
        return list(every)
    out: dict[str, None] = {}
    seen: set[str] = set()

    def walk(name: str) -> None:
        if name in seen or name not in groups:
            return
        seen.add(name)
        out.update(dict.fromkeys(groups[name].hosts))
        for child in groups[name].children:
            walk(child)

    walk(group)
    return list(out)


def depths(groups: Groups) -> dict[str, int]:
    """How deep each group sits below `all` (1: a top group); a group that is its own ancestor is refused."""
    parents: dict[str, list[str]] = {}
    for g in groups.values():
        for c in g.children:
            parents.setdefault(c, []).append(g.name)
    memo: dict[str, int] = {}

    def depth(name: str, trail: tuple[str, ...] = ()) -> int:
        if name in memo:
            return memo[name]
        if name == "all":  # Ansible's root: everything else is below it
            return 0
        if name in trail:
            raise ProfileError([f"{groups[name].where} group {name!r} is its own ancestor: "
                                f"{' -> '.join((*trail, name))}"])
        memo[name] = 1 + max((depth(p, trail + (name,)) for p in parents.get(name, [])), default=0)
        return memo[name]

    for name in groups:
        depth(name)
    return memo


def groups_of(groups: Groups, host: str, every: Sequence[str]) -> list[str]:
    """Groups the host is in (directly or through children), parents before children."""
    depth = depths(groups)
    inside = [n for n in groups if host in members(groups, n, every)]
    return sorted(inside, key=lambda n: (depth.get(n, 1), n))


def resolve(groups: Groups, every: Sequence[str], targets: Sequence[str]) -> list[str]:
    """Host and group names (and globs, ranges, `!name` to leave out) -> hosts, in order, once each."""
    chosen: dict[str, None] = {}
    dropped: set[str] = set()
    problems = []
    for target in targets:
        negate = target.startswith("!")
        name = target[1:] if negate else target
        found = match(groups, name, every)
        if found is None:
            known = [*groups, *every]
            problems.append(f"unknown host or group {name!r}{did_you_mean(name, known)} "
                            f"(groups: {', '.join(sorted(groups)) or 'none'}; {len(every)} hosts)")
            continue
        if negate:
            dropped.update(found)
        else:
            chosen.update(dict.fromkeys(found))
    if problems:
        raise UsageError("; ".join(problems), hint="`ddtree-ops profile show GROUP` lists a group's hosts")
    return [h for h in chosen if h not in dropped]


def match(groups: Groups, name: str, every: Sequence[str]) -> list[str] | None:
    """The hosts one name means (a group, a host, a range or a glob), or None when it means none."""
    if is_group(groups, name):
        if name in every:
            raise UsageError(f"{name!r} is both a host and a group; rename one of them")
        return members(groups, name, every)
    if name in every:
        return [name]
    if "[" in name and ":" in name:
        try:
            names = expand(name)
        except ProfileError:
            return None
        hits = [n for n in names if n in every]
        return hits or None
    if any(c in name for c in "*?"):
        return [h for h in every if fnmatch.fnmatchcase(h, name)] or None
    return None
