"""Classify a journal or log: lines in, findings and a root cause out. Pure: no I/O, no clock.

How a scan works (and why it is fast on a healthy gigabyte and on a flood of one warning):
1. A keyword screen (`screen.Screen`) runs over whole blocks of raw bytes in C: memchr for
   anchor bytes that are rare in healthy SGLang serving lines, one `re` pass for each common
   one, so a boring line costs no Python work at all.
2. A hit line's decision is memoised per message shape (the raw line with every digit made
   "0"): a million copies of one warning are one dictionary lookup each once their rule has
   kept its `MAX_PER_RULE` examples. Keywords hold no digits, so the shape decides the
   candidate rules; a decision is only memoised when none of them looks at digits.
3. Otherwise the line is decoded, stripped of journald/container/Ray/rank prefixes
   (`journal.clean_line`), and one combined keyword regex (`screen.KeywordIndex`) names the
   few rules that can match it; they are tried in catalogue order (first match wins). The cost
   of a hit line does not grow with the number of rules.
4. A line that opens a Python traceback switches to line-by-line mode until the traceback ends,
   so that the exception line, its chained parts and the frames that raised it are known:
   rules can require where an exception was raised (`raised_in`), not only what it says.
5. What the log says about the start (speculative algorithm, dummy weights, whether DFlash-family
   hidden capture was configured, whether a stop was requested) is kept as context: after a
   requested stop, shutdown noise is benign; an ambiguous message is named from the context.
6. The root cause is chosen over findings, not lines: the first cause in time, where a wrapper
   yields to the cause inside it, an NCCL/watchdog echo yields to an earlier unexplained crash,
   and secondary symptoms only explain a failure when nothing else does.

`Scanner` is the incremental form (the deploy gate feeds it each poll's new lines);
`classify(lines)` is `Scanner().feed(lines)` + `report()`, and feeding in chunks gives the same
report as feeding everything at once.
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import IO, Any
from collections.abc import Callable, Iterable, Iterator

from ddtree_ops.diagnose import journal
from ddtree_ops.diagnose.screen import (FREQ as _FREQ, HEALTHY_SAMPLE as _HEALTHY_SAMPLE, CatalogueError,
                                        KeywordIndex, Screen, ScreenPlan, best_literal_set, build_screen,
                                        digit_sensitive, literal_options as _literal_options, plan_screen,
                                        required_literal_sets as _required_literal_sets, trie_regex)

__all__ = ["LABELS", "CatalogueError", "Catalogue", "Rule", "Finding", "Report", "Scanner", "Screen", "ScreenPlan",
           "classify", "classify_bytes", "classify_stream", "classify_path", "load_catalogue", "parse_catalogue", "choose_root",
           "verdict_of", "plan_screen", "build_screen", "_FREQ", "_HEALTHY_SAMPLE", "_required_literal_sets"]

LABELS = (
    "healthy", "benign_warning", "kv_pool_too_small", "cuda_oom", "host_oom", "cuda_lib_load",
    "abi_mismatch", "cuda_driver_incompatible", "unsupported_gpu_arch", "cuda_graph_capture",
    "illegal_memory_access", "nccl_error", "watchdog_timeout", "port_bind_error", "model_not_found",
    "hf_download_blocked", "tokenizer_error", "spec_decode_misconfig", "flashinfer_jit_error",
    "triton_compile_error", "hidden_capture_missing", "bad_launch_flags", "unclassified_crash",
    # added with issues 11 and 12 (what the field shows and the first list lacked)
    "shadow_accounting_off", "device_assert", "native_abort", "kernel_op_missing",
    "remote_code_module_missing", "req_slots_exhausted", "kv_exhausted_serving",
)
SEVERITIES = ("fatal", "warning", "benign", "info")
ROLES = ("cause", "wrapper", "downstream", "consequence", "backstop", "benign", "info")
DIRECTIONS = (None, "raise", "lower")
CONTEXTS = (None, "launch", "start", "stop", "capture_on", "capture_off", "plugin_seen")

MAX_MATCH_CHARS = 16384  # a hit inside a longer line is matched in a window around the hit
MAX_TEXT_CHARS = 2000  # what a finding keeps of its line
MAX_PER_RULE = 50  # findings kept per rule (the rest are counted): a 1 GB journal stays small
MAX_MEMO = 1 << 16  # message shapes remembered (then forgotten at once: a flood has few shapes)
LOOKBACK_BYTES = 1 << 16  # how far back a stop or start of the unit is looked for before shutdown noise
ORPHAN_BYTES = 1 << 15  # how far back the frames of a traceback without its header are read
ORPHAN_LINES = 400
SPEC_LOOKBACK_BYTES = 2048  # "right before": a native abort this close to a speculative setting
_SPEC_SETTING_RX = re.compile(rb"[Ss]peculative|speculative_|EAGLE|NEXTN|DFLASH|DDTREE|draft model|draft_model")
# a line that can end a traceback: what the frames before it were raising
_EXC_START = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}(?:Error|Exception|Exit|Interrupt|Warning)(?::|$)")
ACCEPT_LOW = 1.10  # below this the drafter is not helping
ACCEPT_STREAK = 3  # consecutive decode reports at exactly 1.00 that mean "capture is missing"

_DIGIT0 = bytes.maketrans(b"0123456789", b"0000000000")


# ------------------------------------------------------------------ catalogue


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
    xid_hardware: frozenset[int] = frozenset()
    context: str | None = None  # what the line tells about the start (CONTEXTS)
    resolve: str | None = None  # a function that names the cause from the context (RESOLVERS)
    literals: tuple[str, ...] = ()  # any-of: a line matching any pattern holds one of these
    digit_sensitive: bool = False  # a pattern can tell lines apart that differ only in digits

    def search(self, text: str) -> re.Match[str] | None:
        for rx in _compiled(self.patterns):
            m = rx.search(text)
            if m:
                return m
        return None

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
    anchors: tuple[str, ...] = ()  # the keyword screen's anchor bytes (see plan_screen)

    @property
    def by_id(self) -> dict[str, Rule]:
        return {r.id: r for r in self.rules}

    def patterns(self) -> list[str]:
        """Every pattern, in priority order."""
        return [p for r in self.rules for p in r.patterns]


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
        _literal_options(p)
    remedy = raw.get("remedy") or {}
    if remedy.get("direction") not in DIRECTIONS:
        raise CatalogueError(f"{where}: remedy.direction must be raise, lower or null")
    return Rule(
        id=str(raw["id"]), label=raw["label"], severity=raw["severity"], role=raw["role"],
        patterns=tuple(patterns), order=order, meaning=" ".join(str(raw.get("meaning", "")).split()),
        remedy=" ".join(str(remedy.get("text", "")).split()), direction=remedy.get("direction"),
        profile_key=remedy.get("profile_key"), references=tuple(str(r) for r in raw.get("references", [])),
        frames=tuple(raw.get("frames", [])), raised_in=tuple(raw.get("raised_in", [])),
        defer_within=int(raw.get("defer_within", 0)),
        xid_hardware=frozenset(int(x) for x in raw.get("xid_hardware", [])),
        context=raw.get("context"), resolve=raw.get("resolve"),
        digit_sensitive=any(digit_sensitive(p) for p in patterns),
    )


# Keywords the engine itself needs besides the catalogue's: a traceback's header, and a decode
# report at 1.00 (found as a whole needle: its bytes are those of every healthy decode line).
_ACCEPT = "accept len: "
_ACCEPT_B = _ACCEPT.encode()
_ACCEPT_NEEDLE = "accept len: 1.0"
_EXTRA_KEYWORDS = (journal.TRACEBACK_HEADER,)


def parse_catalogue(text: str) -> Catalogue:
    import yaml

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
    # the screen only has to find lines a non-benign rule can claim: a benign veto is checked on
    # the lines the screen finds, so its own keywords need no anchor
    screened = [(r, p) for r in rules if _screened(r) for p in r.patterns]
    plan = plan_screen([_literal_options(p) for _, p in screened], _EXTRA_KEYWORDS)
    chosen: dict[tuple[str, str], tuple[str, ...]] = {(r.id, p): s for (r, p), s in zip(screened, plan.per_pattern, strict=True)}
    out = []
    for r in rules:
        lits: list[str] = []
        for p in r.patterns:
            s = chosen.get((r.id, p)) or best_literal_set(_literal_options(p))
            lits.extend(s)
        out.append(replace(r, literals=tuple(dict.fromkeys(lits))))
    return Catalogue(rules=tuple(out), version=int(doc.get("version", 1)), anchors=plan.anchors)


@lru_cache(maxsize=4)
def load_catalogue(path: str | None = None) -> Catalogue:
    """The shipped catalogue (or one at `path`, for experiments); parsed once per process."""
    if path is None:
        text = resources.files("ddtree_ops.diagnose").joinpath("catalogue.yaml").read_text("utf-8")
    else:
        text = Path(path).read_text("utf-8")
    return parse_catalogue(text)


def _screened(rule: Rule) -> bool:
    """Whether the screen must find this rule's lines by itself.

    Benign vetoes only matter on lines another rule claims, and a start or stop of the unit only
    matters once shutdown noise follows: those lines are looked back for then (`_lookback`), so
    their lowercase words ("Stopping x.service") cost no pass over every healthy byte.
    """
    return rule.severity != "benign" and rule.context not in ("start", "stop")


@lru_cache(maxsize=4)
def _lookback_rx(cat: Catalogue) -> re.Pattern[bytes] | None:
    kws = sorted({lit for r in cat.rules if r.context in ("start", "stop") for lit in r.literals})
    return re.compile(trie_regex(kws).encode("utf-8")) if kws else None


@lru_cache(maxsize=4)
def _screen_for(cat: Catalogue) -> Screen:
    kws = [lit for r in cat.rules if _screened(r) for lit in r.literals]
    return build_screen([*kws, *_EXTRA_KEYWORDS], cat.anchors, needles=(_ACCEPT_NEEDLE,))


@lru_cache(maxsize=4)
def _index_for(cat: Catalogue) -> KeywordIndex:
    return KeywordIndex([r.literals for r in cat.rules])


# ------------------------------------------------------------------ context: what the log says about this start


@dataclass
class LaunchContext:
    """Facts about the start being read, from the lines seen so far."""

    algorithm: str | None = None  # --speculative-algorithm
    load_format: str | None = None  # --load-format (dummy = random weights)
    capture: bool | None = None  # DFlash-family hidden capture configured (True), said not to be (False)
    capture_line: int | None = None
    plugin_seen: bool = False  # the ddtree plugin's worker printed its settings
    stop_line: int | None = None  # a stop was requested here (systemd's stop, SIGTERM); None after a new start

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.algorithm:
            out["speculative_algorithm"] = self.algorithm
        if self.load_format:
            out["load_format"] = self.load_format
        if self.capture is not None:
            out["hidden_capture_configured"] = self.capture
        if self.stop_line is not None:
            out["stop_requested_line"] = self.stop_line
        return out


_ALGO_RX = (re.compile(r"speculative_algorithm='([A-Za-z0-9_]+)'"), re.compile(r"--speculative-algorithm[= ]+([A-Za-z0-9_]+)"))
_LOADFMT_RX = (re.compile(r"load_format='([A-Za-z0-9_]+)'"), re.compile(r"--load-format[= ]+([A-Za-z0-9_]+)"))
# SGLang's own DFlash setup and the DFlash-family algorithms (built in, or registered by a plugin)
_BUILTIN_DFLASH = ("DFLASH",)

_SHAPE_RX = re.compile(r"Expected shape \[N, ([0-9]+)\] \(num_context_features=([0-9]+), hidden_size=([0-9]+)\), "
                       r"but got shape=\(([0-9]+), ([0-9]+)\)")

_LAYER_IDS_REMEDY = (
    "The draft's dflash_config.target_layer_ids asks for a layer the target never captures. Qwen3-family targets "
    "capture the hidden state before layer id+1, so every id must be below num_hidden_layers - 1 (the last layer "
    "is never captured); SGLang itself only checks id < num_hidden_layers. Use a draft trained for this target, "
    "or fix target_layer_ids in the draft's config.json (modes.<mode>.draft_model_path); `ddtree-ops diagnose "
    "HOST` checks it against the target's config before anything changes.")
_KV_BUDGET_REMEDY = (
    "RAISE memory.mem_fraction_static (lowering it makes this worse); SGLang's newer message prints the minimum "
    "viable fraction. If it would have to exceed ~0.93, the model does not fit this GPU: use a quantized "
    "checkpoint, stop other processes holding GPU memory, or use the larger GPU.")
_CAPTURE_REMEDY = (
    "The speculative algorithm runs without DFlash-family hidden-state capture, so the target never captures "
    "the layers the draft reads. For DDTREE enable the ddtree plugin: SGLANG_PLUGINS must name ddtree "
    "(service.env) and the ddtree-ops wheel must be installed in service.python; check that the plugin supports "
    "this SGLang version, and run `ddtree-ops engine plugin-check` on the host.")


def _resolve_feature_dim(ctx: LaunchContext, text: str, frames: list[journal.Frame]) -> dict[str, Any]:
    """DFlash's `target_hidden feature dim mismatch` has two causes that print the same message.

    Capture configured (built-in DFLASH, or the plugin said it registered DDTREE as DFlash-family,
    or its worker ran) but a requested layer never captured: the draft's target_layer_ids. A
    plugin algorithm with no sign of DFlash-family capture (or a line saying it is not): the
    capture was never set up. The shape tells them apart when fewer than all, but more than one,
    of the requested layers arrived.
    """
    m = _SHAPE_RX.search(text)
    partial = False
    if m:
        want, hidden, got = int(m.group(2)), int(m.group(3)), int(m.group(5))
        partial = hidden > 0 and got % hidden == 0 and 1 < got // hidden < want
    algo = (ctx.algorithm or "").upper()
    if not partial and ctx.capture is False:
        why = "a line of this start says the algorithm was registered without DFlash-family capture"
    elif not partial and algo and algo not in _BUILTIN_DFLASH and not ctx.capture and not ctx.plugin_seen:
        why = f"{algo} is a plugin algorithm and nothing in this start shows DFlash-family capture configured"
    else:
        return {"label": "spec_decode_misconfig", "remedy": _LAYER_IDS_REMEDY, "profile_key": "modes.<mode>.draft_model_path",
                "meaning": "Hidden capture was configured, but fewer target layers arrived than the draft's "
                           "target_layer_ids ask for: one of the ids is a layer the target never captures."}
    return {"label": "hidden_capture_missing", "remedy": _CAPTURE_REMEDY, "profile_key": "service.env",
            "meaning": f"The draft got the target's final hidden state instead of the captured layers: {why}."}


_SPEC_SETTINGS = {
    "EAGLE": "--speculative-algorithm EAGLE needs an EAGLE(-2) draft; an EAGLE-3 draft (LlamaForCausalLMEagle3) needs EAGLE3",
    "EAGLE3": "--speculative-algorithm EAGLE3 needs an EAGLE-3 draft trained for this target (and a target whose class captures aux hidden states)",
    "NEXTN": "--speculative-algorithm NEXTN/MTP uses the checkpoint's own MTP layers: the draft path must be the target (or its NextN export) of the same version",
    "DFLASH": "--speculative-algorithm DFLASH needs a DFlash draft whose dflash_config (target_layer_ids, block_size, mask token) fits this target",
    "DDTREE": "DDTREE needs the ddtree plugin (DFlash-family) and a DFlash draft whose dflash_config fits this target",
    "NGRAM": "--speculative-algorithm NGRAM takes no draft model; check the ngram window and draft-token settings",
    "STANDALONE": "--speculative-algorithm STANDALONE needs a draft model with the target's tokenizer and vocab",
}


def _resolve_speculative_frame(ctx: LaunchContext, text: str, frames: list[journal.Frame]) -> dict[str, Any]:
    """A generic exception raised in speculative code: say where, and which settings to check."""
    where = next((f for f in reversed(frames) if any(k in (f.path + " " + f.func).lower()
                                                        for k in ("speculative", "spec_decode", "eagle", "nextn", "mtp",
                                                                  "dflash", "medusa", "draft", "ngram"))), None)
    algo = (ctx.algorithm or "").upper()
    check = _SPEC_SETTINGS.get(algo) or (
        "--speculative-algorithm must match the draft (EAGLE vs EAGLE3 vs NEXTN/MTP vs DFLASH), and the draft must be "
        "trained for this target")
    at = f" ({where.short()})" if where is not None else ""
    remedy = (f"Raised inside speculative-decoding code{at}. {check}. Also check --speculative-num-steps, "
              "--speculative-eagle-topk and --speculative-num-draft-tokens against what this SGLang version supports "
              "for this model, and whether the draft's vocab/token map matches the target's; roll back to the "
              "known-good mode meanwhile (modes.<mode>.draft_model_path and the mode's speculative settings).")
    return {"remedy": remedy, "label": "spec_decode_misconfig", "profile_key": "modes.<mode>.draft_model_path"}


_WEIGHTS_RX = re.compile(r"under --mem-fraction-static=([0-9.]+)\. Raise --mem-fraction-static above ([0-9.]+)")


def _resolve_kv_budget(ctx: LaunchContext, text: str, frames: list[journal.Frame]) -> dict[str, Any]:
    """0.5.17+ prints the fraction it would have needed ("Raise ... above 0.131"): say that number.
    SGLang sizes the budget from the memory free at its start, so memory other processes hold on
    the card raises it too."""
    m = _WEIGHTS_RX.search(text)
    base = {"label": "kv_pool_too_small", "profile_key": "memory.mem_fraction_static"}
    if not m:
        return {**base, "remedy": _KV_BUDGET_REMEDY}
    have, need = m.group(1), float(m.group(2))
    if need > 0.93:
        fix = (f"SGLang would need mem_fraction_static above {need:g}: the weights do not fit what is free on this "
               "GPU. Stop other processes holding its memory (nvidia-smi), use a quantized checkpoint, more cards "
               "(parallel.tp_size) or the larger GPU.")
    else:
        fix = (f"RAISE memory.mem_fraction_static from {have} to above {need:g} (SGLang's own minimum for the memory "
               "that was free at this start; leave headroom for the KV pool). If other processes hold memory on "
               "the card (nvidia-smi), stopping them lowers that minimum.")
    return {**base, "remedy": fix}


RESOLVERS: dict[str, Callable[[LaunchContext, str, list[journal.Frame]], dict[str, Any]]] = {
    "kv_budget": _resolve_kv_budget,
    "feature_dim": _resolve_feature_dim,
    "speculative_frame": _resolve_speculative_frame,
}

_SIG_NUM = re.compile(r"0x[0-9a-fA-F]+|[0-9]+")
_SIG_PATH = re.compile(r"(?:/[^/\s'\"]+){2,}/")


def crash_signature(exception: str, frames: list[journal.Frame]) -> str:
    """One line to search an issue tracker with: the exception without its numbers and paths,
    and the innermost engine frame (file and function, not line numbers, which move)."""
    sig = _SIG_PATH.sub("", _SIG_NUM.sub("N", exception.strip()))[:160]
    engine = next((f for f in reversed(frames) if any(m in f.path for m in journal.ENGINE_PATHS)), None)
    where = engine or (frames[-1] if frames else None)
    if where is not None:
        short = where.short().rsplit(":", 1)[0] if ":" in where.short() else where.short()
        sig += f" ({short} in {where.func})" if where.func else f" ({short})"
    return sig

# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class Finding:
    label: str
    severity: str  # fatal | warning | benign
    line: int  # 1-based line number in the input
    text: str  # the cleaned message line
    evidence: str  # the matched substring (the whole line for generic backstops)
    remedy: str
    profile_key: str | None
    direction: str | None  # raise | lower | None
    rule_id: str
    role: str = "cause"
    meaning: str = ""
    group: int | None = None  # traceback group id, None outside tracebacks
    hardware: bool = False  # an Xid that means "do not roll back the software"
    frames: tuple[str, ...] = ()  # inside a traceback: the innermost frame, ours, the engine's
    signature: str = ""  # for an unnamed crash: a one-line signature to search issue trackers for

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "severity": self.severity, "line": self.line, "evidence": self.evidence,
            "text": self.text, "remedy": self.remedy, "profile_key": self.profile_key,
            "direction": self.direction, "rule_id": self.rule_id, "role": self.role,
            **({"hardware": True} if self.hardware else {}),
            **({"frames": list(self.frames)} if self.frames else {}),
            **({"signature": self.signature} if self.signature else {}),
        }


@dataclass(frozen=True)
class MemoryFacts:
    """SGLang's own memory report, for comparison with the preflight prediction."""

    kv_tokens: int | None = None  # "KV Cache is allocated. #tokens: N"
    k_size_gb: float | None = None
    v_size_gb: float | None = None
    max_total_num_tokens: int | None = None
    available_gpu_mem_gb: float | None = None  # after startup, in the max_total_num_tokens line
    weights_gb: float | None = None  # "Load weight end ... mem usage=X GB"
    cuda_graph_gb: float | None = None  # "Capture cuda graph end ... mem usage=X GB"
    pool_end_avail_gb: float | None = None  # "Memory pool end. avail mem=X GB"
    context_len: int | None = None
    max_running_requests: int | None = None

    @property
    def kv_gb(self) -> float | None:
        if self.k_size_gb is None or self.v_size_gb is None:
            return None
        return self.k_size_gb + self.v_size_gb

    def any(self) -> bool:
        return any(v is not None for v in self.__dict__.values())

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class AcceptStats:
    low_reports: int = 0  # decode reports below ACCEPT_LOW
    recent: tuple[float, ...] = ()  # the last accept lengths, oldest first
    longest_one_streak: int = 0

    @property
    def last(self) -> float | None:
        return self.recent[-1] if self.recent else None

    def to_json(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "last": self.last, "low_reports": self.low_reports,
                "longest_streak_at_1.00": self.longest_one_streak}


