"""Hosts and groups: which hosts a name means, and where each host's settings come from.

A host's profile is built from layers, lowest first:

    profiles/defaults.yaml
    -> every group the host is in: profiles/groups/<group>.yaml, parents before children
    -> the host's own entry in a group file or an inventory (one line: `- ct140: {memory: ...}`,
       or Ansible's `ansible_host` / `_user` / `_port` / `_become` / `_connection`)
    -> profiles/<host>.yaml
    -> --set

so 40 identical boxes need one group file and 40 one-line entries. Members come from group files
(`hosts:`, `children:`) and from an existing Ansible inventory (`--inventory FILE`, YAML or INI,
read here with line numbers; ssh_config stays the authority on how a host is reached). Two groups
at the same depth that set one key to different values are refused, naming both lines (Ansible
would pick one silently by name). Every problem names its file and line.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from ddtree_ops.errors import ProfileError, UsageError
from ddtree_ops.profile import (Loc, Profile, Sourced, _apply_overrides, _compose, _merge, _read, _shown,
                                profiles_dir, validate)

ENV_INVENTORY = "DDTREE_OPS_INVENTORY"
GROUPS_DIR = "groups"
# multi-node services: profiles/services/<service>.yaml, layered over each node's own settings
SERVICES_DIR = "services"
# keys of a service file's multinode section that the tool fills in itself
_TOOL_SET = ("service", "node_rank")
# group-file keys that say who is in the group; every other key is a profile layer
MEMBERSHIP = ("hosts", "children")
ANSIBLE_GROUP_KEYS = ("hosts", "children", "vars")
# Ansible connection variables -> the profile keys that mean the same (resolved through ssh_config,
# as any profile's host section is)
ANSIBLE_VARS: dict[str, Loc] = {
    "ansible_host": ("host", "ssh_host"), "ansible_ssh_host": ("host", "ssh_host"),
    "ansible_user": ("host", "user"), "ansible_ssh_user": ("host", "user"),
    "ansible_port": ("host", "port"), "ansible_ssh_port": ("host", "port"),
    "ansible_become": ("host", "sudo"),
    "ansible_connection": ("host", "transport"),
}
IMPLICIT_GROUPS = ("all", "ungrouped")
_BY_NAME = "(the host's name)"  # where host.ssh_host comes from when nothing sets it


# --------------------------------------------------------------------------- host patterns


_RANGE = re.compile(r"\[([^\]]*)\]")


def expand(pattern: str, where: str = "") -> list[str]:
    """Ansible host ranges: `a6k-[01:40]` (zero padding kept), `db-[a:f]`, `n[0:10:2]`."""
    m = _RANGE.search(pattern)
    if m is None:
        return [pattern]
    parts = m.group(1).split(":")
    bad = ProfileError([f"{where} host range {pattern!r}: expected [start:end] or [start:end:step], "
                        "e.g. a6k-[01:40]".lstrip()])
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise bad
    start, end = parts[0], parts[1]
    try:
        step = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise bad from None
    if step < 1:
        raise bad
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") else 0
        values = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    elif len(start) == len(end) == 1 and start.isalpha() and end.isalpha():
        values = [chr(c) for c in range(ord(start), ord(end) + 1, step)]
    else:
        raise bad
    if not values:
        raise ProfileError([f"{where} host range {pattern!r} is empty (start after end)".lstrip()])
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [name for v in values for name in expand(head + v + tail, where)]


_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def compress(names: Sequence[str]) -> str:
    """The inverse of `expand` for reading: `gpu-a01 gpu-a02 gpu-a03 gpu-b7` -> `gpu-a[01:03] gpu-b7`
    (runs of three or more; order of first appearance kept)."""
    runs: dict[tuple[str, str, int], list[int]] = {}
    order: list[tuple[str, str, int] | str] = []
    for n in names:
        m = _NUMBERED.match(n)
        if m is None:
            order.append(n)
            continue
        digits = m.group(2)
        key = (m.group(1), m.group(3), len(digits))  # same width: zfill gives each name back
        if key not in runs:
            runs[key] = []
            order.append(key)
        runs[key].append(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        head, tail, width = item
        nums = sorted(set(runs[item]))
        start = prev = nums[0]
        for x in nums[1:] + [None]:  # type: ignore[list-item]
            if x is not None and x == prev + 1:
                prev = x
                continue
            if prev - start >= 2:
                out.append(f"{head}[{str(start).zfill(width)}:{str(prev).zfill(width)}]{tail}")
            else:
                out.extend(f"{head}{str(v).zfill(width)}{tail}" for v in range(start, prev + 1))
            if x is not None:
                start = prev = x
    return " ".join(out)


# --------------------------------------------------------------------------- Ansible inventories


@dataclass
class AnsibleGroup:
    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: Sourced = field(default_factory=Sourced)
    where: str = ""  # file:line of the group's first mention


@dataclass
class AnsibleInventory:
    path: str
    groups: dict[str, AnsibleGroup] = field(default_factory=dict)
    host_vars: dict[str, Sourced] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # host -> file:line it is first listed at

    def group(self, name: str, where: str) -> AnsibleGroup:
        if name not in self.groups:
            self.groups[name] = AnsibleGroup(name, where=where)
        return self.groups[name]

    def add_host(self, group: str, pattern: str, where: str, vars_: Sourced | None) -> None:
        for name in expand(pattern, where):
            g = self.group(group, where)
            if name not in g.hosts:
                g.hosts.append(name)
            self.where.setdefault(name, where)
            if vars_ is not None and vars_.data:
                self.host_vars[name] = _merge(self.host_vars.get(name, Sourced()), vars_)


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _var_layer(raw: dict[str, Any], where: dict[str, str], shown: str) -> Sourced:
    """Ansible variables -> a profile layer; variables that are not about reaching the host are
    Ansible's business and left alone."""
    out = Sourced()
    problems = []
    for key, value in raw.items():
        loc = ANSIBLE_VARS.get(key)
        if loc is None:
            continue
        line = where.get(key, shown)
        if loc == ("host", "port"):
            try:
                value = int(value)
            except (TypeError, ValueError):
                problems.append(f"{line} {key}: expected a port number, got {value!r}")
                continue
        elif loc == ("host", "sudo"):
            value = str(value).lower() in ("1", "true", "yes", "on") if not isinstance(value, bool) else value
        elif loc == ("host", "transport"):  # Ansible's ssh, smart and paramiko all mean SSH here
            value = "local" if str(value) == "local" else "ssh"
        else:
            value = str(value)
        out.data.setdefault(loc[0], {})[loc[1]] = value
        out.origin[loc[:1]] = out.origin.get(loc[:1], line)
        out.origin[loc] = line
    if problems:
        raise ProfileError(problems)
    return out


