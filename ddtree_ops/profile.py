"""Per-host profiles: YAML in, a validated Profile out, or every problem with its file and line.

A profile is `profiles/defaults.yaml` merged with `profiles/<host>.yaml`, then any
`--set key.path=value` overrides. Validation is pydantic (strict types, unknown keys
forbidden); its error locations are mapped back to the YAML line they came from, so a typo
reads `profiles/ct129.yaml:14 memory.mem_fraction_static: 1.4 is not in (0, 1)`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ddtree_ops.errors import ProfileError

MODES = ("nextn", "dflash", "ddtree-shadow")
Mode = Literal["nextn", "dflash", "ddtree-shadow"]

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ABS_PATH = r"^/"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, frozen=True)


Fraction = Annotated[float, Field(gt=0, lt=1)]
Port = Annotated[int, Field(ge=1, le=65535)]
PosInt = Annotated[int, Field(ge=1)]
AbsPath = Annotated[str, Field(pattern=_ABS_PATH)]
Seconds = Annotated[float, Field(gt=0)]

AttentionBackend = Literal[
    "flashinfer", "triton", "fa3", "fa4", "trtllm_mha", "trtllm_mla", "flashmla",
    "cutlass_mla", "torch_native", "flex_attention",
]


class HostSection(_Strict):
    # ssh: reached through ssh_config by ssh_host; local: the tool runs on the GPU host itself
    # (a cron smoke check or diagnose there, or a machine without sshd)
    transport: Literal["ssh", "local"] = "ssh"
    ssh_host: Annotated[str, Field(min_length=1)] | None = None
    user: str | None = None
    port: Port | None = None
    sudo: bool = False
    host_key_policy: Literal["accept-new", "strict"] = "accept-new"


class GpuSection(_Strict):
    model: str
    memory_mib: Annotated[int, Field(ge=1024, le=1 << 22)]
    arch: Annotated[str, Field(pattern=r"^sm_\d{2,3}$")]
    count: Annotated[int, Field(ge=1, le=64)] = 1


CardIndex = Annotated[int, Field(ge=0, le=63)]


class ParallelSection(_Strict):
    """SGLang's own parallel sizes, under their flag names (--tp-size, --dp-size, --pp-size,
    --ep-size). GPUs a service needs: dp x tp x pp in all (dp counts replicas, as `--dp-size` does
    since attention DP moved to its own flag), split evenly over its nodes."""

    tp_size: Annotated[int, Field(ge=1, le=64)] = 1
    dp_size: Annotated[int, Field(ge=1, le=64)] = 1
    pp_size: Annotated[int, Field(ge=1, le=64)] = 1
    ep_size: Annotated[int, Field(ge=1, le=64)] = 1

    @property
    def world(self) -> int:
        return self.dp_size * self.tp_size * self.pp_size


class GpuCard(_Strict):
    """One card the service owns: its index on the host (nvidia-smi's, rendered into
    CUDA_VISIBLE_DEVICES) and, where it differs from the `gpu:` section, its own facts."""

    index: CardIndex
    model: str | None = None
    memory_mib: Annotated[int, Field(ge=1024, le=1 << 22)] | None = None
    arch: Annotated[str, Field(pattern=r"^sm_\d{2,3}$")] | None = None


@dataclass(frozen=True)
class Card:
    """A card with every fact filled in (from its own entry, else the profile's gpu section)."""

    index: int
    model: str
    memory_mib: int
    arch: str


class MultinodeSection(_Strict):
    """One SGLang service over several hosts: the same launch line on each node, with --nnodes,
    --node-rank and --dist-init-addr. Written in a service file (profiles/services/<name>.yaml);
    the tool fills in `service` and `node_rank` from the file's name and the order of `nodes`."""

    nodes: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=2, max_length=64)]
    # rank 0's address as the OTHER nodes reach it (torch's TCPStore listens there): an IP or a name
    # they resolve; ssh_config's HostName is how this machine reaches it, which may be another network
    dist_init_host: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:\[\]-]+$")]
    dist_init_port: Port = 20000
    # SGLang's --dist-timeout: how long the store waits for every node, and how long a collective
    # waits for a dead peer before NCCL's watchdog takes the survivors down
    dist_timeout_s: Annotated[int, Field(ge=1, le=86400)] | None = None
    service: str = ""
    node_rank: Annotated[int, Field(ge=0)] = 0

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def dist_init_addr(self) -> str:
        host = f"[{self.dist_init_host}]" if ":" in self.dist_init_host and not self.dist_init_host.startswith("[") \
            else self.dist_init_host
        return f"{host}:{self.dist_init_port}"


