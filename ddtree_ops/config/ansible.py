"""Ansible inventories (YAML or INI), read with the line each host, group and variable came from.

Membership (groups, children, hosts with their ranges) is kept as Ansible says; of the variables,
only those about reaching a host become a profile layer (`ansible_host`, `_user`, `_port`,
`_become`, `_connection`); the rest are Ansible's business. ssh_config stays the authority on how a
host is reached.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddtree_ops.config.hostnames import expand
from ddtree_ops.config.layers import merge
from ddtree_ops.config.source import Loc, Sourced, compose, display_path
from ddtree_ops.errors import ProfileError, UsageError, did_you_mean

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
                self.host_vars[name] = merge(self.host_vars.get(name, Sourced()), vars_)


def var_layer(raw: dict[str, Any], where: dict[str, str], shown: str) -> Sourced:
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
                problems.append(f"{where} [{section}:{kind}]: unknown section type{did_you_mean(kind, ('vars', 'children'))}"
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
    src = compose(text, shown)
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
                problems.append(f"{at(kloc)} {'.'.join(kloc)}: unknown key{did_you_mean(key, ANSIBLE_GROUP_KEYS)} "
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
    shown = display_path(path)
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