def parse_ini(text: str, shown: str) -> AnsibleInventory:
    """Ansible's INI inventory: `[group]` host lines with key=value vars, `[group:vars]`,
    `[group:children]`; hosts before any section are ungrouped."""
    inv = AnsibleInventory(shown)
    problems: list[str] = []
    section, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        where = f"{shown}:{n}"
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            m = re.fullmatch(r"\[([^\]:\s]+)(?::([^\]\s]*))?\]", line)
            if m is None:
                problems.append(f"{where} {line!r}: a section is [group], [group:vars] or [group:children]")
                continue
            section, kind = m.group(1), m.group(2) or "hosts"
            if kind not in ("hosts", "vars", "children") or m.group(2) == "hosts":
                problems.append(f"{where} [{section}:{kind}]: unknown section type{_did_you_mean(kind, ('vars', 'children'))}"
                                " (a section is [group], [group:vars] or [group:children])")
                section, kind = section, "ignored"
                continue
            inv.group(section, where)
            continue
        if kind == "ignored":
            continue
        if kind == "children":
            inv.group(section, where).children.append(line.split()[0])
            inv.group(line.split()[0], where)
            continue
        if kind == "vars":
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                problems.append(f"{where} {line!r}: expected key=value in [{section}:vars]")
                continue
            g = inv.group(section, where)
            g.vars.data[key.strip()] = _ini_value(value.strip())
            g.vars.origin[(key.strip(),)] = where
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            problems.append(f"{where} {line!r}: {exc}")
            continue
        host, rest = words[0], words[1:]
        host_vars = Sourced()
        for word in rest:
            key, sep, value = word.partition("=")
            if not sep or not key:
                problems.append(f"{where} {host}: expected key=value after the host name, got {word!r}")
                continue
            host_vars.data[key] = _ini_value(value)
            host_vars.origin[(key,)] = where
        try:
            inv.add_host(section, host, where, host_vars)
        except ProfileError as exc:
            problems += exc.problems
    if problems:
        raise ProfileError(problems)
    return inv


