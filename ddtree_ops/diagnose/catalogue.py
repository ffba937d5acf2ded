"""The signature catalogue: its schema, its parsing, and the search structures built from it.

`catalogue.yaml` holds every rule (patterns, label, severity, role, where it may be raised) and
every word an operator reads (meaning, remedy, the variants a resolver chooses between, the
findings the scanner derives from several lines). This module checks it and turns it into
frozen `Rule`s; `screen_for` / `index_for` / `lookback_rx` build the keyword screen, the keyword
index and the start/stop look-back regex once per catalogue.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ddtree_ops.diagnose import journal
from ddtree_ops.diagnose.context import RESOLVERS
from ddtree_ops.diagnose.fingerprint import Component
from ddtree_ops.diagnose.screen import (CatalogueError, HyperscanKeywordIndex, HyperscanScreen, KeywordIndex, Screen,
                                        best_literal_set, build_screen, digit_sensitive, keyword_index, literal_options,
                                        plan_screen, trie_regex)

LABELS = (
    "healthy", "benign_warning", "kv_pool_too_small", "cuda_oom", "host_oom", "cuda_lib_load",
    "abi_mismatch", "cuda_driver_incompatible", "unsupported_gpu_arch", "cuda_graph_capture",
    "illegal_memory_access", "nccl_error", "watchdog_timeout", "port_bind_error", "model_not_found",
    "hf_download_blocked", "tokenizer_error", "spec_decode_misconfig", "flashinfer_jit_error",
    "triton_compile_error", "hidden_capture_missing", "bad_launch_flags", "unclassified_crash",
    # added with issues 11 and 12 (what the field shows and the first list lacked)
    "shadow_accounting_off", "device_assert", "native_abort", "kernel_op_missing",
    "remote_code_module_missing", "req_slots_exhausted", "kv_exhausted_serving",
    # added with issue 20: a SIGKILL whose sender the log does not name is not host OOM
    "killed_by_signal",
)
SEVERITIES = ("fatal", "warning", "benign", "info")
ROLES = ("cause", "wrapper", "downstream", "consequence", "death", "backstop", "benign", "info")
DIRECTIONS = (None, "raise", "lower")
CONTEXTS = (None, "launch", "start", "stop", "capture_on", "capture_off", "plugin_seen")
XID_VARIANTS = ("hardware", "application")  # a rule with xid_hardware words both cases

# Keywords the engine itself needs besides the catalogue's: a traceback's header, and a decode
# report at 1.00 (found as a whole needle: its bytes are those of every healthy decode line).
ACCEPT = "accept len: "
ACCEPT_NEEDLE = "accept len: 1.0"
EXTRA_KEYWORDS = (journal.TRACEBACK_HEADER, "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Variant:
    """One way a rule (or a derived finding) reads: what a resolver picked, or an Xid's class."""

    name: str
    label: str
    meaning: str = ""
    remedy: str = ""
    direction: str | None = None
    profile_key: str | None = None
    severity: str = "fatal"

    def filled(self, facts: dict[str, str]) -> tuple[str, str]:
        """The meaning and remedy with their {placeholders} filled from `facts`."""
        return _fill(self.meaning, facts), _fill(self.remedy, facts)


def _fill(text: str, facts: dict[str, str]) -> str:
    return text.format_map(_Facts(facts)) if "{" in text else text


