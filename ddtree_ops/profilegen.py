"""A host's facts to a profile's YAML, every value with a comment naming where it came from. Pure.

`profile init` asks the host once (`hostfacts`), and this module decides each key from what came
back: the GPU as the probe sees it, the SGLang interpreter, a running unit's launch line mapped
onto keys (`launchline`), the models and the drafts that fit them (`draftcheck`), memory settings
from SGLang's KV pool formula on the probed card (`memory`), and an attention backend the card's
architecture runs (`config.rules`). Each key says its source: detected, from the running unit,
given (a command-line option), from a group or profile (`--from`), derived, or default.

What cannot become a profile is a `Refusal`: nothing is written.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from ddtree_ops import memory
from ddtree_ops.config.inventory import Inventory
from ddtree_ops.config.layers import leaves, merge
from ddtree_ops.config.model import MODES, Profile
from ddtree_ops.config.rules import allowed_backends
from ddtree_ops.config.source import Loc, Sourced, display_path, read_file
from ddtree_ops.draftcheck import DFLASH_FAMILY, check_compat, check_target_layer_ids, judge_capture
from ddtree_ops.gpu import Gpu, card_verdicts
from ddtree_ops.hostfacts import HostFacts, ModelFiles, UnitFacts
from ddtree_ops.errors import UsageError, did_you_mean
from ddtree_ops.launchline import SECRET_NAME, FlagSpec, Mapped, compare, parse_env_file, split_launch, to_profile

DETECTED, RUNNING, GIVEN, DERIVED, DEFAULT = "detected", "from the running unit", "given", "derived", "default"
INIT_MAX_RUNNING_REQUESTS = 4  # init's own default: a few requests at the full context
MFS_BOUNDS = (0.5, 0.93)  # the fraction init derives stays inside these (SGLang's own picks do)


class Refusal(Exception):
    """What stops `profile init` before anything is written: `exit_code` 64 for bad input (a model
    that is not one, a draft that fits no mode), 3 for what the host lacks (a GPU, SGLang)."""

    def __init__(self, problems: list[str], exit_code: int = 64) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.exit_code = exit_code


@dataclass(frozen=True)
class Value:
    value: Any
    source: str  # DETECTED, RUNNING, GIVEN, DERIVED, DEFAULT, or "from <group or profile>"
    note: str = ""  # how, in a few words: the comment beside the key (long ones above it)


@dataclass
class Options:
    host: str
    ssh_host: str | None = None
    local: bool = False
    model: str | None = None
    drafts: list[str] = field(default_factory=list)
    from_name: str | None = None
    groups: list[str] = field(default_factory=list)  # the host's groups in the inventory (their layers are under the file)


@dataclass
class Draft:
    """A draft checkpoint and the modes it fits."""

    path: str
    family: str  # "dflash" | "eagle" | "" (not a draft)
    source: str
    fits: list[str] = field(default_factory=list)  # mode names
    why_not: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None


@dataclass
class Result:
    values: dict[Loc, Value]
    text: str
    mode: str
    running: UnitFacts | None
    mapped: Mapped | None
    warnings: list[str]
    drafts: list[Draft]
    plan: memory.MemoryPlan | None = None

    memory_how: str = ""  # how the memory settings were sized (the header's comment)

    def counts(self) -> dict[str, int]:
        """How many values came from each kind of source."""
        out: dict[str, int] = {}
        for v in self.values.values():
            key = v.source.split(" (")[0]
            out[key] = out.get(key, 0) + 1
        return out


# ------------------------------------------------------------------ layers (defaults, a group, --from)


def get(data: dict[str, Any], loc: Loc) -> Any:
    cur: Any = data
    for part in loc:
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _origin(layer: Sourced | None, loc: Loc, from_name: str | None) -> str:
    where = layer.origin.get(loc, "") if layer else ""
    root = layer.origin.get(("__root__",), "") if layer else ""
    if root and where.startswith(root + "/"):
        where = where[len(root) + 1:]  # profiles/groups/a6000.yaml:24 -> groups/a6000.yaml:24
    if from_name and where and "defaults.yaml" not in where:
        return f"from {from_name} ({where})"
    return f"{DEFAULT} ({where})" if where else DEFAULT


# ------------------------------------------------------------------ the decision


def build(opts: Options, facts: HostFacts, policy: Sourced, base: Sourced) -> Result:
    """Every key of the new profile from the host's facts, the options, and `policy` (the layers
    under it: defaults, and the group or profile of --from); `base` is what the inventory layers
    under the host's own file anyway, so keys equal to it are left out of the text."""
    warnings: list[str] = list(facts.errors)
    v: dict[Loc, Value] = {}
    unit = facts.serving()
    mapped = None
    if unit is not None and unit.argv:
        mapped = to_profile(split_launch(unit.argv, facts.spec), unit.env)
        if mapped.problems:
            raise Refusal([f"{unit.name} runs a launch line the profile cannot say: {p}" for p in mapped.problems])
    for other in facts.units:
        if other is not unit:
            warnings.append(f"{other.name} names SGLang but is {other.active or 'not loaded'}: not read"
                            + ("; deploy replaces it (service.unit)" if other.name == get(policy.data, ("service", "unit"))
                               and unit is None else ""))

    def pol(loc: Loc) -> Value | None:
        value = get(policy.data, loc)
        return None if value is None else Value(value, _origin(policy, loc, opts.from_name))

    def running(loc: Loc) -> Value | None:
        if mapped is None or loc not in mapped.values:
            return None
        return Value(mapped.values[loc], RUNNING)

    _host_section(v, opts)
    cards = _gpu_section(v, facts, mapped, unit, policy, warnings)
    _service_section(v, opts, facts, unit, mapped, pol, running)
    target = _target(v, facts)
    drafts = _drafts(opts, facts, target, mapped, policy, pol)
    mode = _modes(v, target, drafts, mapped, policy, unit, warnings, opts.from_name)
    plan, how = _memory_section(v, facts, target, drafts, cards, mapped, pol, running, warnings)
    _layered(v, policy, base, opts.from_name)
    text = render_yaml(opts, v, base, unit, how)
    return Result(v, text, mode, unit, mapped, warnings, drafts, plan, how)