@dataclass(frozen=True)
class Report:
    verdict: str  # healthy | degraded | failed
    root_cause: Finding | None
    findings: list[Finding]
    lines: int = 0
    ready_line: int | None = None
    memory: MemoryFacts = field(default_factory=MemoryFacts)
    accept: AcceptStats = field(default_factory=AcceptStats)
    suppressed: dict[str, int] = field(default_factory=dict)  # rule id -> findings not kept
    launch: dict[str, Any] = field(default_factory=dict)  # what the log says about this start (algorithm, weights, stop)

    @property
    def dummy_weights(self) -> bool:
        """`--load-format dummy`: random weights, so an acceptance length of 1.00 means nothing."""
        return self.launch.get("load_format") == "dummy"

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fatal"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def to_json(self) -> dict[str, Any]:
        rc = None
        if self.root_cause is not None:
            f = self.root_cause
            rc = {"label": f.label, "line": f.line, "evidence": f.evidence, "remedy": f.remedy,
                  "text": f.text, "profile_key": f.profile_key, "direction": f.direction,
                  "rule_id": f.rule_id, "meaning": f.meaning, **({"hardware": True} if f.hardware else {}),
                  **({"frames": list(f.frames)} if f.frames else {}),
                  **({"signature": f.signature} if f.signature else {})}
        doc: dict[str, Any] = {
            "verdict": self.verdict,
            "root_cause": rc,
            "findings": [f.to_json() for f in self.findings],
            "lines": self.lines,
            "ready_line": self.ready_line,
        }
        if self.memory.any():
            doc["memory"] = self.memory.to_json()
        if self.accept.recent:
            doc["accept_len"] = self.accept.to_json()
        if self.suppressed:
            doc["suppressed"] = dict(self.suppressed)
        if self.launch:
            doc["launch"] = dict(self.launch)
        return doc