def _ini_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text


def parse_yaml_inventory(text: str, shown: str) -> AnsibleInventory:
    """Ansible's YAML inventory: groups (usually under `all`) with `hosts` (a mapping of host
    patterns to their vars), `children` (groups) and `vars`; any other key is refused."""
    src = _compose(text, shown)
    inv = AnsibleInventory(shown)
    problems: list[str] = []

    def at(loc: Loc) -> str:
        return src.origin.get(loc, shown)

    def group(name: str, body: Any, loc: Loc) -> None:
        g = inv.group(name, at(loc))
        if body is None:
            return
        if not isinstance(body, dict):
            problems.append(f"{at(loc)} {'.'.join(loc)}: a group is a mapping of hosts, children and vars, "
                            f"got {type(body).__name__}")
            return
        for key, value in body.items():
            kloc = loc + (key,)
            if key not in ANSIBLE_GROUP_KEYS:
                problems.append(f"{at(kloc)} {'.'.join(kloc)}: unknown key{_did_you_mean(key, ANSIBLE_GROUP_KEYS)} "
                                "(an Ansible group has hosts, children and vars)")
            elif value is None:
                continue
            elif not isinstance(value, dict):
                problems.append(f"{at(kloc)} {'.'.join(kloc)}: expected a mapping (one `name:` per line), "
                                f"got {type(value).__name__}")
            elif key == "hosts":
                for host, hvars in value.items():
                    hloc = kloc + (str(host),)
                    if hvars is not None and not isinstance(hvars, dict):
                        problems.append(f"{at(hloc)} {'.'.join(hloc)}: host variables must be a mapping, "
                                        f"got {type(hvars).__name__}")
                        continue
                    layer = Sourced(dict(hvars or {}), {(k,): at(hloc + (k,)) for k in (hvars or {})})
                    try:
                        inv.add_host(name, str(host), at(hloc), layer)
                    except ProfileError as exc:
                        problems.extend(exc.problems)
            elif key == "children":
                for child, cbody in value.items():
                    if str(child) not in g.children:
                        g.children.append(str(child))
                    group(str(child), cbody, kloc + (str(child),))
            else:
                g.vars.data.update(value)
                g.vars.origin.update({(k,): at(kloc + (k,)) for k in value})

    if src.data and not isinstance(src.data, dict):
        raise ProfileError([f"{shown}:1 an inventory is a mapping of groups (usually `all:`)"])
    for name, body in src.data.items():
        group(str(name), body, (str(name),))
    if problems:
        raise ProfileError(problems)
    return inv


def read_ansible(path: Path) -> AnsibleInventory:
    shown = _shown(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"inventory {shown}: cannot read ({exc.strerror})") from None
    if _looks_like_yaml(path, text):
        return parse_yaml_inventory(text, shown)
    return parse_ini(text, shown)


def _looks_like_yaml(path: Path, text: str) -> bool:
    if path.suffix in (".yml", ".yaml", ".json"):
        return True
    if path.suffix in (".ini", ".cfg", ".hosts"):
        return False
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip()[0] not in "#;"), "")
    return not first.startswith("[") and (first.endswith(":") or first.startswith("---") or first.startswith("{"))


# --------------------------------------------------------------------------- the inventory


@dataclass
class Group:
    name: str
    hosts: list[str] = field(default_factory=list)  # direct members, in order
    children: list[str] = field(default_factory=list)
    settings: list[Sourced] = field(default_factory=list)  # group file, then inventory vars
    files: list[str] = field(default_factory=list)  # where the group is defined
    where: str = ""