def _host_section(v: dict[Loc, Value], opts: Options) -> None:
    if opts.local:
        v[("host", "transport")] = Value("local", GIVEN, "--local: the tool runs on this host")
        return
    if opts.ssh_host:
        v[("host", "ssh_host")] = Value(opts.ssh_host, GIVEN, "--ssh-host: its name in ssh_config")
    else:
        v[("host", "ssh_host")] = Value(opts.host, DEFAULT, "the host's name, as ssh_config knows it")


def _gpu_section(v: dict[Loc, Value], facts: HostFacts, mapped: Mapped | None, unit: UnitFacts | None,
                 policy: Sourced, warnings: list[str]) -> list[Gpu]:
    snap = facts.gpu
    if not snap.gpus:
        raise Refusal([f"no GPU visible on the host: {'; '.join(snap.errors) or 'the probe found none'}"], 3)
    service_unit = unit.name if unit else str(get(policy.data, ("service", "unit")) or "sglang.service")
    wanted: list[int] | None = list(mapped.values[("gpus",)]) if mapped and ("gpus",) in mapped.values else None
    indexes = wanted or [0]
    missing = [i for i in indexes if snap.card(i) is None]
    if missing:
        raise Refusal([f"the running unit uses card(s) {missing}, which the probe does not see "
                       f"(it sees {', '.join(str(g.index) for g in snap.gpus)})"], 3)
    verdicts = card_verdicts(snap, indexes, service_unit)
    if wanted is None and any(st == "fail" for st, _ in verdicts):
        usable = [g.index for g in snap.gpus if not any(st == "fail" for st, _ in card_verdicts(snap, [g.index], service_unit))]
        if not usable:
            raise Refusal([d for _, d in verdicts], 3)
        warnings += [d for _, d in verdicts]
        indexes = [usable[0]]
        v[("gpus",)] = Value(indexes, DERIVED, f"card 0 cannot be used ({verdicts[0][1].split(':')[0]}); the first "
                                               "usable card")
        verdicts = card_verdicts(snap, indexes, service_unit)
    elif wanted is not None:
        v[("gpus",)] = Value(wanted, RUNNING, "CUDA_VISIBLE_DEVICES / --base-gpu-id")
    warnings += [d for st, d in verdicts]
    for a in snap.strays(service_unit, indexes):
        warnings.append(f"pid {a.pid} {a.name or '?'} ({a.unit or 'no unit'}) holds {a.used_mib:,} MiB of a service "
                        "card: memory settings are sized with it taken (stop it, and `profile init --force` again, "
                        "for more)")
    first = snap.card(indexes[0])
    assert first is not None
    archs = {g.arch for i in indexes if (g := snap.card(i)) is not None}
    if len(archs) > 1:
        raise Refusal([f"the service's cards mix architectures ({', '.join(sorted(archs))})"], 3)
    how = f"via {snap.source}" + (f", card {first.index}" if first.index else "")
    v[("gpu", "model")] = Value(first.name, DETECTED, how)
    v[("gpu", "memory_mib")] = Value(first.memory_total_mib, DETECTED, how)
    v[("gpu", "arch")] = Value(first.arch, DETECTED, f"compute capability {first.compute_cap}")
    v[("gpu", "count")] = Value(len(snap.gpus), DETECTED, f"{len(snap.gpus)} card(s) on the host")
    return [g for i in indexes if (g := snap.card(i)) is not None]