# ------------------------------------------------------------------ number parsers

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_MEM_PARSERS: tuple[tuple[re.Pattern[str], tuple[tuple[str, type], ...]], ...] = (
    (re.compile(r"KV Cache is allocated\.[^#]{0,80}#tokens: ([0-9]+), K size: " + _NUM + r" GB, V size: " + _NUM + " GB"),
     (("kv_tokens", int), ("k_size_gb", float), ("v_size_gb", float))),
    (re.compile(r"KV Cache is allocated\.[^#]{0,80}#tokens: ([0-9]+)"), (("kv_tokens", int),)),
    (re.compile(r"max_total_num_tokens=([0-9]+)"), (("max_total_num_tokens", int),)),
    (re.compile(r"max_running_requests=([0-9]+)"), (("max_running_requests", int),)),
    (re.compile(r"context_len=([0-9]+)"), (("context_len", int),)),
    (re.compile(r"available_gpu_mem=" + _NUM + " GB"), (("available_gpu_mem_gb", float),)),
    (re.compile(r"Load weight end\..{0,400}?mem usage=" + _NUM + " GB"), (("weights_gb", float),)),
    (re.compile(r"Capture (?:[a-z ]{0,40}CUDA graph|cuda graph) end\..{0,400}?mem usage=" + _NUM + " GB"), (("cuda_graph_gb", float),)),
    (re.compile(r"Memory pool end\. avail mem=" + _NUM + " GB"), (("pool_end_avail_gb", float),)),
)
_ACCEPT_RX = re.compile(r"accept len: ([0-9]+\.[0-9]+)")
_XID_RX = re.compile(r"NVRM: Xid \([^)]{0,64}\): ([0-9]{1,4})")