@dataclass
class Inventory:
    """Every host and group known from one profiles directory and, optionally, one inventory."""

    directory: Path
    inventory: str | None = None
    groups: dict[str, Group] = field(default_factory=dict)
    host_files: dict[str, Path] = field(default_factory=dict)
    entries: dict[str, list[Sourced]] = field(default_factory=dict)  # host -> its one-line layers
    listed: dict[str, str] = field(default_factory=dict)  # host -> where it is first listed
    service_files: dict[str, Path] = field(default_factory=dict)  # multi-node service -> its file
    _cache: dict[Path, Sourced] = field(default_factory=dict, repr=False)

    # -- loading

    @classmethod
    def load(cls, directory: Path | str | None = None, inventory: Path | str | None = None) -> Inventory:
        d = Path(directory) if directory else profiles_dir()
        inv_path = inventory if inventory is not None else os.environ.get(ENV_INVENTORY) or None
        self = cls(d, str(inv_path) if inv_path else None)
        for path in sorted(d.glob("*.yaml")):
            if path.stem != "defaults":
                self.host_files[path.stem] = path
                self.listed.setdefault(path.stem, _shown(path))
        problems: list[str] = []
        for path in sorted((d / GROUPS_DIR).glob("*.yaml")) if (d / GROUPS_DIR).is_dir() else []:
            try:
                self._add_group_file(path)
            except ProfileError as exc:
                problems += exc.problems
        for path in sorted((d / SERVICES_DIR).glob("*.yaml")) if (d / SERVICES_DIR).is_dir() else []:
            self.service_files[path.stem] = path
        if inv_path:
            p = Path(inv_path).expanduser()
            if not p.is_file():
                raise UsageError(f"inventory {inv_path} does not exist")
            try:
                self._add_ansible(read_ansible(p))
            except ProfileError as exc:
                problems += exc.problems
        for name, path in self.service_files.items():
            if name in self.host_files or name in self.groups or name in self.listed:
                problems.append(f"{_shown(path)} service {name!r} has the name of a host or a group; rename one of them")
        if problems:
            raise ProfileError(problems)
        self._check_children()
        return self

    def _group(self, name: str, where: str) -> Group:
        if name not in self.groups:
            self.groups[name] = Group(name, where=where)
        return self.groups[name]

    def _add_member(self, g: Group, host: str, where: str, layer: Sourced | None) -> None:
        if host in self.groups or host in IMPLICIT_GROUPS:
            raise ProfileError([f"{where} {host!r} is listed as a host but is also a group name"])
        if host not in g.hosts:
            g.hosts.append(host)
        self.listed.setdefault(host, where)
        if layer is not None and layer.data:
            self.entries.setdefault(host, []).append(layer)

    def _add_group_file(self, path: Path) -> None:
        shown = _shown(path)
        src = _read(path, shown)
        name = path.stem
        g = self._group(name, shown)
        g.files.append(shown)
        problems: list[str] = []
        known = set(Profile.model_fields) | {"modes"}
        for key in src.data:
            if key not in MEMBERSHIP and key not in known:
                problems.append(f"{src.origin.get((key,), shown)} {key}: unknown key"
                                f"{_did_you_mean(key, [*MEMBERSHIP, *known])} (a group file has hosts, children "
                                "and profile keys)")
        if "name" in src.data:
            problems.append(f"{src.origin.get(('name',), shown)} name: a group cannot set the host name")
        for host_loc, host, layer in _members(src, problems):
            try:
                for h in expand(host, src.origin.get(host_loc, shown)):
                    self._add_member(g, h, src.origin.get(host_loc, shown), layer)
            except ProfileError as exc:
                problems += exc.problems
        for child in _names(src, "children", problems):
            if child not in g.children:
                g.children.append(child)
            self._group(child, src.origin.get(("children",), shown))
        if problems:
            raise ProfileError(problems)
        settings = Sourced({k: v for k, v in src.data.items() if k not in MEMBERSHIP},
                           {loc: w for loc, w in src.origin.items() if not loc or loc[0] not in MEMBERSHIP})
        if settings.data:
            g.settings.append(settings)

    def _add_ansible(self, inv: AnsibleInventory) -> None:
        problems: list[str] = []
        for name, ag in inv.groups.items():
            if name in self.host_files:
                problems.append(f"{ag.where} group {name!r} has the name of a host "
                                f"({_shown(self.host_files[name])})")
                continue
            g = self._group(name, ag.where)
            g.files.append(inv.path)
            for host in ag.hosts:
                try:
                    self._add_member(g, host, inv.where.get(host, ag.where), None)
                except ProfileError as exc:
                    problems += exc.problems
            for child in ag.children:
                if child not in g.children:
                    g.children.append(child)
                self._group(child, ag.where)
            layer = _var_layer(ag.vars.data, {k[0]: v for k, v in ag.vars.origin.items()}, ag.where)
            if layer.data:
                g.settings.append(layer)
        for host, hv in inv.host_vars.items():
            layer = _var_layer(hv.data, {k[0]: v for k, v in hv.origin.items()}, inv.where.get(host, inv.path))
            if layer.data:
                self.entries.setdefault(host, []).append(layer)
        if problems:
            raise ProfileError(problems)

    def _check_children(self) -> None:
        """A child group that has nothing in it anywhere is most likely a typo for one that has."""
        problems = []
        full = {n for n, g in self.groups.items() if g.hosts or g.children or g.settings}
        for g in self.groups.values():
            for child in g.children:
                if child not in full and (hint := _did_you_mean(child, full - {child})):
                    problems.append(f"{g.where} group {g.name!r} has child {child!r}, which has no hosts and no "
                                    f"group file{hint}")
        if problems:
            raise ProfileError(problems)

    # -- names

    def hosts(self) -> list[str]:
        """Every host: host files first (sorted), then members in the order they are listed."""
        out = dict.fromkeys(self.host_files)
        for g in self.groups.values():
            out.update(dict.fromkeys(g.hosts))
        return list(out)

    def is_service(self, name: str) -> bool:
        return name in self.service_files

    def services(self) -> list[str]:
        return list(self.service_files)

    def split_targets(self, targets: Sequence[str]) -> tuple[list[str], list[str]]:
        """(hosts, services): service names taken as they are, everything else through `resolve`."""
        services = [t for t in dict.fromkeys(targets) if self.is_service(t)]
        rest = [t for t in targets if not self.is_service(t)]
        return (self.resolve(rest) if rest else []), services

    def is_group(self, name: str) -> bool:
        return name in self.groups or name == "all"

    def members(self, group: str) -> list[str]:
        """A group's hosts, its own first, then each child's, in order, each once."""
        if group == "all":
            return self.hosts()
        out: dict[str, None] = {}
        seen: set[str] = set()

        def walk(name: str) -> None:
            if name in seen or name not in self.groups:
                return
            seen.add(name)
            out.update(dict.fromkeys(self.groups[name].hosts))
            for child in self.groups[name].children:
                walk(child)

        walk(group)
        return list(out)

    def groups_of(self, host: str) -> list[str]:
        """Groups the host is in (directly or through children), parents before children."""
        depth = self._depths()
        inside = [n for n in self.groups if host in self.members(n)]
        return sorted(inside, key=lambda n: (depth.get(n, 1), n))

    def _depths(self) -> dict[str, int]:
        parents: dict[str, list[str]] = {}
        for g in self.groups.values():
            for c in g.children:
                parents.setdefault(c, []).append(g.name)
        memo: dict[str, int] = {}

        def depth(name: str, trail: tuple[str, ...] = ()) -> int:
            if name in memo:
                return memo[name]
            if name == "all":  # Ansible's root: everything else is below it
                return 0
            if name in trail:
                raise ProfileError([f"{self.groups[name].where} group {name!r} is its own ancestor: "
                                    f"{' -> '.join((*trail, name))}"])
            memo[name] = 1 + max((depth(p, trail + (name,)) for p in parents.get(name, [])), default=0)
            return memo[name]

        for name in self.groups:
            depth(name)
        return memo

    def resolve(self, targets: Sequence[str]) -> list[str]:
        """Host and group names (and globs, ranges, `!name` to leave out) -> hosts, in order, once each."""
        chosen: dict[str, None] = {}
        dropped: set[str] = set()
        problems = []
        every = self.hosts()
        for target in targets:
            negate = target.startswith("!")
            name = target[1:] if negate else target
            found = self._match(name, every)
            if found is None:
                known = [*self.groups, *every]
                problems.append(f"unknown host or group {name!r}{_did_you_mean(name, known)} "
                                f"(groups: {', '.join(sorted(self.groups)) or 'none'}; {len(every)} hosts)")
                continue
            if negate:
                dropped.update(found)
            else:
                chosen.update(dict.fromkeys(found))
        if problems:
            raise UsageError("; ".join(problems), hint="`ddtree-ops profile show GROUP` lists a group's hosts")
        return [h for h in chosen if h not in dropped]

    def _match(self, name: str, every: list[str]) -> list[str] | None:
        if self.is_group(name):
            if name in every:
                raise UsageError(f"{name!r} is both a host and a group; rename one of them")
            return self.members(name)
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

    # -- profiles

    def _file(self, path: Path) -> Sourced:
        if path not in self._cache:
            self._cache[path] = _read(path, _shown(path))
        return self._cache[path]

    def sourced(self, host: str, overrides: Sequence[str] = ()) -> Sourced:
        """Every layer of the host merged, with where each key came from."""
        if host not in self.host_files and host not in self.listed:
            raise ProfileError([self._unknown(host)])
        groups = self.groups_of(host)
        if host not in self.host_files and not any(self.groups[g].settings for g in groups):
            raise ProfileError([f"{self.listed.get(host, host)} {host}: no settings: it is in no group with a group "
                                f"file ({', '.join(groups) or 'no group'}) and there is no "
                                f"{_shown(self.directory / (host + '.yaml'))}"])
        # a host listed by name in a group or an inventory is reached by that name through
        # ssh_config; a lone profile file says how itself (and must, for SSH: the profile's rule)
        named = any(host in g.hosts for g in self.groups.values())
        src = Sourced({"name": host, **({"host": {"ssh_host": host}} if named else {})},
                      {("name",): self.listed.get(host, host),
                       **({("host", "ssh_host"): _BY_NAME} if named else {})})
        defaults = self.directory / "defaults.yaml"
        if defaults.is_file():
            src = _merge(src, self._file(defaults))
        self._refuse_conflicts(host, groups)
        for g in groups:
            for layer in self.groups[g].settings:
                src = _merge(src, layer)
        for layer in self.entries.get(host, []):
            src = _merge(src, layer)
        if host in self.host_files:
            src = _merge(src, self._file(self.host_files[host]))
        src.data["name"] = host
        hs = src.data.get("host")
        if isinstance(hs, dict) and hs.get("transport") == "local" and src.origin.get(("host", "ssh_host")) == _BY_NAME:
            hs.pop("ssh_host", None)  # a local host is not reached over SSH at all
        return _apply_overrides(src, list(overrides))

    def profile(self, host: str, overrides: Sequence[str] = ()) -> Profile:
        fallback = _shown(self.host_files[host]) if host in self.host_files else self.listed.get(host, host)
        return validate(self.sourced(host, overrides), fallback=fallback)

    def service_nodes(self, service: str) -> list[str]:
        """The nodes of a multi-node service, in rank order (read from its file, not validated)."""
        src = self._service_file(service)
        nodes = (src.data.get("multinode") or {}).get("nodes") if isinstance(src.data.get("multinode"), dict) else None
        return [str(n) for n in nodes] if isinstance(nodes, list) else []

    def _service_file(self, service: str) -> Sourced:
        if service not in self.service_files:
            hint = _did_you_mean(service, self.service_files)
            raise ProfileError([f"no service {service!r}{hint} (services: {', '.join(self.service_files) or 'none'}; "
                                f"a multi-node service is {_shown(self.directory / SERVICES_DIR)}/<name>.yaml)"])
        return self._file(self.service_files[service])

    def service_profiles(self, service: str, overrides: Sequence[str] = ()) -> list[Profile]:
        """One profile per node, in rank order: each node's own layers (defaults, its groups, its
        entry and file: how it is reached, its cards), then the service file, then --set, with
        multinode.service and multinode.node_rank filled in. Every problem of every node at once."""
        src = self._service_file(service)
        shown = _shown(self.service_files[service])
        problems: list[str] = []
        mn = src.data.get("multinode")
        if not isinstance(mn, dict) or not isinstance(mn.get("nodes"), list) or len(mn["nodes"]) < 2:
            raise ProfileError([f"{src.origin.get(('multinode',), shown)} multinode.nodes: a service file lists its "
                                "nodes in rank order (at least two): multinode: {nodes: [host-a, host-b], ...}"])
        for key in _TOOL_SET:
            if key in mn:
                problems.append(f"{src.origin.get(('multinode', key), shown)} multinode.{key}: set by the tool (from "
                                "the file's name and the order of multinode.nodes), not in the file")
        if "name" in src.data:
            problems.append(f"{src.origin.get(('name',), shown)} name: a service file cannot set a host's name")
        for key in MEMBERSHIP:
            if key in src.data:
                problems.append(f"{src.origin.get((key,), shown)} {key}: a service lists its nodes in multinode.nodes")
        known = set(self.hosts())
        nodes = [str(n) for n in mn["nodes"]]
        for i, node in enumerate(nodes):
            if node not in known:
                problems.append(f"{src.origin.get(('multinode', 'nodes', str(i)), shown)} multinode.nodes.{i}: "
                                f"{self._unknown(node)}")
        if problems:
            raise ProfileError(problems)
        out: list[Profile] = []
        for rank, node in enumerate(nodes):
            try:
                layered = _merge(self.sourced(node), src)
                layered.data["name"] = node
                layered.data["multinode"] = {**layered.data["multinode"], "service": service, "node_rank": rank}
                out.append(validate(_apply_overrides(layered, list(overrides)), fallback=shown))
            except ProfileError as exc:
                problems += [f"{m} (node {node}, rank {rank})" for m in exc.problems]
        if problems:
            raise ProfileError(list(dict.fromkeys(problems)))
        return out

    def _unknown(self, host: str) -> str:
        path = _shown(self.directory / f"{host}.yaml")
        every = self.hosts()
        shown = ", ".join(every[:12]) + (f", ... ({len(every)} in all)" if len(every) > 12 else "")
        hint = _did_you_mean(host, [*every, *self.groups])
        return (f"no profile for host {host!r}{hint}: {path} does not exist and no group lists it "
                f"(profiles: {shown or 'none'})")

    def _refuse_conflicts(self, host: str, groups: list[str]) -> None:
        depth = self._depths()
        seen: dict[tuple[int, Loc], tuple[str, Any, str]] = {}
        problems = []
        for g in groups:
            for layer in self.groups[g].settings:
                for loc, value in _leaves(layer.data):
                    key = (depth.get(g, 1), loc)
                    where = layer.origin.get(loc, g)
                    if key in seen and seen[key][0] != g and seen[key][1] != value:
                        other, ovalue, owhere = seen[key]
                        problems.append(f"{where} {'.'.join(loc)}: {host} is in groups {other!r} ({owhere}: "
                                        f"{ovalue!r}) and {g!r} ({value!r}) at the same depth; make one a child of "
                                        "the other, or set the key in the host's own entry")
                    seen.setdefault(key, (g, value, where))
        if problems:
            raise ProfileError(problems)