def _service_section(v: dict[Loc, Value], opts: Options, facts: HostFacts, unit: UnitFacts | None,
                     mapped: Mapped | None, pol: Any, running: Any) -> None:
    if unit is not None:
        v[("service", "unit")] = Value(unit.name, RUNNING, f"serving now ({unit.argv_from})")
        v[("service", "user")] = Value(unit.user, RUNNING, "User=")
    else:
        v[("service", "unit")] = pol(("service", "unit")) or Value("sglang.service", DEFAULT)
    python = _python(facts, unit, mapped, pol)
    v[("service", "python")] = python
    given = opts.model
    if given:
        v[("service", "model_path")] = Value(given, GIVEN, "--model")
    elif running(("service", "model_path")):
        v[("service", "model_path")] = running(("service", "model_path"))
    elif (p := pol(("service", "model_path"))) is not None and p.value in facts.models \
            and not facts.models[p.value].error:
        v[("service", "model_path")] = p
    else:
        looked = f" ({p.value} from {opts.from_name} is not on the host)" if p is not None and opts.from_name else ""
        raise Refusal([f"no model to serve: no unit runs SGLang here{looked}; give the target with --model PATH"])
    for loc, unset in ((("service", "listen_host"), "127.0.0.1"), (("service", "port"), 30000),
                       (("service", "served_model_name"), None)):
        if mapped is not None:  # what the running line says, or what SGLang does when it says nothing
            v[loc] = running(loc) or Value(unset, RUNNING, "not given")
        elif (p := pol(loc)) is not None:
            v[loc] = p
    if mapped is not None:
        v[("service", "env")] = Value(dict(mapped.env), RUNNING, "Environment= and EnvironmentFile=")
        if mapped.secrets:
            v[("service", "secrets")] = Value(dict(mapped.secrets), RUNNING, "credentials by reference: set each "
                                                                            "variable where ddtree-ops runs")
        v[("service", "extra_args")] = Value(list(mapped.extra_args), RUNNING, "flags the profile has no key "
                                                                             "for, passed through as written")
    elif (p := pol(("service", "env"))) is not None and p.value:
        v[("service", "env")] = p


def _python(facts: HostFacts, unit: UnitFacts | None, mapped: Mapped | None, pol: Any) -> Value:
    have = {p.path: p for p in facts.pythons}
    if mapped is not None and mapped.python:
        found = have.get(mapped.python)
        version = f", sglang {found.sglang}" if found and found.sglang else ""
        return Value(mapped.python, RUNNING, f"ExecStart's interpreter{version}")
    chosen = facts.python
    if chosen is None:
        tried = [p for p in facts.pythons]
        seen = "; ".join(f"{p.path}: {'no sglang' if not p.error else p.error}" for p in tried) or "none exists"
        raise Refusal([f"no SGLang on the host: no interpreter has the sglang package (tried {seen}; looked in "
                       f"{', '.join(facts.looked)}). Install SGLang, or run `profile init` with --from a profile whose "
                       "service.python has it"], 3)
    p = pol(("service", "python"))
    if p is not None and p.value == chosen.path and p.source.startswith("from "):
        return Value(chosen.path, p.source, f"sglang {chosen.sglang} there")
    return Value(chosen.path, DETECTED, f"sglang {chosen.sglang}, python {chosen.python}")


def _target(v: dict[Loc, Value], facts: HostFacts) -> ModelFiles:
    path = v[("service", "model_path")].value
    model = facts.models.get(path)
    if model is None:
        raise Refusal([f"{path}: the host did not report it"])
    if model.error or model.config is None:
        raise Refusal([f"{path} is not a model: {model.error or 'no config.json'} (service.model_path is a directory "
                       "holding config.json and the weights)"])
    try:
        memory.model_shape(model.config)
    except ValueError as exc:
        raise Refusal([f"{path} is not a model SGLang can size: {path}/config.json: {exc}"]) from None
    return model


# keys init decides from the host, whatever --from says
_HOST_KEYS = ("name", "host", "gpu", "gpus", "multinode")


def _layered(v: dict[Loc, Value], policy: Sourced, base: Sourced, from_name: str | None) -> None:
    """The settings --from brings that init did not decide from the host (a mode's budget, the
    gate, smoke), as a group's settings layer under a host's own."""
    if not from_name:
        return
    dropped = [loc for loc, x in v.items() if x.value is None and loc[0] == "modes"]
    for loc, value in leaves(policy.data):
        if policy.origin.get(loc) == base.origin.get(loc) or loc[0] in _HOST_KEYS or loc in v:
            continue
        if any(loc[:len(d)] == d for d in dropped) or any(loc[:len(k)] == k for k in v if len(k) < len(loc)):
            continue
        v[loc] = Value(value, _origin(policy, loc, from_name))


# ------------------------------------------------------------------ drafts and modes


def draft_family(cfg: dict[str, Any]) -> str:
    """dflash: a DFlash block-diffusion draft; eagle: an EAGLE/NextN draft NEXTN runs; "" neither."""
    archs = " ".join(str(a) for a in cfg.get("architectures") or [])
    if isinstance(cfg.get("dflash_config"), dict) or "DFlash" in archs or "block_size" in cfg:
        return "dflash"
    if "Eagle3" in archs:
        return ""  # EAGLE-3 drafts need --speculative-algorithm EAGLE3, which no profile mode runs
    if any(w in archs for w in ("Eagle", "NextN", "MTP")):
        return "eagle"
    return ""


def has_mtp(cfg: dict[str, Any]) -> bool:
    """The checkpoint carries its own MTP layers: NEXTN runs it with no draft of its own."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        n = text.get(key, cfg.get(key))
        if isinstance(n, int) and n > 0:
            return True
    return False


def _dflash_modes(policy: Sourced) -> list[str]:
    """The profile's DFlash-family modes (defaults.yaml names them): a DFlash draft fits each."""
    modes = get(policy.data, ("modes",)) or {}
    return [name for name, cfg in modes.items()
            if isinstance(cfg, dict) and str(cfg.get("algorithm", "")).upper() in DFLASH_FAMILY]