class ServiceSection(_Strict):
    unit: Annotated[str, Field(pattern=r"^[A-Za-z0-9:_.@-]+\.service$")]
    python: AbsPath
    listen_host: str = "127.0.0.1"
    port: Port = 30000
    user: str = "root"
    model_path: AbsPath
    served_model_name: str | None = None
    restart_sec: Seconds = 30
    start_limit_burst: PosInt = 3
    start_limit_interval_s: Seconds = 600
    timeout_start_s: Seconds = 1800
    timeout_stop_s: Seconds = 120
    state_dir: AbsPath = "/var/lib/ddtree-ops"
    env_dir: AbsPath = "/etc/ddtree-ops"
    env: dict[Annotated[str, Field(pattern=_ENV_NAME)], str] = {}
    # launch flags the profile does not model (e.g. --load-format dummy), appended as given;
    # checked by the host's own SGLang parser at preflight
    extra_args: list[str] = []
    # name -> "env:VAR" (read on the control machine at render time), "file:/path", or a literal
    secrets: dict[Annotated[str, Field(pattern=_ENV_NAME)], str] = {}


class MemorySection(_Strict):
    mem_fraction_static: Fraction
    context_length: Annotated[int, Field(ge=256, le=4_194_304)]
    max_running_requests: Annotated[int, Field(ge=1, le=4096)]
    attention_backend: AttentionBackend
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3", "bf16"] = "auto"
    page_size: Annotated[int, Field(ge=1, le=1024)] = 1
    cuda_graph: bool = True
    cuda_graph_max_bs: Annotated[int, Field(ge=1, le=1024)] | None = 8
    chunked_prefill_size: Annotated[int, Field(ge=64)] | None = None
    quantization: str | None = None


class NextnMode(_Strict):
    algorithm: Literal["NEXTN"] = "NEXTN"
    # None for MTP-bearing checkpoints, where SGLang uses the target's own MTP layers
    draft_model_path: AbsPath | None = None
    num_steps: Annotated[int, Field(ge=1, le=16)] = 3
    eagle_topk: Annotated[int, Field(ge=1, le=16)] = 1
    num_draft_tokens: Annotated[int, Field(ge=2, le=64)] = 4


class DflashMode(_Strict):
    algorithm: Literal["DFLASH"] = "DFLASH"
    draft_model_path: AbsPath
    block_size: Annotated[int, Field(ge=2, le=64)] = 16
    draft_attention_backend: AttentionBackend | None = None


class ShadowSettings(_Strict):
    share: Annotated[float, Field(ge=0, le=1)] = 0.25
    report_every: PosInt = 64


class DDTreeShadowMode(_Strict):
    algorithm: Literal["DDTREE"] = "DDTREE"
    draft_model_path: AbsPath
    block_size: Annotated[int, Field(ge=2, le=64)] = 16
    budget: Annotated[int, Field(ge=1, le=4096)] = 64
    draft_attention_backend: AttentionBackend | None = None
    shadow: ShadowSettings = ShadowSettings()


ModeConfig = Union[NextnMode, DflashMode, DDTreeShadowMode]


class ModesSection(_Strict):
    nextn: NextnMode
    dflash: DflashMode | None = None
    ddtree_shadow: DDTreeShadowMode | None = Field(default=None, alias="ddtree-shadow")


class GateSection(_Strict):
    startup_deadline_s: Seconds = 900
    stay_healthy_s: Annotated[float, Field(ge=0)] = 30
    poll_interval_s: Annotated[float, Field(gt=0, le=60)] = 0.25
    http_timeout_s: Seconds = 10


class SmokeSection(_Strict):
    prompt: Annotated[str, Field(min_length=1)] = "The capital of France is"
    max_new_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    latency_warning_s: Seconds = 2.0
    latency_critical_s: Seconds = 5.0
    accept_len_warning: Annotated[float, Field(ge=1)] = 1.5
    accept_len_critical: Annotated[float, Field(ge=1)] = 1.1
    golden: str | None = None


class ReleasesSection(_Strict):
    keep: Annotated[int, Field(ge=2, le=100)] = 5


