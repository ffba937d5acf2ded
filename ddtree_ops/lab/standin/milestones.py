"""Milestones of an SGLang server log, and how two logs are compared by them (stdlib only).

A milestone is a line that says where the server got to: a start-up phase, a memory figure, a CUDA
graph, the DFlash set-up, readiness, a failure's exception, a step of the shutdown. The table is data
(`MILESTONES`); `normalise` strips what differs between two runs of the same scenario (timestamps,
numbers, hex, paths, ports, pids), so that a milestone's identity is its normalised text.

The lab's conformance test compares the stand-in's log with the real log of the same scenario; the
device runs (bench/realsglang) can compare any new real log with the stand-in the same way:

    report = compare(real_text, standin_text)
    assert report.ok, report.explain()
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

# (name, category, pattern on the normalised line). Order does not matter: every line is matched
# against every pattern and belongs to the first that matches.
MILESTONES: tuple[tuple[str, str, str], ...] = (
    ("launcher_warning", "startup", r"launch_server\.py:N: UserWarning: 'python -m sglang\.launch_server' is still"),
    ("max_running_reset", "startup", r"^Max running requests is reset to N for speculative decoding\."),
    ("server_args", "startup", r"^server_args=ServerArgs\("),
    ("init_distributed", "startup", r"^Init torch distributed (begin|ends)\."),
    ("load_weight", "startup", r"^Load weight (begin|end)\."),
    ("kv_cache", "memory", r"^KV Cache is allocated\."),
    ("memory_pool_end", "memory", r"^Memory pool end\."),
    ("max_total_num_tokens", "memory", r"^max_total_num_tokens=N, "),
    ("dflash_runner", "dflash", r"^(Initialized DFLASH draft runner\.|DFLASH draft runner ready\.)"),
    ("dflash_fused_kv", "dflash", r"^DFLASH fused KV materialization"),
    ("draft_attention_backend", "dflash", r"^Overriding draft attention backend to "),
    ("graph_capture", "graphs", r"^Capture [a-z ]+ CUDA graph (begin|end)\."),
    ("graph_disabled", "graphs", r"^(Disable prefill CUDA graph|Disable DFLASH draft cuda graph)"),
    ("draft_head", "graphs", r"^DFLASH draft greedy head (folded into|kept eager)"),
    ("tree_cache", "startup", r"^Tree cache initialized: "),
    ("startup_timings", "startup", r"^Engine startup timings \(s\): "),
    ("uvicorn", "startup", r"^INFO: (Started server process|Waiting for application startup\.|"
                           r"Application startup complete\.|Uvicorn running on )"),
    ("ready", "ready", r"^The server is fired up and ready to roll!$"),
    ("scheduler_exception", "failure", r"^Scheduler hit an exception: Traceback"),
    ("exception", "failure", r"^(?:[a-z_]\w*\.)*(?:[A-Z]\w*Error|[A-Z]\w*Exception|Exception): "),
    ("launch_sigquit", "failure", r"^Received sigquit from a child process\."),
    ("sigterm", "shutdown", r"^SIGTERM received\. "),
    ("subprocess_crashed", "shutdown", r"^Subprocess \S+ \(pid=N\) crashed with exit code "),
    ("sigquit", "shutdown", r"^SIGQUIT received\. "),
    ("crash_diagnostics", "shutdown", r"^(Sleeping N seconds before crash diagnostics|No live scheduler processes)"),
    ("graceful_exit", "shutdown", r"^Gracefully exiting\.\.\. "),
    ("process_group_not_destroyed", "shutdown", r"ProcessGroupNCCL\.cpp:N\] Warning: WARNING: destroy_process_group"),
    ("kill_process_tree", "shutdown", r"^kill_process_tree called: "),
    # the ddtree plugin's own lines
    ("ddtree_registered", "plugin", r"^DDTREE plugin: "),
    ("ddtree_family", "plugin", r"^DDTREE registered as DFlash-family"),
    ("ddtree_shadow", "plugin", r"^DDTREE shadow: "),
)
# lines the stand-in may print that a real log lacks: the ddtree plugin's, whose newer lines (the
# registration, the capture layers, the reports, the silent warning) postdate the real logs
EXEMPT_CATEGORIES = frozenset({"plugin"})
_COMPILED = tuple((name, cat, re.compile(pat)) for name, cat, pat in MILESTONES)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z]+\d+)*\] ")
_JOURNAL = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^:\s\[]+(?:\[\d+\])?: ")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{12,}\b")
_PATH = re.compile(r"(?<![\w:/.])/(?:[^\s/'\",:()\[\]]+/)+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")
_KV_TOKENS = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+)")
# which child the launcher sees die first of the process group's SIGTERM is a race: run 6's two
# identical DFLASH servers (tests/data/real-sglang/0.5.17/6_tax_dflash*.log) reported the
# detokenizer in one and scheduler_0 in the other, so the child's name is not part of the milestone
_CHILD = re.compile(r"^Subprocess \S+ \(pid=")


def normalise(line: str) -> str:
    """A log line without what differs between runs: timestamps (SGLang's and journald's), colour,
    server_args' contents, hex, directories, numbers (ports, pids, sizes, times), runs of spaces."""
    s = _ANSI.sub("", line.rstrip("\n")).split("\r")[-1]
    s = _JOURNAL.sub("", s)
    s = _STAMP.sub("", s)
    if s.startswith("server_args=ServerArgs("):
        return "server_args=ServerArgs(...)"
    s = _CHILD.sub("Subprocess <child> (pid=", s)
    s = _HEX.sub("<hex>", s)
    s = _PATH.sub("<path>/", s)
    s = _NUMBER.sub("N", s)
    return _SPACES.sub(" ", s).strip()