def check_draft(d: Draft, target: ModelFiles, facts: HostFacts, dflash_modes: list[str], block: int) -> Draft:
    """Which modes a draft fits: its family, then draftcheck's rules against the target, then (for
    DFlash) whether the host's SGLang captures the target's hidden states."""
    if d.config is None:
        d.why_not.append("no readable config.json")
        return d
    d.family = draft_family(d.config)
    if not d.family:
        d.why_not.append(f"not a draft NEXTN, DFLASH or DDTREE runs ({', '.join(d.config.get('architectures') or ['?'])})")
        return d
    algo = "DFLASH" if d.family == "dflash" else "NEXTN"
    assert target.config is not None
    found = check_compat(d.config, target.config, algorithm=algo, num_draft_tokens=block if algo == "DFLASH" else None,
                         draft_key=d.path, target_key=target.path)
    d.why_not += [m.detail for m in found if m.status == "fail"]
    if d.family == "dflash":
        layers = check_target_layer_ids(d.config, target.config)
        if layers.status == "fail":
            d.why_not.append(layers.detail)
        cap = judge_capture(facts.capture.get(target.path), facts.python.sglang if facts.python else None,
                            list((facts.capture.get(target.path) or {}).get("architectures") or []),
                            target_key=target.path)
        if cap.status == "fail":
            d.why_not.append(cap.detail)
    if not d.why_not:
        d.fits = list(dflash_modes) if d.family == "dflash" else ["nextn"]
    return d


def _drafts(opts: Options, facts: HostFacts, target: ModelFiles, mapped: Mapped | None, policy: Sourced,
            pol: Any) -> list[Draft]:
    dflash_modes = _dflash_modes(policy)
    block = int(get(policy.data, ("modes", "dflash", "block_size")) or 16)
    out: list[Draft] = []
    seen: set[str] = set()

    def add(path: str, source: str, config: dict[str, Any] | None) -> Draft:
        d = check_draft(Draft(path, "", source, config=config), target, facts, dflash_modes, block)
        seen.add(path.rstrip("/"))
        out.append(d)
        return d

    for path in opts.drafts:
        m = facts.models.get(path)
        d = add(path, GIVEN, m.config if m else None)
        if m is None or m.error:
            raise Refusal([f"--draft {path}: {m.error if m else 'the host did not report it'}"])
        if not d.fits:
            raise Refusal([f"--draft {path} fits no mode: " + "; ".join(d.why_not)])
    if mapped is not None and mapped.mode:
        path = mapped.values.get(("modes", mapped.mode, "draft_model_path"))
        if path and path.rstrip("/") not in seen:
            m = facts.models.get(path)
            add(path, RUNNING, m.config if m else None)
    for name in ("nextn", *dflash_modes):
        p = pol(("modes", name, "draft_model_path"))
        if p is not None and p.value.rstrip("/") not in seen and p.value in facts.models and \
                not facts.models[p.value].error:
            add(p.value, p.source, facts.models[p.value].config)
    if not opts.drafts:
        for s in facts.siblings.get(target.path, []):
            if s.path.rstrip("/") not in seen and s.config is not None and draft_family(s.config):
                add(s.path, f"{DETECTED} (beside {target.path})", s.config)
    return out


def _modes(v: dict[Loc, Value], target: ModelFiles, drafts: list[Draft], mapped: Mapped | None, policy: Sourced,
           unit: UnitFacts | None, warnings: list[str], from_name: str | None) -> str:
    assert target.config is not None
    dflash_modes = _dflash_modes(policy)
    mtp = has_mtp(target.config)
    running_mode = mapped.mode if mapped else None
    for loc, value in (mapped.values.items() if mapped else ()):
        if loc[0] == "modes" and loc[-1] != "draft_model_path":
            v[loc] = Value(value, RUNNING)
    nextn = next((d for d in drafts if "nextn" in d.fits), None)
    if running_mode == "nextn":
        path = mapped.values.get(("modes", "nextn", "draft_model_path")) if mapped else None
        if path:
            v[("modes", "nextn", "draft_model_path")] = Value(path, RUNNING)
        nextn_ok = True
    elif nextn is not None and (not mtp or nextn.source == GIVEN):
        v[("modes", "nextn", "draft_model_path")] = Value(nextn.path, nextn.source, "an EAGLE draft of this model")
        nextn_ok = True
    else:  # the checkpoint's own MTP layers are NEXTN's draft when it has them
        nextn_ok = mtp
        v[("modes", "nextn", "draft_model_path")] = Value(None, DERIVED, (
            "the checkpoint has its own MTP layers" if mtp else
            "no MTP layers and no NEXTN draft found: NEXTN cannot serve this model"))
    dflash = next((d for d in drafts if d.family == "dflash" and d.fits), None)
    running_draft = None
    if running_mode in dflash_modes and mapped is not None:
        running_draft = mapped.values.get(("modes", running_mode, "draft_model_path"))
    for name in dflash_modes:
        if running_draft:
            v[("modes", name, "draft_model_path")] = Value(running_draft, RUNNING if name == running_mode else DERIVED,
                                                           "" if name == running_mode else f"the {running_mode} draft")
        elif dflash is not None:
            loc = ("modes", name, "draft_model_path")
            same = get(policy.data, loc) == dflash.path and dflash.source.startswith("from ")
            v[loc] = Value(dflash.path, _origin(policy, loc, dflash.source[5:].split(" (")[0]) if same else dflash.source,
                           _dflash_note(dflash))
            trained = _trained_block(dflash.config or {})
            if trained and trained != get(policy.data, ("modes", name, "block_size")) and \
                    ("modes", name, "block_size") not in v:
                v[("modes", name, "block_size")] = Value(trained, DETECTED, "the draft's trained block_size")
        else:
            v[("modes", name)] = Value(None, DERIVED, "no DFlash draft fits this model" + (
                f" ({'; '.join(d.path + ': ' + d.why_not[0] for d in drafts if d.family == 'dflash' and d.why_not)})"
                if any(d.family == "dflash" and d.why_not for d in drafts) else ""))
    for d in drafts:
        if d.why_not and d.source != GIVEN and d.family:
            warnings.append(f"draft {d.path} ({d.source}) fits no mode: {d.why_not[0]}")
    servable = ["nextn"] * nextn_ok + [n for n in dflash_modes if v.get(("modes", n), Value(0, "")).value is not None]
    chosen = get(policy.data, ("mode",))
    where = policy.origin.get(("mode",), "")
    if running_mode:
        mode, why = running_mode, f"{unit.name if unit else 'the unit'} serves {mapped.algorithm if mapped else ''} now"
    elif chosen in servable and where and "defaults.yaml" not in where:
        mode, why = str(chosen), ""
    elif nextn_ok:
        mode, why = "nextn", "the checkpoint has MTP layers" if mtp else "a NEXTN draft fits"
    elif "dflash" in servable:
        mode, why = "dflash", ("NEXTN cannot serve this model (no MTP layers, no NEXTN draft); DFLASH is SGLang's own "
                               "chain, no plugin")
    elif servable:
        mode, why = servable[0], "the one mode a draft fits"
    else:
        raise Refusal(["no mode can serve this model: the checkpoint has no MTP layers and no draft fits it"
                       + "".join(f"; {d.path}: {d.why_not[0]}" for d in drafts if d.why_not)
                       + " (give one with --draft PATH)"])
    source = RUNNING if running_mode else DERIVED if why else _origin(policy, ("mode",), from_name)
    v[("mode",)] = Value(mode, source, why)
    if running_mode and running_mode != "nextn":
        v[("known_good_mode",)] = Value(running_mode, RUNNING, "the running unit is the baseline failed changes "
                                                               "return to")
    elif not nextn_ok:
        v[("known_good_mode",)] = Value(mode, DERIVED, "NEXTN cannot serve here: failed changes roll back to this mode")
    return mode