def parse_memory(text: str, facts: MemoryFacts | None = None) -> MemoryFacts:
    """Numbers from one SGLang memory line, merged into `facts`. The first report of a number
    wins: SGLang logs the target's weights and KV pool before a draft model's own."""
    facts = facts if facts is not None else MemoryFacts()
    updates: dict[str, Any] = {}
    for rx, fields in _MEM_PARSERS:
        m = rx.search(text)
        if not m:
            continue
        for (name, kind), value in zip(fields, m.groups(), strict=False):
            if name not in updates and getattr(facts, name) is None:
                updates[name] = kind(value)
    return replace(facts, **updates) if updates else facts


# ------------------------------------------------------------------ the scanner


def _to_bytes(line: str | bytes) -> bytes:
    if isinstance(line, bytes):
        return line
    return line.encode("utf-8", "surrogateescape")


_HELD_ROLES = ("wrapper", "backstop", "consequence")  # held while their traceback is still open
_ROLE_IN_GROUP = {"cause": 0, "downstream": 0, "wrapper": 1, "backstop": 2, "consequence": 3}
_ROLE_CLASS = {"cause": 0, "downstream": 0, "wrapper": 0, "backstop": 1, "consequence": 2}
# after a requested stop these are shutdown, not a crash (a specific cause still counts)
_SHUTDOWN_ROLES = ("consequence", "backstop", "downstream")