@dataclass(frozen=True)
class Hit:
    name: str
    category: str
    key: str  # the normalised line: a milestone's identity
    lineno: int
    raw: str


def milestones(text: str) -> list[Hit]:
    hits = []
    for i, raw in enumerate(text.splitlines(), start=1):
        key = normalise(raw)
        for name, cat, pat in _COMPILED:
            if pat.search(key):
                hits.append(Hit(name, cat, key, i, raw))
                break
    return hits


def kv_tokens(text: str) -> list[int]:
    """Every `KV Cache is allocated. ... #tokens: N`, in order (the target's pool, then the draft's)."""
    return [int(m.group(1)) for m in _KV_TOKENS.finditer(text)]


@dataclass
class Report:
    real: list[Hit]
    standin: list[Hit]
    missing: list[tuple[Hit, Hit | None]] = field(default_factory=list)  # (real milestone, last one matched)
    extra: list[Hit] = field(default_factory=list)
    kv: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.kv)

    def explain(self, real_name: str = "real log", standin_name: str = "stand-in") -> str:
        out = []
        if self.missing:
            hit, after = self.missing[0]
            where = f"after its line {after.lineno} ({after.key!r})" if after else "at all"
            out.append(f"first milestone of the {real_name} that the {standin_name} does not print in order: "
                       f"line {hit.lineno} [{hit.name}]\n    {hit.raw.strip()[:300]}\n  not found {where}")
            if len(self.missing) > 1:
                out.append(f"  ({len(self.missing) - 1} more milestones missing after it)")
        for hit in self.extra[:5]:
            out.append(f"milestone the {real_name} lacks, printed by the {standin_name} at line {hit.lineno} "
                       f"[{hit.name}]:\n    {hit.raw.strip()[:300]}")
        if len(self.extra) > 5:
            out.append(f"  ({len(self.extra) - 5} more)")
        out.extend(self.kv)
        if self.missing or self.extra:
            diff = difflib.unified_diff([h.key for h in self.real],
                                        [h.key for h in self.standin if h.category not in EXEMPT_CATEGORIES],
                                        real_name, standin_name, lineterm="", n=2)
            out.append("milestones, normalised (- real only, + stand-in only):\n" + "\n".join(diff))
        return "\n".join(out)


def _collapse(hits: list[Hit]) -> list[Hit]:
    """The plugin's repeated lines (a shadow report every N rounds) once per run of them: how many
    a log has depends on the load it served, not on what the server does."""
    out: list[Hit] = []
    for h in hits:
        if out and h.category == "plugin" and out[-1].category == "plugin" and out[-1].key == h.key:
            continue
        out.append(h)
    return out


def compare(real_text: str, standin_text: str, *, kv_tolerance: float = 0.02) -> Report:
    """Every milestone of the real log in the stand-in's, in the same order; no milestone in the
    stand-in's that the real log lacks (the plugin's own lines excepted); each KV pool's token count
    within `kv_tolerance` of the real one."""
    real, ours = _collapse(milestones(real_text)), _collapse(milestones(standin_text))
    rep = Report(real, ours)
    j, last = 0, None
    for hit in real:
        k = j
        while k < len(ours) and ours[k].key != hit.key:
            k += 1
        if k == len(ours):
            rep.missing.append((hit, last))
            continue
        last, j = ours[k], k + 1
    keys = {h.key for h in real}
    rep.extra = [h for h in ours if h.key not in keys and h.category not in EXEMPT_CATEGORIES]
    want, got = kv_tokens(real_text), kv_tokens(standin_text)
    if len(want) != len(got):
        rep.kv.append(f"KV pools: the real log allocates {len(want)} ({want}), the stand-in {len(got)} ({got})")
    for w, g in zip(want, got):
        if abs(g - w) > kv_tolerance * w:
            rep.kv.append(f"KV pool #tokens: stand-in {g}, real {w} ({(g - w) / w:+.2%}, allowed ±{kv_tolerance:.0%})")
    return rep