def _trained_block(cfg: dict[str, Any]) -> int | None:
    dfl = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    block = dfl.get("block_size", cfg.get("block_size"))
    return block if isinstance(block, int) and not isinstance(block, bool) else None


def _dflash_note(d: Draft) -> str:
    dfl = (d.config or {}).get("dflash_config") or {}
    ids = dfl.get("target_layer_ids") if isinstance(dfl, dict) else None
    return f"a DFlash draft of this model{f', target layers {ids}' if ids else ''}"


# ------------------------------------------------------------------ memory


def _free_for_service(cards: list[Gpu], facts: HostFacts, unit_name: str) -> tuple[int, int]:
    """(the least free MiB a new server finds on the service's cards, the least total): what is
    free now plus what the service itself holds (a restart frees it), as preflight counts it."""
    free, total = [], []
    for g in cards:
        ours = sum(a.used_mib for a in facts.gpu.apps_on(g.index) if a.unit == unit_name)
        free.append(min(g.memory_total_mib, g.memory_free_mib + ours))
        total.append(g.memory_total_mib)
    return min(free), min(total)


# what a launch line that does not give a flag means, as the profile key that renders nothing
_NOT_GIVEN = {"dtype": "auto", "kv_cache_dtype": "auto", "page_size": 1, "quantization": None,
              "chunked_prefill_size": None, "cuda_graph": True, "cuda_graph_max_bs": None}