class Profile(_Strict):
    name: str
    host: HostSection
    gpu: GpuSection
    service: ServiceSection
    memory: MemorySection
    known_good_mode: Mode = "nextn"
    modes: ModesSection
    gate: GateSection = GateSection()
    smoke: SmokeSection = SmokeSection()
    releases: ReleasesSection = ReleasesSection()
    # None: the service owns card 0 alone and the launch line says nothing about parallelism (as
    # before these sections existed); set, the launch line names its sizes and its cards
    parallel: ParallelSection | None = None
    gpus: Annotated[list[GpuCard], Field(min_length=1, max_length=64)] | None = None
    multinode: MultinodeSection | None = None

    @field_validator("gpus", mode="before")
    @classmethod
    def _card_indexes(cls, value: Any) -> Any:
        # `gpus: [0, 1]` is the short form of `gpus: [{index: 0}, {index: 1}]`
        if isinstance(value, list):
            return [{"index": v} if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    def mode(self, name: str) -> ModeConfig:
        cfg = {"nextn": self.modes.nextn, "dflash": self.modes.dflash,
               "ddtree-shadow": self.modes.ddtree_shadow}.get(name)
        if cfg is None:
            configured = ", ".join(self.configured_modes())
            raise ProfileError([f"{self.name}: mode {name!r} is not configured (configured: {configured})"])
        return cfg

    def configured_modes(self) -> list[str]:
        return [m for m, c in (("nextn", self.modes.nextn), ("dflash", self.modes.dflash),
                               ("ddtree-shadow", self.modes.ddtree_shadow)) if c is not None]

    @property
    def arch_number(self) -> int:
        return int(self.gpu.arch.removeprefix("sm_"))

    @property
    def sizes(self) -> ParallelSection:
        return self.parallel or ParallelSection()

    @property
    def nnodes(self) -> int:
        return self.multinode.nnodes if self.multinode else 1

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.sizes.world // self.nnodes)

    def cards(self) -> list[Card]:
        """The cards this service owns on this host, each with its facts; card 0 alone when the
        profile lists none (what SGLang uses with one rank and no CUDA_VISIBLE_DEVICES)."""
        g = self.gpu
        entries = self.gpus or [GpuCard(index=0)]
        return [Card(c.index, c.model or g.model, c.memory_mib or g.memory_mib, c.arch or g.arch) for c in entries]

    def resolved(self) -> dict[str, Any]:
        """The resolved profile as plain data, with mode keys as operators write them."""
        return self.model_dump(mode="json", by_alias=True)

    def sha256(self) -> str:
        """Hash of the resolved profile; secrets enter by reference, never by value."""
        canon = json.dumps(self.resolved(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()


# --------------------------------------------------------------------------- YAML with lines

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


def _compose(text: str, filename: str) -> Sourced:
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


def _merge(base: Sourced, over: Sourced) -> Sourced:
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


def _apply_overrides(src: Sourced, overrides: list[str]) -> Sourced:
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


# --------------------------------------------------------------------------- loading


def shipped_dir(name: str) -> Path:
    """`units` or `profiles` of the checkout, else the copy a wheel installs under
    <prefix>/share/ddtree-ops (pyproject's data-files), so an installed tool works without one."""
    checkout = Path(__file__).resolve().parent.parent / name
    if checkout.is_dir():
        return checkout
    return Path(sys.prefix) / "share" / "ddtree-ops" / name


def profiles_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--profiles, then $DDTREE_OPS_PROFILES, then ./profiles, then /etc/ddtree-ops/profiles, then
    the profiles shipped with the tool (the lab's ct129 and ct200)."""
    for candidate in (explicit, os.environ.get("DDTREE_OPS_PROFILES"), "profiles", "/etc/ddtree-ops/profiles"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return shipped_dir("profiles")


def available_hosts(directory: Path | None = None) -> list[str]:
    """Every host: those with a profile file, then the members of groups (inventory.py)."""
    from ddtree_ops.inventory import Inventory

    return Inventory.load(directory or profiles_dir()).hosts()


def _read(path: Path, shown: str) -> Sourced:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError([f"{shown}: cannot read ({exc.strerror})"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ProfileError([f"{shown}:{line} not valid UTF-8 (byte {raw[exc.start]:#04x})"]) from None
    return _compose(text, shown)


def load_profile(host: str, *, overrides: list[str] | None = None, directory: Path | None = None) -> Profile:
    """defaults.yaml, the host's groups, its own entry and file, then --set (the layering lives in
    inventory.py, beside the groups and inventories it reads)."""
    from ddtree_ops.inventory import Inventory

    return Inventory.load(directory or profiles_dir()).profile(host, overrides or [])


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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
        _ABS_PATH: "an absolute path",
        _ENV_NAME: "an environment variable name",
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


# --------------------------------------------------------------------------- cross-field rules

# facts/sglang-ddtree.md 7.3: sm_120 has no FA3 (SM 8x-9x only), no FA4 / trtllm (tcgen05, SM100/103 only)
_BACKEND_ARCH = {
    "fa3": (80, 90),
    "fa4": (100, 103),
    "trtllm_mha": (100, 103),
    "trtllm_mla": (100, 103),
    "cutlass_mla": (100, 103),
}
# Quantization schemes that need FP8/FP4 tensor cores (sm_89+ / sm_100+); sm_86 runs plain
# "fp8" checkpoints as weight-only Marlin, which is allowed.
_QUANT_MIN_ARCH = {"w8a8_fp8": 89, "modelopt_fp4": 100, "nvfp4": 100, "mxfp4": 100, "fp4": 100}


# flags `render.launch_argv` writes from profile keys: extra_args may not say them twice
_RENDERED_FLAGS = {
    "--model-path": "service.model_path", "--host": "service.listen_host", "--port": "service.port",
    "--mem-fraction-static": "memory.mem_fraction_static", "--context-length": "memory.context_length",
    "--max-running-requests": "memory.max_running_requests", "--attention-backend": "memory.attention_backend",
    "--served-model-name": "service.served_model_name", "--dtype": "memory.dtype",
    "--kv-cache-dtype": "memory.kv_cache_dtype", "--page-size": "memory.page_size",
    "--quantization": "memory.quantization", "--chunked-prefill-size": "memory.chunked_prefill_size",
    "--disable-cuda-graph": "memory.cuda_graph", "--cuda-graph-max-bs-decode": "memory.cuda_graph_max_bs",
    "--speculative-algorithm": "modes.<mode>.algorithm",
    "--speculative-draft-model-path": "modes.<mode>.draft_model_path",
    "--speculative-num-draft-tokens": "modes.<mode>.block_size / num_draft_tokens",
    "--speculative-num-steps": "modes.nextn.num_steps", "--speculative-eagle-topk": "modes.nextn.eagle_topk",
    "--speculative-draft-attention-backend": "modes.<mode>.draft_attention_backend",
    "--tp-size": "parallel.tp_size", "--tensor-parallel-size": "parallel.tp_size", "--tp": "parallel.tp_size",
    "--dp-size": "parallel.dp_size", "--data-parallel-size": "parallel.dp_size", "--dp": "parallel.dp_size",
    "--pp-size": "parallel.pp_size", "--pipeline-parallel-size": "parallel.pp_size",
    "--ep-size": "parallel.ep_size", "--expert-parallel-size": "parallel.ep_size", "--ep": "parallel.ep_size",
    "--nnodes": "multinode.nodes", "--node-rank": "multinode.nodes (the order)",
    "--dist-init-addr": "multinode.dist_init_host / dist_init_port",
    "--nccl-init-addr": "multinode.dist_init_host / dist_init_port", "--dist-timeout": "multinode.dist_timeout_s",
    "--base-gpu-id": "gpus", "--gpu-id-step": "gpus",
}


def check_rules(p: Profile) -> list[tuple[Loc, str]]:
    """Rules that span fields; each returns the key path to blame and why."""
    out: list[tuple[Loc, str]] = []
    arch = p.arch_number

    def backend_ok(loc: Loc, backend: str | None) -> None:
        if backend in _BACKEND_ARCH:
            lo, hi = _BACKEND_ARCH[backend]
            if not lo <= arch <= hi:
                out.append((loc, f"{backend!r} needs sm_{lo}..sm_{hi}; this host is {p.gpu.arch} "
                                 "(use flashinfer or triton)"))

    backend_ok(("memory", "attention_backend"), p.memory.attention_backend)
    for name in ("dflash", "ddtree-shadow"):
        cfg = {"dflash": p.modes.dflash, "ddtree-shadow": p.modes.ddtree_shadow}[name]
        if cfg is not None:
            backend_ok(("modes", name, "draft_attention_backend"), cfg.draft_attention_backend)
    q = p.memory.quantization
    if q and q in _QUANT_MIN_ARCH and arch < _QUANT_MIN_ARCH[q]:
        out.append((("memory", "quantization"),
                    f"{q!r} needs sm_{_QUANT_MIN_ARCH[q]}+ tensor cores; {p.gpu.arch} runs FP8 weight-only "
                    "(use 'fp8', which SGLang runs as W8A16 Marlin here)"))
    if p.gate.stay_healthy_s >= p.gate.startup_deadline_s:
        out.append((("gate", "stay_healthy_s"), "must be shorter than gate.startup_deadline_s"))
    if p.smoke.latency_warning_s > p.smoke.latency_critical_s:
        out.append((("smoke", "latency_warning_s"), "must not exceed smoke.latency_critical_s"))
    if p.smoke.accept_len_critical > p.smoke.accept_len_warning:
        out.append((("smoke", "accept_len_critical"), "must not exceed smoke.accept_len_warning"))
    if p.service.timeout_start_s < p.gate.startup_deadline_s:
        out.append((("service", "timeout_start_s"),
                    "must cover gate.startup_deadline_s, or systemd kills a start the gate still waits for"))
    if p.service.start_limit_interval_s <= p.service.restart_sec * p.service.start_limit_burst:
        out.append((("service", "start_limit_interval_s"),
                    "must exceed restart_sec x start_limit_burst, or the start limit never trips"))
    if p.host.transport == "ssh" and not p.host.ssh_host:
        out.append((("host", "ssh_host"), "required when host.transport is ssh (the ssh_config name of the host)"))
    rendered = _RENDERED_FLAGS
    for i, arg in enumerate(p.service.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in rendered:
            out.append((("service", "extra_args", str(i)), f"{flag} is rendered from {rendered[flag]}; set it there"))
    out += _parallel_rules(p)
    for name, ref in p.service.secrets.items():
        if ref.startswith("file:") and not ref[5:].startswith("/"):
            out.append((("service", "secrets", name), "file: references need an absolute path"))
    clash = set(p.service.env) & set(p.service.secrets)
    for name in sorted(clash):
        out.append((("service", "secrets", name), "also set in service.env; keep it in one place"))
    return out


def _parallel_rules(p: Profile) -> list[tuple[Loc, str]]:
    """SGLang's own rules for parallel sizes, checked before anything reaches a host (the model's
    head counts are checked at preflight, where its config.json is read)."""
    out: list[tuple[Loc, str]] = []
    z = p.sizes
    nn = p.nnodes
    where = ("parallel", "tp_size")
    if z.tp_size % z.ep_size:
        out.append((("parallel", "ep_size"), f"{z.ep_size} does not divide tp_size {z.tp_size}: experts are split "
                                             "inside the tensor-parallel group (SGLang: tp = ep x moe_dp x moe_tp)"))
    if p.multinode is not None:
        m = p.multinode
        if (z.tp_size * z.pp_size) % nn:
            out.append((where, f"tp_size x pp_size = {z.tp_size * z.pp_size} does not divide over the {nn} nodes of "
                               "multinode.nodes (SGLang: 'tp_size must be divisible by number of nodes')"))
        if z.dp_size > 1:
            out.append((("parallel", "dp_size"), "data-parallel replicas cannot span nodes (SGLang refuses --dp-size "
                                                 "with --nnodes > 1; deploy one service per replica)"))
        seen: set[str] = set()
        for i, node in enumerate(m.nodes):
            if node in seen:
                out.append((("multinode", "nodes", str(i)), f"{node!r} is listed twice"))
            seen.add(node)
        if not 0 <= m.node_rank < nn:
            out.append((("multinode", "node_rank"), f"{m.node_rank} is not a rank of {nn} nodes"))
    if z.world % nn:
        return out
    per_node = z.world // nn
    sizes = f"dp {z.dp_size} x tp {z.tp_size} x pp {z.pp_size} = {z.world} rank(s)" + (
        f" over {nn} nodes = {per_node} per node" if nn > 1 else "")
    if p.gpus is None:
        if per_node > 1:
            out.append((where, f"{sizes}: list the {per_node} cards each node gives the service in gpus "
                               f"(e.g. gpus: {list(range(per_node))})"))
        return out
    if len(p.gpus) != per_node:
        out.append((("gpus",), f"{len(p.gpus)} card(s) listed, but {sizes}: SGLang starts one rank per card"))
    seen_idx: dict[int, int] = {}
    for i, c in enumerate(p.gpus):
        if c.index in seen_idx:
            out.append((("gpus", str(i), "index"), f"card {c.index} is listed twice (also gpus.{seen_idx[c.index]})"))
        seen_idx.setdefault(c.index, i)
    archs = {c.arch for c in p.cards()}
    if len(archs) > 1:
        out.append((("gpus",), f"the cards mix architectures ({', '.join(sorted(archs))}): every rank runs the same "
                               "kernels and backends, so a service's cards share one"))
    elif archs and archs != {p.gpu.arch}:
        (arch,) = archs
        for loc, backend in [(("memory", "attention_backend"), p.memory.attention_backend)]:
            if backend in _BACKEND_ARCH and not _BACKEND_ARCH[backend][0] <= int(arch[3:]) <= _BACKEND_ARCH[backend][1]:
                out.append((loc, f"{backend!r} does not run on the service's {arch} cards (use flashinfer or triton)"))
    return out