def _members(src: Sourced, problems: list[str]) -> list[tuple[Loc, str, Sourced | None]]:
    """`hosts:` as a list (`- ct129`, `- ct140: {memory: ...}`) or a mapping (`ct129:` / `ct140: {...}`)."""
    raw = src.data.get("hosts")
    out: list[tuple[Loc, str, Sourced | None]] = []
    where = src.origin.get(("hosts",), "")
    if raw is None:
        return out
    items: list[tuple[Loc, Any]]
    if isinstance(raw, list):
        items = [(("hosts", str(i)), v) for i, v in enumerate(raw)]
    elif isinstance(raw, dict):
        items = [(("hosts",), {k: v}) for k, v in raw.items()]
    else:
        problems.append(f"{where} hosts: expected a list of host names, got {type(raw).__name__}")
        return out
    for loc, item in items:
        if isinstance(item, (str, int)) and not isinstance(item, bool):
            out.append((loc, str(item), None))
        elif isinstance(item, dict) and len(item) == 1:
            (name, body), = item.items()
            inner = loc + (str(name),) if loc == ("hosts",) else loc
            if body is not None and not isinstance(body, dict):
                problems.append(f"{src.origin.get(inner, where)} hosts.{name}: a host's entry is a mapping of "
                                f"profile keys, got {type(body).__name__}")
                continue
            prefix = inner + (str(name),) if loc != ("hosts",) else inner
            origin = {l[len(prefix):]: w for l, w in src.origin.items() if l[:len(prefix)] == prefix and
                      len(l) > len(prefix)}
            out.append((inner, str(name), Sourced(dict(body or {}), origin) if body else None))
        else:
            problems.append(f"{src.origin.get(loc, where)} {'.'.join(loc)}: expected a host name or "
                            "`name: {profile keys}`")
    return out


def _names(src: Sourced, key: str, problems: list[str]) -> list[str]:
    raw = src.data.get(key)
    if raw is None:
        return []
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return list(raw)
    problems.append(f"{src.origin.get((key,), '')} {key}: expected a list of group names")
    return []


def _leaves(data: Any, loc: Loc = ()) -> list[tuple[Loc, Any]]:
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _leaves(v, loc + (str(k),))]
    return [(loc, data)]


# --------------------------------------------------------------------------- what differs in a group


def differences(resolved: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(what every host shares, flattened; per host, the keys where hosts differ). The host's own
    name (and an ssh_host equal to it) differ by nature and are left out."""
    flat = {h: dict(_leaves(doc)) for h, doc in resolved.items()}
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


def flatten(data: Any) -> dict[str, Any]:
    return {".".join(loc): v for loc, v in _leaves(data)}