def _memory_section(v: dict[Loc, Value], facts: HostFacts, target: ModelFiles, drafts: list[Draft], cards: list[Gpu],
                    mapped: Mapped | None, pol: Any, running: Any,
                    warnings: list[str]) -> tuple[memory.MemoryPlan, str]:
    assert target.config is not None
    arch = int(cards[0].arch.removeprefix("sm_"))
    for key, unset in _NOT_GIVEN.items():
        loc = ("memory", key)
        if mapped is not None:
            v[loc] = running(loc) or Value(unset, RUNNING, "not given" + (": SGLang picks it" if unset is None else ""))
        elif (p := pol(loc)) is not None and "defaults.yaml" not in p.source:
            v[loc] = p
    for loc in (("parallel", "tp_size"), ("parallel", "dp_size"), ("parallel", "pp_size"), ("parallel", "ep_size")):
        if running(loc) is not None:
            v[loc] = running(loc)
    backends = allowed_backends(arch)
    loc = ("memory", "attention_backend")
    if running(loc) is not None:
        v[loc] = running(loc)
    elif (p := pol(loc)) is not None and p.value in backends:
        v[loc] = p
    else:
        pick = "fa3" if arch == 90 else "flashinfer"
        v[loc] = Value(pick, DERIVED, f"{cards[0].arch} runs {', '.join(backends)}")
    mrr = running(("memory", "max_running_requests")) or pol(("memory", "max_running_requests")) or Value(
        INIT_MAX_RUNNING_REQUESTS, DEFAULT, "init's: a few requests at the full context")
    v[("memory", "max_running_requests")] = mrr
    tp = int(v.get(("parallel", "tp_size"), Value(1, "")).value)
    pp = int(v.get(("parallel", "pp_size"), Value(1, "")).value)
    unit_name = str(v[("service", "unit")].value)
    free, total = _free_for_service(cards, facts, unit_name)
    weights = memory.weights_bytes(target.config, target.index, target.weight_bytes)
    shape = memory.model_shape(target.config)
    biggest = _biggest_draft(v, drafts, shape)
    kv = str(v.get(("memory", "kv_cache_dtype"), Value("auto", "")).value or "auto")
    page = int(v.get(("memory", "page_size"), Value(1, "")).value or 1)
    gbs = v.get(("memory", "cuda_graph_max_bs"), Value(8, "")).value
    chunked = v.get(("memory", "chunked_prefill_size"), Value(None, "")).value

    def plan_at(mfs: float, ctx: int) -> memory.MemoryPlan:
        return memory.plan(gpu_total_mib=total, free_mib=free, target=shape, weights=weights,
                           draft_cell=biggest[0].cell_bytes(kv, tp) if biggest else 0,
                           draft_weights=biggest[1] if biggest else 0, mem_fraction_static=mfs,
                           context_length=ctx, concurrency=int(mrr.value), kv_cache_dtype=kv, page_size=page,
                           speculative=True, cuda_graph_max_bs=int(gbs or 0), chunked_prefill=chunked, tp=tp, pp=pp,
                           cards=len(cards))

    model_ctx = memory.model_context_length(target.config)
    mfs_v = running(("memory", "mem_fraction_static"))
    ctx_v = running(("memory", "context_length"))
    if mfs_v is None and mapped is None:
        p = pol(("memory", "mem_fraction_static"))
        mfs_v = p if p is not None and "defaults.yaml" not in p.source else None
    if ctx_v is None and mapped is None:
        p = pol(("memory", "context_length"))
        ctx_v = p if p is not None and "defaults.yaml" not in p.source else None
    derived_mfs = _derive_fraction(total, free, gbs, chunked)
    mfs = float(mfs_v.value) if mfs_v is not None else derived_mfs
    if ctx_v is None:
        ctx_v = _derive_context(plan_at(mfs, 1).tokens, int(mrr.value), model_ctx, page)
    plan = plan_at(mfs, int(ctx_v.value))
    if plan.problems and mfs_v is not None and mfs_v.source != RUNNING:
        warnings.append(f"{mfs_v.source}: mem_fraction_static {mfs_v.value} with context {ctx_v.value} does not "
                        f"fit this card ({plan.problems[0]}); derived from the card instead")
        mfs_v, mfs = None, derived_mfs
        ctx_v = _derive_context(plan_at(mfs, 1).tokens, int(mrr.value), model_ctx, page)
        plan = plan_at(mfs, int(ctx_v.value))
    if plan.tokens <= 0:
        raise Refusal([f"the model does not fit this card: {plan.problems[0]}"
                       + (f"; would fit: {'; or '.join(plan.suggestions)}" if plan.suggestions else
                          "; it needs more cards (parallel.tp_size with gpus)")], 64)
    if ctx_v.value < 256:
        raise Refusal([f"the KV pool holds {plan.tokens:,} tokens: less than 256 per request at "
                       f"{mrr.value} requests ({plan.summary()})"])
    how = (f"SGLang's KV pool formula on {cards[0].name} ({free:,} MiB free for the service"
           + (f", the least of {len(cards)} cards" if len(cards) > 1 else "") + f"): {plan.summary()}"
           + (f", with the largest draft ({biggest[2]})" if biggest else ""))
    if mfs_v is None:
        v[("memory", "mem_fraction_static")] = Value(mfs, DERIVED, "the largest fraction that leaves SGLang's "
                                                     f"own runtime reserve ({plan.reserve_gib:.1f} GiB) on this card")
    else:
        v[("memory", "mem_fraction_static")] = mfs_v
    v[("memory", "context_length")] = ctx_v if ctx_v.source != DERIVED else Value(ctx_v.value, DERIVED, ctx_v.note)
    if plan.problems:
        warnings.append(f"memory ({v[('memory', 'mem_fraction_static')].source}): {plan.problems[0]}; preflight "
                        f"will refuse it. Would fit: {'; or '.join(plan.suggestions) or 'a smaller model'}")
    elif plan.warnings:
        warnings.append("memory: " + " ".join(plan.warnings))
    return plan, how


def _biggest_draft(v: dict[Loc, Value], drafts: list[Draft], target: memory.ModelShape) \
        -> tuple[memory.ModelShape, int, str] | None:
    """The draft that takes the most memory among those the profile configures: every mode shares
    the memory settings, so they must fit with it."""
    configured = {str(x.value) for loc, x in v.items() if loc[-1] == "draft_model_path" and x.value}
    best = None
    for d in drafts:
        if d.path in configured and d.config:
            try:
                shape, weights = memory.model_shape(d.config), memory.draft_weights_bytes(d.config, target)
            except ValueError:
                continue
            if best is None or (weights, shape.cell_bytes()) > (best[1], best[0].cell_bytes()):
                best = (shape, weights, d.path)
    return best