class _Facts(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return ""


@dataclass(frozen=True)
class Rule:
    id: str
    label: str
    severity: str
    role: str
    patterns: tuple[str, ...]
    order: int
    meaning: str = ""
    remedy: str = ""
    direction: str | None = None
    profile_key: str | None = None
    references: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()  # any frame of the traceback holds one of these
    raised_in: tuple[str, ...] = ()  # a frame that raised (innermost two, innermost engine frame) holds one
    defer_within: int = 0
    # a benign record whose logger attaches a traceback (logger.exception): an exception no rule
    # names, in the traceback that starts on the next line, is part of this harmless record
    covers_traceback: bool = False
    xid_hardware: frozenset[int] = frozenset()
    context: str | None = None  # what the line tells about the start (CONTEXTS)
    resolve: str | None = None  # a function that names the cause from the context (context.RESOLVERS)
    variants: tuple[Variant, ...] = ()  # what `resolve` (or the Xid class) chooses between
    literals: tuple[str, ...] = ()  # any-of: a line matching any pattern holds one of these
    digit_sensitive: bool = False  # a pattern can tell lines apart that differ only in digits
    sensitive_literals: tuple[str, ...] = ()  # the keywords of those patterns (a line without them is safe)

    def search(self, text: str) -> re.Match[str] | None:
        for rx in _compiled(self.patterns):
            m = rx.search(text)
            if m:
                return m
        return None

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    @property
    def plain(self) -> bool:
        """Its finding depends on the line's text alone (so the decision can be memoised)."""
        return (self.severity != "info" and not self.xid_hardware and self.context is None
                and self.resolve is None and not self.frames and not self.raised_in)


@cache
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


# Not valid in POSIX ERE or ambiguous between Python and grep -E.
_NON_PORTABLE = re.compile(r"\\[dDsSwWbBAZ0-9]|\(\?|\*\?|\+\?|\?\?|\}\?")


@dataclass(frozen=True)
class Catalogue:
    rules: tuple[Rule, ...]
    version: int = 1
    anchors: tuple[str, ...] = ()  # the keyword screen's anchor bytes (see screen.plan_screen)
    derived: tuple[tuple[str, Variant], ...] = ()  # findings the scanner builds from several lines
    algorithm_checks: tuple[tuple[str, str], ...] = ()  # speculative algorithm -> what to check
    flag_keys: tuple[tuple[str, str], ...] = ()  # SGLang argument (normalised) -> the profile key that renders it
    components: tuple[Component, ...] = ()  # what an unnamed failure is described by (fingerprint.py)
    build_summary: tuple[str, ...] = ()  # a build tool's report of a child's exit status (a wrapper)
    build_cause: tuple[str, ...] = ()  # the compiler's, linker's or shell's own error line above it
    screen_kind: str = "auto"  # the keyword screen to build: auto (Hyperscan where installed), python, hyperscan

    @property
    def by_id(self) -> dict[str, Rule]:
        return {r.id: r for r in self.rules}

    def patterns(self) -> list[str]:
        """Every pattern, in priority order."""
        return [p for r in self.rules for p in r.patterns]

    def derived_finding(self, rule_id: str) -> Variant:
        return next(v for k, v in self.derived if k == rule_id)

    def key_of(self, flag: str) -> str | None:
        """The profile key behind an SGLang argument (`--context-length`, `context_length`)."""
        return _flag_table(self.flag_keys).get(normal_flag(flag))

    def algorithm_check(self, algorithm: str) -> str:
        table = dict(self.algorithm_checks)
        return table.get(algorithm.upper()) or table.get("DEFAULT", "")


def normal_flag(flag: str) -> str:
    return flag.strip().lstrip("-").replace("-", "_").lower()


@lru_cache(maxsize=4)
def _flag_table(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(pairs)


def _variant(raw: Any, name: str, where: str, base: dict[str, Any], facts: tuple[str, ...]) -> Variant:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: variant {name!r} must be a mapping")
    label = raw.get("label", base.get("label"))
    if label not in LABELS:
        raise CatalogueError(f"{where}: variant {name!r} label {label!r} is not one of the fixed labels")
    severity = raw.get("severity", base.get("severity", "fatal"))
    if severity not in SEVERITIES:
        raise CatalogueError(f"{where}: variant {name!r} severity must be one of {', '.join(SEVERITIES)}")
    remedy = raw.get("remedy") or base.get("remedy") or {}
    if remedy.get("direction") not in DIRECTIONS:
        raise CatalogueError(f"{where}: variant {name!r} remedy.direction must be raise, lower or null")
    meaning = " ".join(str(raw.get("meaning", base.get("meaning", ""))).split())
    text = " ".join(str(remedy.get("text", "")).split())
    for part in (meaning, text):
        try:
            used = {f for _, f, _, _ in string.Formatter().parse(part) if f}
        except ValueError as exc:
            raise CatalogueError(f"{where}: variant {name!r}: {exc}") from None
        unknown = used - set(facts)
        if unknown:
            raise CatalogueError(f"{where}: variant {name!r} uses {sorted(unknown)}; it may use {list(facts) or 'none'}")
    return Variant(name=name, label=label, meaning=meaning, remedy=text, direction=remedy.get("direction"),
                   profile_key=remedy.get("profile_key"), severity=severity)


def _rule(raw: dict[str, Any], order: int) -> Rule:
    where = f"rule {raw.get('id', f'#{order}')!r}"
    for key in ("id", "label", "severity", "role", "patterns"):
        if key not in raw:
            raise CatalogueError(f"{where}: missing {key!r}")
    if raw["label"] not in LABELS:
        raise CatalogueError(f"{where}: label {raw['label']!r} is not one of the fixed labels")
    if raw["severity"] not in SEVERITIES:
        raise CatalogueError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    if raw["role"] not in ROLES:
        raise CatalogueError(f"{where}: role must be one of {', '.join(ROLES)}")
    if raw.get("context") not in CONTEXTS:
        raise CatalogueError(f"{where}: context must be one of {', '.join(c for c in CONTEXTS if c)}")
    if raw.get("resolve") is not None and raw["resolve"] not in RESOLVERS:
        raise CatalogueError(f"{where}: resolve must be one of {', '.join(RESOLVERS)}")
    if raw.get("covers_traceback") and raw["role"] != "benign":
        raise CatalogueError(f"{where}: covers_traceback is for benign rules only")
    patterns = raw["patterns"]
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise CatalogueError(f"{where}: patterns must be a non-empty list of strings")
    for p in patterns:
        if _NON_PORTABLE.search(p):
            raise CatalogueError(f"{where}: pattern {p!r} uses syntax outside the Python/ERE subset")
        try:
            re.compile(p)
        except re.error as exc:
            raise CatalogueError(f"{where}: pattern {p!r} does not compile: {exc}") from None
        literal_options(p)
    remedy = raw.get("remedy") or {}
    if remedy.get("direction") not in DIRECTIONS:
        raise CatalogueError(f"{where}: remedy.direction must be raise, lower or null")
    variants = _rule_variants(raw, where)
    return Rule(
        id=str(raw["id"]), label=raw["label"], severity=raw["severity"], role=raw["role"],
        patterns=tuple(patterns), order=order, meaning=" ".join(str(raw.get("meaning", "")).split()),
        remedy=" ".join(str(remedy.get("text", "")).split()), direction=remedy.get("direction"),
        profile_key=remedy.get("profile_key"), references=tuple(str(r) for r in raw.get("references", [])),
        frames=tuple(raw.get("frames", [])), raised_in=tuple(raw.get("raised_in", [])),
        defer_within=int(raw.get("defer_within", 0)),
        covers_traceback=bool(raw.get("covers_traceback", False)),
        xid_hardware=frozenset(int(x) for x in raw.get("xid_hardware", [])),
        context=raw.get("context"), resolve=raw.get("resolve"), variants=variants,
        digit_sensitive=any(digit_sensitive(p) for p in patterns),
    )


def _rule_variants(raw: dict[str, Any], where: str) -> tuple[Variant, ...]:
    """A rule's variants: exactly the names its resolver (or the Xid class) may pick."""
    got = raw.get("variants") or {}
    if not isinstance(got, dict):
        raise CatalogueError(f"{where}: variants must be a mapping of name -> variant")
    if raw.get("resolve") is not None:
        _, names, facts = RESOLVERS[raw["resolve"]]
    elif raw.get("xid_hardware"):
        names, facts = XID_VARIANTS, ("code",)
    else:
        names, facts = (), ()
    if set(got) != set(names):
        raise CatalogueError(f"{where}: variants must be exactly {list(names) or 'none'} (got {sorted(got)})")
    return tuple(_variant(got[n], n, where, raw, facts) for n in names)


def parse_catalogue(text: str, screen_kind: str = "auto") -> Catalogue:
    import yaml  # heavy: only when a catalogue is parsed (once per process)

    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml when present
    except yaml.YAMLError as exc:
        raise CatalogueError(f"catalogue is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise CatalogueError("catalogue must be a mapping with a 'rules' list")
    rules = tuple(_rule(raw, i) for i, raw in enumerate(doc["rules"]))
    seen: set[str] = set()
    for r in rules:
        if r.id in seen:
            raise CatalogueError(f"rule id {r.id!r} appears twice")
        seen.add(r.id)
    derived = _derived(doc.get("derived") or {}, seen)
    checks = doc.get("algorithm_checks") or {}
    if not isinstance(checks, dict) or not all(isinstance(v, str) for v in checks.values()):
        raise CatalogueError("algorithm_checks must map an algorithm name to a text")
    flags = doc.get("flag_keys") or {}
    if not isinstance(flags, dict) or not all(isinstance(v, str) for v in flags.values()):
        raise CatalogueError("flag_keys must map an SGLang argument to a profile key")
    _check_tiers(rules)
    components = _components(doc.get("components") or [])
    build = doc.get("build_lines") or {}
    for part in ("summary", "cause"):
        pats = build.get(part) or []
        if not isinstance(pats, list) or not all(isinstance(x, str) for x in pats):
            raise CatalogueError(f"build_lines.{part} must be a list of patterns")
        for x in pats:
            try:
                re.compile(x)
            except re.error as exc:
                raise CatalogueError(f"build_lines.{part}: pattern {x!r} does not compile: {exc}") from None
    # the unit's own start/stop lines are looked back for when shutdown noise follows (no anchor)
    screened = [(r, p) for r in rules if screened_rule(r) for p in r.patterns]
    plan = plan_screen([literal_options(p) for _, p in screened], EXTRA_KEYWORDS)
    chosen: dict[tuple[str, str], tuple[str, ...]] = {(r.id, p): s for (r, p), s in zip(screened, plan.per_pattern, strict=True)}
    out = []
    for r in rules:
        lits: list[str] = []
        sensitive: list[str] = []
        for p in r.patterns:
            s = chosen.get((r.id, p)) or best_literal_set(literal_options(p))
            lits.extend(s)
            if digit_sensitive(p):
                sensitive.extend(s)
        out.append(replace(r, literals=tuple(dict.fromkeys(lits)), sensitive_literals=tuple(dict.fromkeys(sensitive))))
    return Catalogue(rules=tuple(out), version=int(doc.get("version", 1)), anchors=plan.anchors, derived=derived,
                     algorithm_checks=tuple((str(k).upper(), " ".join(v.split())) for k, v in checks.items()),
                     flag_keys=tuple((normal_flag(str(k)), v) for k, v in flags.items()), screen_kind=screen_kind,
                     components=components, build_summary=tuple(build.get("summary") or ()),
                     build_cause=tuple(build.get("cause") or ()))


def _components(raw: Any) -> tuple[Component, ...]:
    if not isinstance(raw, list):
        raise CatalogueError("components must be a list")
    out: list[Component] = []
    for i, c in enumerate(raw):
        where = f"component {c.get('id', f'#{i}') if isinstance(c, dict) else f'#{i}'!r}"
        if not isinstance(c, dict) or not c.get("id") or not c.get("name"):
            raise CatalogueError(f"{where}: needs an id and a name")
        remedy = c.get("remedy") or {}
        if not remedy.get("text"):
            raise CatalogueError(f"{where}: needs a remedy text (the key to try, or where to look)")
        lists = {k: c.get(k) or [] for k in ("text", "paths", "logger")}
        for k, v in lists.items():
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise CatalogueError(f"{where}: {k} must be a list of strings")
        for rx in lists["logger"]:
            try:
                re.compile(rx)
            except re.error as exc:
                raise CatalogueError(f"{where}: logger pattern {rx!r} does not compile: {exc}") from None
        if not any(lists.values()):
            raise CatalogueError(f"{where}: needs text, paths or logger to be found by")
        out.append(Component(id=str(c["id"]), name=str(c["name"]), text=tuple(lists["text"]),
                             paths=tuple(lists["paths"]), logger=tuple(lists["logger"]),
                             remedy=" ".join(str(remedy["text"]).split()), profile_key=remedy.get("profile_key")))
    if len({c.id for c in out}) != len(out):
        raise CatalogueError("component ids must be unique")
    return tuple(out)


SIGNATURE_ROLES = ("cause", "wrapper", "downstream")  # a rule that names a failure by its own text
GENERIC_ROLES = ("consequence", "death", "backstop")  # secondary symptoms, unexplained deaths, any-exception evidence


def _check_tiers(rules: tuple[Rule, ...]) -> None:
    """A benign phrase never outranks a failure's signature on its line: benign rules come after
    every cause, wrapper and downstream rule, and before the generic evidence (consequences,
    backstops) that a harmless message must not be taken for (a rejected request's traceback)."""
    last_signature = max((r.order for r in rules if r.role in SIGNATURE_ROLES), default=-1)
    first_generic = min((r.order for r in rules if r.role in GENERIC_ROLES), default=len(rules))
    for r in rules:
        if r.severity == "benign" and not last_signature < r.order < first_generic:
            raise CatalogueError(f"rule {r.id!r}: a benign rule must come after every cause, wrapper and downstream "
                                 "rule and before the consequences and backstops (a benign phrase never outranks a "
                                 "failure's signature)")


# Findings the scanner builds from more than one line, and the facts their text may use.
DERIVED = {"accept_len_stuck_at_one": ("streak",), "process_died_at_end": ()}


def _derived(raw: Any, rule_ids: set[str]) -> tuple[tuple[str, Variant], ...]:
    if not isinstance(raw, dict):
        raise CatalogueError("derived must be a mapping of id -> finding")
    if set(raw) != set(DERIVED):
        raise CatalogueError(f"derived must define exactly {sorted(DERIVED)} (got {sorted(raw)})")
    out = []
    for key, facts in DERIVED.items():
        if key in rule_ids:
            raise CatalogueError(f"derived finding {key!r} has the id of a rule")
        out.append((key, _variant(raw[key], key, f"derived {key!r}", {}, facts)))
    return tuple(out)


@lru_cache(maxsize=4)
def load_catalogue(path: str | None = None) -> Catalogue:
    """The shipped catalogue (or one at `path`, for experiments); parsed once per process, and kept
    parsed on disk under the hash of its text and of the code that parses it (diagnose.cache)."""
    if path is None:
        text = resources.files("ddtree_ops.diagnose").joinpath("catalogue.yaml").read_text("utf-8")
    else:
        text = Path(path).read_text("utf-8")
    return cached_catalogue(text)


# the modules whose code shapes a parsed catalogue: a change to any of them is a new cache entry
_PARSERS = ("catalogue", "screen", "context", "fingerprint", "journal")


def cached_catalogue(text: str, screen_kind: str = "auto") -> Catalogue:
    """`parse_catalogue(text)`, read from the disk cache when this text was parsed by this code before."""
    import json  # only when a catalogue is loaded

    from ddtree_ops.diagnose import cache  # stdlib only: the disk cache of parsed catalogues

    here = Path(__file__).resolve().parent
    try:
        code = b"".join((here / f"{m}.py").read_bytes() for m in _PARSERS)
    except OSError:
        code = b""
    name = f"catalogue-{cache.key(text, code, screen_kind)}.json"
    raw = cache.read(name) if code else None
    if raw is not None:
        try:
            return _decode(json.loads(raw.decode("utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # not a catalogue this code wrote: parsed again below, and rewritten
    cat = parse_catalogue(text, screen_kind=screen_kind)
    if code:
        cache.write(name, json.dumps(_encode(cat), separators=(",", ":")).encode("utf-8"))
    return cat


_TYPES = {"Rule": Rule, "Variant": Variant, "Catalogue": Catalogue, "Component": Component}


def _encode(obj: Any) -> Any:
    """A catalogue as JSON data: dataclasses tagged by type, frozensets marked (lists are tuples)."""
    if type(obj).__name__ in _TYPES and hasattr(obj, "__dataclass_fields__"):
        return {"__t": type(obj).__name__, **{k: _encode(getattr(obj, k)) for k in obj.__dataclass_fields__}}
    if isinstance(obj, frozenset):
        return {"__fs": sorted(obj)}
    if isinstance(obj, (tuple, list)):
        return [_encode(x) for x in obj]
    return obj


def _decode(doc: Any) -> Any:
    if isinstance(doc, dict):
        if "__fs" in doc:
            return frozenset(doc["__fs"])
        cls = _TYPES[doc["__t"]]
        return cls(**{k: _decode(v) for k, v in doc.items() if k != "__t"})
    if isinstance(doc, list):
        return tuple(_decode(x) for x in doc)
    return doc


def screened_rule(rule: Rule) -> bool:
    """Whether the screen must find this rule's lines by itself.

    A start or stop of the unit only matters once shutdown noise follows: those lines are looked
    back for then (`lookback_rx`), so their lowercase words ("Stopping x.service") cost no pass
    over every healthy byte.
    """
    return rule.context not in ("start", "stop")


@lru_cache(maxsize=4)
def lookback_rx(cat: Catalogue) -> re.Pattern[bytes] | None:
    kws = sorted({lit for r in cat.rules if r.context in ("start", "stop") for lit in r.literals})
    return re.compile(trie_regex(kws).encode("utf-8")) if kws else None


@lru_cache(maxsize=4)
def screen_for(cat: Catalogue) -> Screen | HyperscanScreen:
    kws = [lit for r in cat.rules if screened_rule(r) for lit in r.literals]
    return build_screen([*kws, *EXTRA_KEYWORDS], cat.anchors, needles=(ACCEPT_NEEDLE,), kind=cat.screen_kind)


@lru_cache(maxsize=4)
def build_rx(cat: Catalogue) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """The build tool's summary lines and the error lines that outrank them (catalogue build_lines)."""
    def one(pats: tuple[str, ...]) -> re.Pattern[str] | None:
        return re.compile("|".join(f"(?:{p})" for p in pats)) if pats else None
    return one(cat.build_summary), one(cat.build_cause)


@lru_cache(maxsize=4)
def index_for(cat: Catalogue) -> KeywordIndex | HyperscanKeywordIndex:
    return keyword_index([r.literals for r in cat.rules], cat.screen_kind)
