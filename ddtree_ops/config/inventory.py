"""The inventory: every host, group and service of one profiles directory (and, optionally, one
Ansible inventory), and each host's settings layered into its `Profile`.

A host's profile is built from layers, lowest first:

    profiles/defaults.yaml
    -> every group the host is in: profiles/groups/<group>.yaml, parents before children
    -> the host's own entry in a group file or an inventory (one line: `- ct140: {memory: ...}`,
       or Ansible's `ansible_host` / `_user` / `_port` / `_become` / `_connection`)
    -> profiles/<host>.yaml
    -> --set

so 40 identical boxes need one group file and 40 one-line entries. Members come from group files
(`hosts:`, `children:`) and from an existing Ansible inventory (`--inventory FILE`, read by
`ansible.py`). Two groups at the same depth that set one key to different values are refused,
naming both lines (Ansible would pick one silently by name). Every problem names its file and line.
Which hosts a name means is `targets.py`; how layers merge is `layers.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ddtree_ops.config import targets
from ddtree_ops.config.ansible import AnsibleInventory, read_ansible, var_layer
from ddtree_ops.config.hostnames import expand
from ddtree_ops.config.layers import apply_overrides, leaves, merge
from ddtree_ops.config.model import Profile
from ddtree_ops.config.paths import profiles_dir
from ddtree_ops.config.source import Loc, Sourced, display_path, read_file
from ddtree_ops.config.targets import Group
from ddtree_ops.config.validate import validate
from ddtree_ops.errors import ProfileError, UsageError, did_you_mean

ENV_INVENTORY = "DDTREE_OPS_INVENTORY"
GROUPS_DIR = "groups"
# multi-node services: profiles/services/<service>.yaml, layered over each node's own settings
SERVICES_DIR = "services"
# keys of a service file's multinode section that the tool fills in itself
_TOOL_SET = ("service", "node_rank")
# group-file keys that say who is in the group; every other key is a profile layer
MEMBERSHIP = ("hosts", "children")
IMPLICIT_GROUPS = ("all", "ungrouped")
_BY_NAME = "(the host's name)"  # where host.ssh_host comes from when nothing sets it


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
                self.listed.setdefault(path.stem, display_path(path))
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
                problems.append(f"{display_path(path)} service {name!r} has the name of a host or a group; rename one of them")
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
        shown = display_path(path)
        src = read_file(path, shown)
        name = path.stem
        g = self._group(name, shown)
        g.files.append(shown)
        problems: list[str] = []
        known = {f.alias or n for n, f in Profile.model_fields.items()}
        for key in src.data:
            if key not in MEMBERSHIP and key not in known:
                problems.append(f"{src.origin.get((key,), shown)} {key}: unknown key"
                                f"{did_you_mean(key, [*MEMBERSHIP, *known])} (a group file has hosts, children "
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
                                f"({display_path(self.host_files[name])})")
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
            layer = var_layer(ag.vars.data, {k[0]: v for k, v in ag.vars.origin.items()}, ag.where)
            if layer.data:
                g.settings.append(layer)
        for host, hv in inv.host_vars.items():
            layer = var_layer(hv.data, {k[0]: v for k, v in hv.origin.items()}, inv.where.get(host, inv.path))
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
                if child not in full and (hint := did_you_mean(child, full - {child})):
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

    def is_group(self, name: str) -> bool:
        return targets.is_group(self.groups, name)

    def members(self, group: str) -> list[str]:
        """A group's hosts, its own first, then each child's, in order, each once."""
        return targets.members(self.groups, group, self.hosts())

    def groups_of(self, host: str) -> list[str]:
        """Groups the host is in (directly or through children), parents before children."""
        return targets.groups_of(self.groups, host, self.hosts())

    def resolve(self, names: Sequence[str]) -> list[str]:
        """Host and group names (and globs, ranges, `!name` to leave out) -> hosts, in order, once each."""
        return targets.resolve(self.groups, self.hosts(), names)

    # -- profiles

    def _file(self, path: Path) -> Sourced:
        if path not in self._cache:
            self._cache[path] = read_file(path, display_path(path))
        return self._cache[path]

    def sourced(self, host: str, overrides: Sequence[str] = ()) -> Sourced:
        """Every layer of the host merged, with where each key came from."""
        if host not in self.host_files and host not in self.listed:
            raise ProfileError([self._unknown(host)])
        groups = self.groups_of(host)
        if host not in self.host_files and not any(self.groups[g].settings for g in groups):
            raise ProfileError([f"{self.listed.get(host, host)} {host}: no settings: it is in no group with a group "
                                f"file ({', '.join(groups) or 'no group'}) and there is no "
                                f"{display_path(self.directory / (host + '.yaml'))}"])
        # a host listed by name in a group or an inventory is reached by that name through
        # ssh_config; a lone profile file says how itself (and must, for SSH: the profile's rule)
        named = any(host in g.hosts for g in self.groups.values())
        src = Sourced({"name": host, **({"host": {"ssh_host": host}} if named else {})},
                      {("name",): self.listed.get(host, host),
                       **({("host", "ssh_host"): _BY_NAME} if named else {})})
        defaults = self.directory / "defaults.yaml"
        if defaults.is_file():
            src = merge(src, self._file(defaults))
        self._refuse_conflicts(host, groups)
        for g in groups:
            for layer in self.groups[g].settings:
                src = merge(src, layer)
        for layer in self.entries.get(host, []):
            src = merge(src, layer)
        if host in self.host_files:
            src = merge(src, self._file(self.host_files[host]))
        src.data["name"] = host
        hs = src.data.get("host")
        if isinstance(hs, dict) and hs.get("transport") == "local" and src.origin.get(("host", "ssh_host")) == _BY_NAME:
            hs.pop("ssh_host", None)  # a local host is not reached over SSH at all
        return apply_overrides(src, list(overrides))

    def profile(self, host: str, overrides: Sequence[str] = ()) -> Profile:
        fallback = display_path(self.host_files[host]) if host in self.host_files else self.listed.get(host, host)
        return validate(self.sourced(host, overrides), fallback=fallback)

    def _service_file(self, service: str) -> Sourced:
        if service not in self.service_files:
            hint = did_you_mean(service, self.service_files)
            raise ProfileError([f"no service {service!r}{hint} (services: {', '.join(self.service_files) or 'none'}; "
                                f"a multi-node service is {display_path(self.directory / SERVICES_DIR)}/<name>.yaml)"])
        return self._file(self.service_files[service])

    def service_profiles(self, service: str, overrides: Sequence[str] = ()) -> list[Profile]:
        """One profile per node, in rank order: each node's own layers (defaults, its groups, its
        entry and file: how it is reached, its cards), then the service file, then --set, with
        multinode.service and multinode.node_rank filled in. Every problem of every node at once."""
        src = self._service_file(service)
        shown = display_path(self.service_files[service])
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
                layered = merge(self.sourced(node), src)
                layered.data["name"] = node
                layered.data["multinode"] = {**layered.data["multinode"], "service": service, "node_rank": rank}
                out.append(validate(apply_overrides(layered, list(overrides)), fallback=shown))
            except ProfileError as exc:
                problems += [f"{m} (node {node}, rank {rank})" for m in exc.problems]
        if problems:
            raise ProfileError(list(dict.fromkeys(problems)))
        return out

    def _unknown(self, host: str) -> str:
        path = display_path(self.directory / f"{host}.yaml")
        every = self.hosts()
        shown = ", ".join(every[:12]) + (f", ... ({len(every)} in all)" if len(every) > 12 else "")
        hint = did_you_mean(host, [*every, *self.groups])
        return (f"no profile for host {host!r}{hint}: {path} does not exist and no group lists it "
                f"(profiles: {shown or 'none'})")

    def _refuse_conflicts(self, host: str, groups: list[str]) -> None:
        depth = targets.depths(self.groups)
        seen: dict[tuple[int, Loc], tuple[str, Any, str]] = {}
        problems = []
        for g in groups:
            for layer in self.groups[g].settings:
                for loc, value in leaves(layer.data):
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