def _derive_fraction(total: int, free: int, graph_bs: Any, chunked: Any) -> float:
    """The largest mem_fraction_static that leaves SGLang's own runtime reserve (its default
    heuristic, memory.sglang_reserved_mib) free for activations and CUDA graphs."""
    reserve = memory.sglang_reserved_mib(total, speculative=True, cuda_graph_max_bs=int(graph_bs or 0),
                                         chunked_prefill=chunked)
    pre = max(free - memory.CUDA_CONTEXT_MIB, 1)
    raw = math.floor((1 - reserve / pre) * 100) / 100
    return min(max(raw, MFS_BOUNDS[0]), MFS_BOUNDS[1])


def _derive_context(tokens: int, requests: int, model_ctx: int | None, page: int) -> Value:
    """The model's own context when the pool holds it for every request, else the most that fits
    (a multiple of 1024)."""
    per = tokens // max(requests, 1)
    if model_ctx and per >= model_ctx:
        return Value(model_ctx, DERIVED, f"the model's own context (config.json); {requests} requests fit")
    ctx = per // 1024 * 1024 if per >= 1024 else per // max(page, 1) * max(page, 1)
    why = f"the model's {model_ctx:,} do not fit {requests} requests" if model_ctx else "config.json names no context"
    return Value(ctx, DERIVED, f"what the KV pool holds per request ({tokens:,} / {requests}); {why}")


# ------------------------------------------------------------------ the text


ORDER: tuple[Loc, ...] = (
    ("host", "transport"), ("host", "ssh_host"),
    ("gpu", "model"), ("gpu", "memory_mib"), ("gpu", "arch"), ("gpu", "count"), ("gpus",),
    ("service", "unit"), ("service", "user"), ("service", "python"), ("service", "model_path"),
    ("service", "served_model_name"), ("service", "listen_host"), ("service", "port"), ("service", "env"),
    ("service", "secrets"), ("service", "extra_args"),
    ("memory", "mem_fraction_static"), ("memory", "context_length"), ("memory", "max_running_requests"),
    ("memory", "attention_backend"),
)
# written even when the layers under the file say the same: a new host's profile shows where its
# launch line comes from
ESSENTIAL = frozenset(ORDER) | {("mode",)}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    return yaml.safe_dump([value], default_flow_style=True, width=1 << 20).strip()[1:-1]


def _comment(x: Value) -> str:
    return x.source + (f": {x.note}" if x.note else "")


def render_yaml(opts: Options, v: dict[Loc, Value], base: Sourced, unit: UnitFacts | None, memory_how: str) -> str:
    """The profile's text: sections in the order of the shipped profiles, every value with its
    source; keys the layers under the file already set alike are left out (named in the header)."""
    only_defaults = not opts.groups
    kept: dict[Loc, Value] = {}
    same: list[str] = []
    for loc, x in v.items():
        if get(base.data, loc) == x.value and x.value is not None and not (only_defaults and loc in ESSENTIAL):
            same.append(".".join(loc))
            continue
        if x.value in (None, [], {}) and not get(base.data, loc) and loc[0] != "modes":
            continue
        kept[loc] = x
    order = {loc: i for i, loc in enumerate(ORDER)}
    locs = sorted(kept, key=lambda loc: (order.get(loc, len(ORDER)), _section_rank(loc)))
    lines = [f"# {opts.host}: written by `ddtree-ops profile init {opts.host}` from what the host reported "
             f"(one round trip).",
             "# Each value's comment names its source: detected (the host's GPU, interpreter, files), "
             "from the running unit,",
             "# given (a command-line option), from a group or profile (--from), derived (below), or default."]
    if unit is not None:
        lines.append(f"# The running unit {unit.name} is the known-good baseline the first deploy adopts.")
    if same:
        lines += _wrap(f"Set alike in the layers under this file ({', '.join(['defaults.yaml', *opts.groups])}), "
                       f"so not repeated here: {', '.join(same)}.")
    if memory_how:
        lines += _wrap(f"memory fits: {memory_how}")
    lines.append("")
    written: list[Loc] = []
    for loc in locs:
        _emit(lines, written, loc, kept[loc])
    return "\n".join(lines).rstrip() + "\n"


def _section_rank(loc: Loc) -> tuple[int, int, str]:
    top = ("host", "gpu", "gpus", "service", "memory", "parallel", "mode", "known_good_mode", "modes")
    mode = MODES.index(loc[1]) if loc[0] == "modes" and len(loc) > 1 and loc[1] in MODES else len(MODES)
    return (top.index(loc[0]) if loc[0] in top else len(top), mode, ".".join(loc))


def _wrap(text: str, indent: str = "", width: int = 110) -> list[str]:
    out: list[str] = []
    line = f"{indent}#"
    for word in text.split():
        if len(line) + 1 + len(word) > width and line.strip() != "#":
            out.append(line)
            line = f"{indent}#"
        line += " " + word
    out.append(line)
    return out