class Scanner:
    """Incremental classifier: feed lines as they arrive, ask for the report at any time.

    `feed()` returns the findings confirmed by the new lines. A specific cause is returned at
    once (the gate fails on it in the same poll); generic evidence inside a traceback (its
    header, a wrapper, an unnamed exception) is held until the traceback ends or `report()` is
    called, so a poll boundary inside a traceback never reports an unexplained crash before the
    line that explains it arrives.
    """

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        self.cat = catalogue or load_catalogue()
        self.screen = _screen_for(self.cat)
        self._index = _index_for(self.cat)
        self._lookback_rx = _lookback_rx(self.cat)  # looked up once: hashing a catalogue is not free
        self._rules = self.cat.rules
        self._by_id = self.cat.by_id
        self._defer = {r.id: r.defer_within for r in self.cat.rules if r.defer_within}
        self._tb = journal.TracebackTracker()
        self._ctx = LaunchContext()
        self._memo: dict[bytes, int] = {}  # message shape -> rule index (-1: no rule)
        self._line = 0  # input lines consumed so far
        self._findings: list[Finding] = []
        self._pending: list[Finding] = []  # inside the open traceback
        self._per_rule: dict[str, int] = {}
        self._suppressed: dict[str, int] = {}
        self._first_fatal: Finding | None = None
        self._ready_line: int | None = None
        self._memory = MemoryFacts()
        self._recent: deque[float] = deque(maxlen=16)
        self._low_reports = 0
        self._streak = 0  # consecutive decode reports at exactly 1.00
        self._longest = 0
        self._streak_reported = False
        self._json: bool | None = None  # decided on the first non-blank input
        self._partial = b""  # an incomplete last line from feed_bytes
        self._buf: bytes = b""  # the block being scanned, and the offset of the current line in it
        self._cur = 0
        self._seen_to = 0  # the block was looked back at up to here
        self._carry = b""  # the end of the previous block that was not looked back at
        self._tail = b""  # the last ORPHAN_BYTES of the previous blocks
        self._block: tuple[int, int, list[int] | None] = (0, 0, None)  # start, line base, line map

    # ---------------------------------------------------------------- public API

    @property
    def first_fatal(self) -> Finding | None:
        return self._first_fatal

    @property
    def lines(self) -> int:
        return self._line

    @property
    def context(self) -> LaunchContext:
        return self._ctx

    def feed(self, lines: Iterable[str | bytes]) -> list[Finding]:
        """Feed whole lines (str or bytes, without or with their newline)."""
        parts = [_to_bytes(ln).rstrip(b"\r\n") for ln in lines]
        if not parts:
            return []
        return self._feed_block(b"\n".join(parts) + b"\n")

    def feed_bytes(self, data: bytes) -> list[Finding]:
        """Feed raw bytes from a file or pipe; a trailing partial line waits for the next call."""
        out: list[Finding] = []
        start = 0
        if self._partial:
            nl = data.find(b"\n")
            if nl < 0:
                self._partial += data
                return out
            out += self._feed_block(self._partial + data[: nl + 1])
            self._partial, start = b"", nl + 1
        cut = data.rfind(b"\n")
        if cut < start:
            self._partial = data[start:]
            return out
        # the block is scanned in place: no copy of megabytes per call
        out += self._feed_block(data, start, cut + 1)
        self._partial = data[cut + 1:]
        return out

    def feed_screened(self, data: bytes, hits: list[int], where: list[int], newlines: int) -> list[Finding]:
        """Feed a block of whole lines whose screen was run elsewhere (`classify_path`): `hits` are
        the screen's offsets, `where[i]` the block line index of hits[i], `newlines` its line count."""
        if self._partial:
            raise ValueError("feed_screened after a partial line: feed whole lines")
        if self._json is None and data.strip():
            self._json = journal.looks_like_json_journal(data[:65536])
        if self._json:
            return self._feed_block(data)
        before = len(self._findings)
        self._scan(data, None, screened=(hits, where, newlines))
        return self._findings[before:]

    def finish(self) -> list[Finding]:
        """End of input: the partial last line and any open traceback are settled."""
        out: list[Finding] = []
        if self._partial:
            out += self._feed_block(self._partial + b"\n")
            self._partial = b""
        return out

    def report(self) -> Report:
        findings = sorted([*self._findings, *self._pending_settled()], key=lambda f: (f.line, f.rule_id))
        root = choose_root(findings, self._tb.starts, self._defer)
        verdict = verdict_of(root, findings)
        accept = AcceptStats(low_reports=self._low_reports,
                             recent=tuple(self._recent), longest_one_streak=self._longest)
        return Report(verdict=verdict, root_cause=root, findings=findings, lines=self._line,
                      ready_line=self._ready_line, memory=self._memory, accept=accept,
                      suppressed=dict(self._suppressed), launch=self._ctx.to_json())

    # ---------------------------------------------------------------- blocks

    def _feed_block(self, buf: bytes, start: int = 0, end: int | None = None) -> list[Finding]:
        end = len(buf) if end is None else end
        if self._json is None and buf[start:end].strip():
            self._json = journal.looks_like_json_journal(buf[start:start + 65536])
        before = len(self._findings)
        if self._json:
            self._feed_json(buf[start:end])
        else:
            self._scan(buf, None, start=start, end=end)
        return self._findings[before:]

    def _feed_json(self, buf: bytes) -> None:
        """`journalctl -o json`: every entry is parsed; its message lines keep the entry's number."""
        out: list[bytes] = []
        line_map: list[int] = []
        first = self._line
        for i, raw in enumerate(buf.split(b"\n")[:-1]):
            text = raw.decode("utf-8", "replace")
            msgs = journal.json_messages(text) if text.lstrip().startswith("{") else None
            for msg in (msgs if msgs is not None else [text]):
                out.append(msg.encode("utf-8", "surrogateescape"))
                line_map.append(first + i + 1)
        self._scan(b"\n".join(out) + b"\n" if out else b"", line_map, physical=buf.count(b"\n"))

    def _scan(self, buf: bytes, line_map: list[int] | None, physical: int | None = None,
              start: int = 0, end: int | None = None,
              screened: tuple[list[int], list[int], int] | None = None) -> None:
        """The complete lines in buf[start:end]; `line_map[i]` is the input line of block line i.

        `screened` (offsets, their line indices in the block, newlines in the block) is the
        screen's work done elsewhere (`classify_path` runs it in worker processes).
        """
        end = len(buf) if end is None else end
        base = self._line
        pos = start  # byte offset of the next unprocessed line
        idx = 0  # its index in the block
        accept_from = start  # offset after the last accept-len report the screen saw
        count = buf.count
        find = buf.find
        self._buf, self._seen_to = buf, start  # for _lookback: lines before start were not looked at
        self._block = (start, base, line_map)

        def lineno(i: int) -> int:
            return line_map[i] if line_map is not None else base + i + 1

        def slow_until_closed() -> None:
            # line by line while a traceback is open
            nonlocal pos, idx
            while self._tb.open and pos < end:
                e = find(b"\n", pos, end)
                e = e if e >= 0 else end
                self._cur = pos
                self._line_full(buf[pos:e], lineno(idx), hit=None)
                pos, idx = e + 1, idx + 1
            if not self._tb.open:
                self._settle_group()

        slow_until_closed()
        line_full = self._line_full
        if screened is not None:
            hits, where = screened[0], screened[1]
        else:
            hits, where = (self.screen.hits(buf, pos, end) if pos < end else []), None
        for k, h in enumerate(hits):
            if h < pos:
                continue  # already handled (same line, or inside a traceback read line by line)
            ls = buf.rfind(b"\n", pos, h) + 1
            if ls < pos:
                ls = pos
            idx = where[k] if where is not None else idx + count(b"\n", pos, ls)
            e = find(b"\n", ls, end)
            if e < 0:
                e = end
            if self._streak and find(_ACCEPT_B, ls, e) >= 0 and count(_ACCEPT_B, accept_from, ls):
                # an accept-len report the screen skipped lies between the previous low one and
                # this one: it was not low, so the streak of 1.00s is broken
                self._streak = 0
            self._cur = ls
            line_full(buf[ls:e], line_map[idx] if line_map is not None else base + idx + 1, hit=h - ls)
            if self._streak:
                accept_from = e  # reports after this line decide whether the streak holds
            pos, idx = e + 1, idx + 1
            if self._tb.open:
                slow_until_closed()
        if self._streak and count(_ACCEPT_B, accept_from, end):
            self._streak = 0
        self._note_recent_accepts(buf, start, end)
        # what was not looked back at yet: its end may hold a stop that explains the next block
        tail_from = max(self._seen_to, end - LOOKBACK_BYTES)
        self._carry = buf[tail_from:end] if tail_from < end else b""
        # the last lines of the block, for frames whose exception line opens the next one
        self._tail = (self._tail + buf[max(start, end - ORPHAN_BYTES):end])[-ORPHAN_BYTES:]
        self._buf = b""
        if physical is not None:
            self._line = base + physical
        elif screened is not None:
            self._line = base + screened[2]
        elif pos <= end:
            self._line = base + idx + count(b"\n", pos, end)
        else:  # the last line had no newline: it is not a complete line
            self._line = base + idx - 1

    def _lookback(self) -> None:
        """Apply the unit's start/stop lines that the screen skipped, up to the current line.

        Called only before shutdown noise would become a finding: the region since the last look
        (at most LOOKBACK_BYTES, and the tail of the previous block) is searched once.
        """
        rx = self._lookback_rx
        upto = self._cur
        lo = max(self._seen_to, upto - LOOKBACK_BYTES)
        region = self._carry + (self._buf[lo:upto] if self._buf and lo < upto else b"")
        self._seen_to, self._carry = max(self._seen_to, upto), b""
        if rx is None or not region:
            return
        carried = len(region) - (upto - lo if self._buf and lo < upto else 0)
        for m in rx.finditer(region):
            ls = region.rfind(b"\n", 0, m.start()) + 1
            le = region.find(b"\n", m.end())
            text, _ = journal.clean_line(region[ls:le if le >= 0 else len(region)].decode("utf-8", "replace"))
            for i in self._index.candidates(text):
                rule = self._rules[i]
                if rule.context in ("start", "stop") and rule.search(text):
                    self._note_context(rule, text, self._lineno_at(lo + ls - carried) if ls >= carried else 0)
                    break

    def _spec_setting_just_before(self) -> bool:
        """Whether one of the few lines before the current one is about speculative decoding."""
        if not self._buf:
            return False
        cur, block_start = self._cur, self._block[0]
        recent = (self._tail + self._buf[block_start:cur] if cur - block_start < SPEC_LOOKBACK_BYTES
                  else self._buf[cur - SPEC_LOOKBACK_BYTES:cur])
        return _SPEC_SETTING_RX.search(recent[-SPEC_LOOKBACK_BYTES:]) is not None

    def _adopt_orphan_frames(self, lineno: int) -> None:
        """An exception line after frames but no `Traceback` header (a pasted excerpt, a header lost
        to a rate limit): the frames before it are read back, so where it was raised is known."""
        if self._buf:
            cur, block_start = self._cur, self._block[0]
            # the previous blocks' tail joins on only where this block's start is within reach
            region = (self._tail + self._buf[block_start:cur] if cur - block_start < ORPHAN_BYTES
                      else self._buf[cur - ORPHAN_BYTES:cur])
        else:
            region = self._tail
        end = len(region)
        back: list[str] = []
        frames = 0
        while end > 0 and len(back) < ORPHAN_LINES:
            s = region.rfind(b"\n", 0, end - 1) + 1 if end > 0 else 0
            line = region[s:end].rstrip(b"\n")
            text, _ = journal.clean_line(line.decode("utf-8", "replace"))
            if journal.is_frame(text):
                frames += 1
            elif not (text[:1] in (" ", "\t") or not text.strip() or journal.is_caret(text)):
                break
            back.append(text)
            if s == 0:
                break
            end = s
        while back and not journal.is_frame(back[-1]):
            back.pop()  # the group starts at its first frame
        if not frames or not back:
            return
        start = lineno - len(back)
        self._tb.step(journal.TRACEBACK_HEADER, True, start)
        for text in reversed(back):
            self._tb.step(text, False, start)

    def _lineno_at(self, offset: int) -> int:
        """The input line number of the line at `offset` of the current block."""
        start, base, line_map = self._block
        i = self._buf.count(b"\n", start, offset)
        return line_map[i] if line_map is not None and i < len(line_map) else base + i + 1

    def _note_recent_accepts(self, buf: bytes, start: int, end: int) -> None:
        # the last few accept lengths of the block (they are not screen hits when healthy)
        key = _ACCEPT_B
        vals: list[float] = []
        while len(vals) < self._recent.maxlen and end > start:  # type: ignore[operator]
            i = buf.rfind(key, start, end)
            if i < 0:
                break
            m = _ACCEPT_RX.match(buf[i:i + 40].decode("ascii", "replace"))
            if m:
                vals.append(float(m.group(1)))
            end = i
        if vals:
            self._recent.extend(reversed(vals))

    # ---------------------------------------------------------------- lines

    def _line_full(self, raw: bytes, lineno: int, hit: int | None) -> None:
        key: bytes | None = None
        if len(raw) > MAX_MATCH_CHARS:
            center = hit if hit is not None else 0
            lo = max(0, center - MAX_MATCH_CHARS // 2)
            raw = raw[lo: lo + MAX_MATCH_CHARS]
        elif not self._tb.open:
            key = raw.translate(_DIGIT0)
            known = self._memo.get(key)
            if known is not None:
                if known < 0:
                    return  # a shape that no rule claims (a screen false positive)
                rid = self._rules[known].id
                n = self._per_rule.get(rid, 0)
                if n >= MAX_PER_RULE:
                    # the rule has its examples: this copy is only counted
                    self._per_rule[rid] = n + 1
                    self._suppressed[rid] = self._suppressed.get(rid, 0) + 1
                    return
        text, new_record = journal.clean_line(raw.decode("utf-8", "replace"))
        was_open = self._tb.open
        if not was_open and _EXC_START.match(text) and (self._buf or self._tail):
            self._adopt_orphan_frames(lineno)
        group, kind = self._tb.step(text, new_record, lineno)
        if was_open and group is None:
            self._settle_group()
        if kind in ("frame", "code"):
            return  # source code quoted by a traceback (`raise HFValidationError(`) is not an error
        has_accept = _ACCEPT in text
        if has_accept:
            self._accept_line(text, lineno)
        cands = self._index.candidates(text)
        rule, m = self._match(text, group, cands)
        if key is not None and kind == "other" and group is None and not has_accept \
                and (rule is None or rule.plain) and not any(self._rules[i].digit_sensitive for i in cands):
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
            self._memo[key] = -1 if rule is None else rule.order
        if rule is None:
            if kind == "exc" and group is not None:
                # a traceback ended in an exception no rule names: keep it as generic evidence
                self._add(self._by_id["python_exception"], text, text, lineno, group)
            return
        if rule.severity == "info":
            self._info(rule, text, lineno)
            return
        if rule.context is not None:
            self._note_context(rule, text, lineno)
        # the match and the rest of its sentence: still a substring of the line (the gate finds
        # the journal entry by it), but readable ("undefined symbol: _ZNK3c10...", not "undefined symbol: ")
        evidence = text[m.start(): max(m.end(), min(len(text), m.start() + 160))] if m is not None else text
        if rule.role == "backstop":
            evidence = text.strip()[:300]
        self._add(rule, text, evidence, lineno, group)

    def _match(self, text: str, group: int | None, cands: tuple[int, ...]) -> tuple[Rule | None, re.Match[str] | None]:
        rules = self._rules
        raised: list[str] | None = None
        for i in cands:
            rule = rules[i]
            if rule.frames or rule.raised_in:
                if group is None:
                    continue
                if rule.frames and not any(fr in path for path in self._tb.frames for fr in rule.frames):
                    continue
                if rule.raised_in:
                    if raised is None:
                        raised = self._tb.raised_in()
                    if not any(fr in path for path in raised for fr in rule.raised_in):
                        continue
            m = rule.search(text)
            if m is not None:
                return rule, m
        return None, None

    def _info(self, rule: Rule, text: str, lineno: int) -> None:
        if rule.context is not None:
            self._note_context(rule, text, lineno)
        elif rule.id == "server_ready":
            if self._ready_line is None or "ready to roll" in text:
                self._ready_line = lineno
        else:
            self._memory = parse_memory(text, self._memory)

    def _note_context(self, rule: Rule, text: str, lineno: int) -> None:
        ctx = self._ctx
        what = rule.context
        if what == "launch":
            for rx in _ALGO_RX:
                m = rx.search(text)
                if m:
                    ctx.algorithm = m.group(1) if m.group(1) != "None" else None
                    break
            for rx in _LOADFMT_RX:
                m = rx.search(text)
                if m:
                    ctx.load_format = m.group(1)
                    break
            ctx.stop_line = None
        elif what == "start":
            ctx.stop_line = None
        elif what == "stop":
            if ctx.stop_line is None:
                ctx.stop_line = lineno or max(1, self._line)
        elif what == "capture_on":
            if ctx.capture is None:
                ctx.capture, ctx.capture_line = True, lineno
        elif what == "capture_off":
            ctx.capture, ctx.capture_line = False, lineno
        elif what == "plugin_seen":
            ctx.plugin_seen = True

    def _accept_line(self, text: str, lineno: int) -> None:
        m = _ACCEPT_RX.search(text)
        if not m:
            return
        value = float(m.group(1))
        if value < ACCEPT_LOW:
            self._low_reports += 1
        if value <= 1.0:
            self._streak += 1
            self._longest = max(self._longest, self._streak)
            if self._streak >= ACCEPT_STREAK and not self._streak_reported and self._ctx.load_format != "dummy":
                # with random weights (--load-format dummy) no draft token is ever accepted: that is expected
                self._streak_reported = True
                self._add_accept_finding(text, lineno)
        else:
            self._streak = 0

    def _add_accept_finding(self, text: str, lineno: int) -> None:
        f = Finding(
            label="hidden_capture_missing", severity="fatal", line=lineno, text=text[:MAX_TEXT_CHARS],
            evidence=_ACCEPT_RX.search(text).group(0),  # type: ignore[union-attr]  (a substring: the gate finds the entry by it)
            remedy=("No drafted token is ever accepted: the draft sees no target hidden states. For DDTREE install "
                    "the ddtree plugin in service.python so DDTREE registers as DFlash-family; check the draft's "
                    "dflash_config.target_layer_ids (modes.<mode>.draft_model_path)."),
            profile_key="service.python", direction=None, rule_id="accept_len_stuck_at_one", role="cause",
            meaning=f"Speculative decoding runs but the acceptance length stayed at exactly 1.00 in {ACCEPT_STREAK} "
                    "consecutive decode reports: no drafted token is ever accepted.")
        self._record(f)

    def _add(self, rule: Rule, text: str, evidence: str, lineno: int, group: int | None) -> None:
        severity, label, hardware = rule.severity, rule.label, False
        remedy, meaning, profile_key = rule.remedy, rule.meaning, rule.profile_key
        if rule.xid_hardware:
            m = _XID_RX.search(text)
            code = int(m.group(1)) if m else -1
            hardware = code in rule.xid_hardware
            if not hardware:
                severity = "warning"
                label = "illegal_memory_access" if code in (13, 31) else "unclassified_crash"
                remedy = "Application Xid: treat it as the software error it accompanies."
            else:
                remedy = (f"Hardware Xid {code}: do not roll back the software; drain the host and reset the GPU "
                          "(or reboot / service it).")
        if rule.label == "native_abort" and group is None and self._ctx.algorithm and self._spec_setting_just_before():
            # a native abort right after the server logged a speculative setting: that setting is the suspect
            named = _resolve_speculative_frame(self._ctx, text, [])
            label, profile_key = named["label"], named["profile_key"]
            remedy = "The process aborted in native code right after a speculative setting was logged. " + named["remedy"]
        if rule.resolve is not None:
            named = RESOLVERS[rule.resolve](self._ctx, text, self._tb.part if group is not None else [])
            label, remedy = named["label"], named["remedy"]
            meaning, profile_key = named.get("meaning", meaning), named.get("profile_key", profile_key)
        if rule.role in _SHUTDOWN_ROLES and severity in ("fatal", "warning") and self._buf:
            self._lookback()
        if self._ctx.stop_line is not None and rule.role in _SHUTDOWN_ROLES and severity in ("fatal", "warning"):
            severity = "benign"
            meaning = (f"Shutdown after the stop requested at line {self._ctx.stop_line}, not a crash. " + meaning).strip()
        held = group is not None and self._tb.open and rule.role in _HELD_ROLES
        if not held and self._per_rule.get(rule.id, 0) >= MAX_PER_RULE:
            # the rule has its examples: count this one without building it
            self._per_rule[rule.id] += 1
            self._suppressed[rule.id] = self._suppressed.get(rule.id, 0) + 1
            return
        frames: tuple[str, ...] = ()
        signature = ""
        if group is not None and self._tb.part and self._per_rule.get(rule.id, 0) < MAX_PER_RULE:
            inner = self._tb.innermost()
            frames = tuple(f.short() for f in inner)
            if rule.role == "backstop" and label == "unclassified_crash":
                signature = crash_signature(text, self._tb.part)
        f = Finding(label=label, severity=severity, line=lineno, text=text[:MAX_TEXT_CHARS],
                    evidence=evidence[:MAX_TEXT_CHARS], remedy=remedy, profile_key=profile_key,
                    direction=rule.direction, rule_id=rule.id, role=rule.role, meaning=meaning,
                    group=group, hardware=hardware, frames=frames, signature=signature)
        if held:
            # generic evidence waits for the end of its traceback, where a specific cause may follow
            self._pending.append(f)
        else:
            self._record(f)

    def _record(self, f: Finding) -> None:
        n = self._per_rule.get(f.rule_id, 0)
        self._per_rule[f.rule_id] = n + 1
        if n >= MAX_PER_RULE:
            self._suppressed[f.rule_id] = self._suppressed.get(f.rule_id, 0) + 1
            return
        self._findings.append(f)
        if f.severity == "fatal" and self._first_fatal is None:
            self._first_fatal = f

    def _pending_settled(self) -> list[Finding]:
        """Findings of a traceback still open at report time (the input ended inside it)."""
        out = list(self._pending)
        if self._tb.open and not any(f.role != "consequence" for f in out):
            start = self._tb.starts.get(self._tb.group, 0)
            rule = self._by_id["python_exception"]
            severity = "benign" if self._ctx.stop_line is not None else rule.severity
            out.append(Finding(label=rule.label, severity=severity, line=start, text=journal.TRACEBACK_HEADER,
                               evidence=journal.TRACEBACK_HEADER, remedy=rule.remedy, profile_key=None,
                               direction=None, rule_id=rule.id, role="backstop", meaning=rule.meaning,
                               group=self._tb.group, frames=tuple(f.short() for f in self._tb.innermost())))
        return out

    def _settle_group(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for f in pending:
            self._record(f)


# ------------------------------------------------------------------ root cause


def verdict_of(root: Finding | None, findings: list[Finding]) -> str:
    """DESIGN.md's verdicts: a root cause fails the start; warnings alone degrade it."""
    if root is not None:
        return "failed"
    return "degraded" if any(f.severity == "warning" for f in findings) else "healthy"


def choose_root(findings: list[Finding], group_starts: dict[int, int] | None = None,
                defer: dict[str, int] | None = None) -> Finding | None:
    """The first fatal event in time, read the way an engineer reads a log.

    Per event (a traceback, or a line outside any traceback) the most specific finding stands
    for it. Then: the first event with a cause; a wrapper yields to a cause inside it or within
    its `defer_within` lines; an NCCL/watchdog echo yields to an earlier unexplained crash;
    secondary symptoms explain the failure only when nothing else does.
    """
    fatal = [f for f in findings if f.severity == "fatal"]
    if not fatal:
        return None
    starts = group_starts or {}
    reps: dict[Any, Finding] = {}
    first_line: dict[Any, int] = {}
    for f in fatal:
        key = ("g", f.group) if f.group is not None else ("l", f.line)
        first_line[key] = min(first_line.get(key, f.line), starts.get(f.group, f.line) if f.group else f.line)
        cur = reps.get(key)
        if cur is None or (_ROLE_IN_GROUP.get(f.role, 4), f.line) < (_ROLE_IN_GROUP.get(cur.role, 4), cur.line):
            reps[key] = f
    events = sorted(reps.items(), key=lambda kv: (first_line[kv[0]], kv[1].line))
    causes = [(k, f) for k, f in events if _ROLE_CLASS.get(f.role) == 0]
    backstops = [(k, f) for k, f in events if _ROLE_CLASS.get(f.role) == 1]
    root: Finding | None = None
    if causes:
        key, root = causes[0]
        if root.role == "downstream":
            earlier = [f for k, f in backstops if first_line[k] < first_line[key]]
            if earlier:
                return earlier[0]
    elif backstops:
        root = backstops[0][1]
    else:
        root = events[0][1]
    return _deferred(root, fatal, (defer or {}).get(root.rule_id, 0))


def _deferred(root: Finding, fatal: list[Finding], window: int) -> Finding:
    """A wrapper or banner yields to the cause it announces (same traceback or the next lines)."""
    if root.role not in ("wrapper", "consequence"):
        return root
    for f in fatal:
        if f.line < root.line or f is root or f.role not in ("cause", "downstream"):
            continue
        same_group = root.group is not None and f.group == root.group
        if same_group or (window and f.line - root.line <= window):
            return f
    return root


# ------------------------------------------------------------------ entry points


def classify(lines: Iterable[str | bytes], catalogue: Catalogue | None = None) -> Report:
    """Classify whole lines (pure)."""
    sc = Scanner(catalogue)
    batch: list[str | bytes] = []
    for ln in lines:
        batch.append(ln)
        if len(batch) >= 8192:
            sc.feed(batch)
            batch = []
    if batch:
        sc.feed(batch)
    sc.finish()
    return sc.report()


def classify_bytes(data: bytes, catalogue: Catalogue | None = None) -> Report:
    sc = Scanner(catalogue)
    sc.feed_bytes(data)
    sc.finish()
    return sc.report()


def iter_blocks(stream: IO[bytes], size: int = 4 << 20) -> Iterator[bytes]:
    while True:
        block = stream.read(size)
        if not block:
            return
        yield block


def classify_stream(stream: IO[bytes], catalogue: Catalogue | None = None, block_size: int = 4 << 20) -> Report:
    """Classify a binary stream (a file, stdin) in blocks, without holding it in memory."""
    sc = Scanner(catalogue)
    for block in iter_blocks(stream, block_size):
        sc.feed_bytes(block)
    sc.finish()
    return sc.report()


# ------------------------------------------------------------------ files: the screen in parallel

PARALLEL_MIN_BYTES = 64 << 20  # below this a file is read in one process (forking costs more)
_WORKER: dict[str, Any] = {}


def _screen_chunk(job: tuple[str, int, int]) -> tuple[bytes, bytes, int]:
    """In a worker: the screen's hits in one newline-aligned slice of the file, with the block line
    index of each, and the slice's newline count (arrays as bytes: cheap to send back)."""
    from array import array

    path, start, end = job
    with open(path, "rb") as fh:
        data = os.pread(fh.fileno(), end - start, start)
    screen = _screen_for(_WORKER["cat"])
    hits = screen.hits(data)
    where = array("q")
    count = data.count
    prev, idx = 0, 0
    for h in hits:
        ls = data.rfind(b"\n", prev, h) + 1
        if ls > prev:
            idx += count(b"\n", prev, ls)
            prev = ls
        where.append(idx)
    return array("q", hits).tobytes(), where.tobytes(), data.count(b"\n")


def _chunks(path: str, size: int, n: int, step: int | None = None) -> list[tuple[int, int]]:
    """`n` slices of the file (or slices of `step` bytes) that end on a newline."""
    bounds = [0]
    step = step or max(1 << 20, size // n)
    with open(path, "rb") as fh:
        fd = fh.fileno()
        pos = step
        while pos < size:
            tail = os.pread(fd, 1 << 16, pos)
            nl = tail.find(b"\n")
            while nl < 0 and tail:
                pos += len(tail)
                tail = os.pread(fd, 1 << 16, pos)
                nl = tail.find(b"\n")
            if nl < 0:
                break
            cut = pos + nl + 1
            if cut > bounds[-1]:
                bounds.append(cut)
            pos = cut + step
    if bounds[-1] < size:
        bounds.append(size)
    return list(zip(bounds, bounds[1:]))


def classify_path(path: str, catalogue: Catalogue | None = None, workers: int | None = None,
                  min_bytes: int = PARALLEL_MIN_BYTES, chunk_bytes: int | None = None) -> Report:
    """Classify a file; a large text journal has its keyword screen run in `workers` processes.

    The screen is a pure function of the bytes, so slices of the file are screened at once in
    forked workers while this process runs the (sequential) scanner over their hits in order;
    the report is the one `classify_stream` gives. JSON journals, small files, pipes and one-CPU
    hosts are read in one process.
    """
    import multiprocessing
    from array import array

    cat = catalogue or load_catalogue()
    if workers is None:
        # the scanner itself needs a core: workers only pay where there are spare ones
        # (on a 2-CPU host they made a 200 MB journal slower, bench/results/diagnose.md)
        cpus = os.cpu_count() or 1
        workers = min(cpus - 1, 8) if cpus >= 4 and os.getloadavg()[0] < cpus - 1 else 1
    st = os.stat(path)
    with open(path, "rb") as fh:
        head = fh.read(65536)
        if (workers < 2 or st.st_size < min_bytes or not stat_is_regular(st.st_mode)
                or journal.looks_like_json_journal(head)):
            fh.seek(0)
            return classify_stream(fh, cat)
    _screen_for(cat)  # built before forking: the workers inherit it
    _WORKER["cat"] = cat
    jobs = [(path, s, e) for s, e in _chunks(path, st.st_size, workers * 4, chunk_bytes)]
    sc = Scanner(cat)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool, open(path, "rb") as fh:
        for (_, s, e), (hits_b, where_b, nl) in zip(jobs, pool.imap(_screen_chunk, jobs), strict=True):
            data = os.pread(fh.fileno(), e - s, s)
            hits, where = array("q"), array("q")
            hits.frombytes(hits_b)
            where.frombytes(where_b)
            sc.feed_screened(data, hits.tolist(), where.tolist(), nl)
    sc.finish()
    return sc.report()


def stat_is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)