def _emit(lines: list[str], written: list[Loc], loc: Loc, x: Value) -> None:
    # open the sections this key sits in that the lines above have not opened
    for depth in range(len(loc) - 1):
        prefix = loc[:depth + 1]
        if not any(w[:depth + 1] == prefix for w in written):
            if depth == 0 and lines and lines[-1] != "":
                lines.append("")
            lines.append("  " * depth + f"{loc[depth]}:")
    written.append(loc)
    indent = "  " * (len(loc) - 1)
    comment = _comment(x)
    if isinstance(x.value, dict):
        lines += _wrap(comment, indent)
        lines.append(f"{indent}{loc[-1]}:" + (" {}" if not x.value else ""))
        lines += [f"{indent}  {k}: {_scalar(str(val))}  # {x.source}" for k, val in x.value.items()]
        return
    if len(loc) == 1 and lines and lines[-1] != "":
        lines.append("")
    head = f"{indent}{loc[-1]}: {_scalar(x.value)}"
    if len(head) + len(comment) + 4 <= 120:
        lines.append(f"{head}  # {comment}")
    else:
        lines += _wrap(comment, indent)
        lines.append(head)


# ------------------------------------------------------------------ the layers under the new file


def layers(inv: Inventory, host: str, from_name: str | None) -> tuple[Sourced, Sourced, list[str]]:
    """(base, policy, groups). base: what the inventory layers under profiles/HOST.yaml anyway
    (defaults, the host's groups and its own entries when it is listed); policy: base with --from
    layered over it, as a group's settings layer (a group: its parents, then it; a profile: all of
    its layers but its host section). groups: the host's groups that carry settings."""
    defaults = inv.directory / "defaults.yaml"
    base = read_file(defaults, display_path(defaults)) if defaults.is_file() else Sourced()
    groups = [g for g in inv.groups_of(host) if inv.groups[g].settings] if host in inv.hosts() else []
    for g in groups:
        for layer in inv.groups[g].settings:
            base = merge(base, layer)
    for layer in inv.entries.get(host, []):
        base = merge(base, layer)
    root = display_path(inv.directory)
    base.origin[("__root__",)] = root
    if not from_name:
        return base, base, groups
    if inv.is_group(from_name):
        chain = _ancestors(inv, from_name) + [from_name]
        over = Sourced()
        for g in chain:
            for layer in inv.groups[g].settings if g in inv.groups else []:
                over = merge(over, layer)
    elif from_name in inv.hosts():
        full = inv.sourced(from_name)
        over = Sourced({k: val for k, val in full.data.items() if k not in ("name", "host", "gpus", "multinode")},
                       {loc: w for loc, w in full.origin.items() if loc and loc[0] not in ("name", "host", "gpus")})
    else:
        raise UsageError(f"--from {from_name}: no such group or profile{did_you_mean(from_name, [*inv.groups, *inv.hosts()])} "
                         f"(groups: {', '.join(sorted(inv.groups)) or 'none'})")
    policy = merge(base, over)
    policy.origin[("__root__",)] = root
    return base, policy, groups


def _ancestors(inv: Inventory, group: str) -> list[str]:
    """The groups above `group` (whose children lead to it), parents first."""
    parents = {c: [g.name for g in inv.groups.values() if c in g.children] for c in inv.groups}
    out: list[str] = []

    def up(name: str, trail: tuple[str, ...]) -> None:
        for p in parents.get(name, []):
            if p not in trail:
                up(p, trail + (p,))
                if p not in out:
                    out.append(p)

    up(group, (group,))
    return out


def validated(inv: Inventory, host: str, text: str, where: Path) -> Profile:
    """The new text as profiles/HOST.yaml over the layers under it, validated as every profile is
    (a file at `where`, outside the profiles directory's *.yaml: nothing else sees it)."""
    where.write_text(text, encoding="utf-8")
    inv.host_files[host] = where
    inv.listed.setdefault(host, display_path(where))
    return inv.profile(host)


def write_profile(path: Path, text: str) -> None:
    """Beside, then renamed: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------ the new profile against the running unit


def compare_running(unit: UnitFacts, rendered_argv: Sequence[str], rendered_env: str,
                    spec: list[FlagSpec] | None) -> tuple[bool, list[str], list[str]]:
    """(identical argv, how the rendered argv differs flag by flag, how the environment differs)
    between the running unit and the new profile's render of its mode. Secret values never show."""
    argv_diff = compare(unit.argv or [], rendered_argv, spec)
    new_env = parse_env_file(rendered_env)
    env_diff: list[str] = []
    for name in dict.fromkeys([*unit.env, *new_env]):
        old, new = unit.env.get(name), new_env.get(name)
        if old == new:
            continue
        secret = bool(SECRET_NAME.search(name))
        if secret and old is not None and new is not None:
            continue  # a credential by reference: its value is not compared, nor shown

        def show(x: str | None) -> str:
            return "(not set)" if x is None else f"{name}=<redacted>" if secret else f"{name}={x}"

        env_diff.append(f"+ {show(new)}" if old is None else f"- {show(old)}" if new is None
                        else f"~ {show(old)}  ->  {show(new)}")
    return tuple(unit.argv or ()) == tuple(rendered_argv), argv_diff, env_diff


def hints(policy: Sourced) -> dict[str, list[str]]:
    """What the layers under the new file name on the host (a group's model, drafts and
    interpreter), for the facts script to look at beside what it finds itself."""
    modes = get(policy.data, ("modes",)) or {}
    drafts = [str(m["draft_model_path"]) for m in modes.values() if isinstance(m, dict) and m.get("draft_model_path")]
    model, python = get(policy.data, ("service", "model_path")), get(policy.data, ("service", "python"))
    return {"models": [str(model)] if model else [], "drafts": list(dict.fromkeys(drafts)),
            "pythons": [str(python)] if python else []}
