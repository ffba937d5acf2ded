"""`diagnose HOST`: what a live host says about its service, read through one `Host`.

Three layers, GCM style:
- argv builders (`cmd_*`): remote commands as data, tested as lists;
- pure parsers (`parse_*`): from each command's output to small observations;
- `diagnose_host(host, profile)`: runs the commands through the Host and combines the
  observations with the journal classification into one `LiveDiagnosis`.
A command that fails to run becomes a check with status "skip" or a finding, never a traceback.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ddtree_ops import memory, remote
from ddtree_ops.diagnose.classify import Finding, Report, Scanner, choose_root, load_catalogue, verdict_of
from ddtree_ops.diagnose.journal import parse_json_entry
from ddtree_ops.draftcheck import check_target_layer_ids as draft_layer_rule
from ddtree_ops.gpu import Gpu, GpuApp, parse_smi_apps, parse_smi_gpus

if TYPE_CHECKING:
    from ddtree_ops.host import Host
    from ddtree_ops.profile import Profile

UNIT_PROPS = ("Result", "ExecMainStatus", "NRestarts", "InvocationID", "ActiveState", "SubState",
              "MainPID", "ExecMainPID", "ExecMainCode", "LoadState")
PREVIOUS_STARTS = 3  # earlier invocations summarised
JOURNAL_LINES = 20000  # how far back previous invocations are looked for

# Run by the host's service.python with SGLANG_PLUGINS=ddtree: is DDTREE a DFlash-family algorithm
# there? Prints one JSON line; a failing import is reported in it, not raised.
PLUGIN_CHECK_SCRIPT = r'''
import json, sys, traceback
out = {"sglang": None, "registered": False, "dflash_family": None, "error": None}
try:
    import sglang
    out["sglang"] = getattr(sglang, "__version__", "unknown")
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    out["registered"] = True
    out["dflash_family"] = bool(algo.is_dflash_family())
except BaseException as exc:
    out["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
print(json.dumps(out))
'''


# ------------------------------------------------------------------ commands as data


def cmd_unit_state(unit: str) -> list[str]:
    return ["systemctl", "show", "-p", ",".join(UNIT_PROPS), "--", unit]


def cmd_exec_start(unit: str) -> list[str]:
    return ["systemctl", "show", "-p", "ExecStart", "--value", "--", unit]


def cmd_journal_invocation(unit: str, invocation: str) -> list[str]:
    # the service's own lines plus systemd's lines about this start of the unit
    return ["journalctl", "-o", "json", "--no-pager", f"_SYSTEMD_INVOCATION_ID={invocation}", "+",
            f"UNIT={unit}", f"INVOCATION_ID={invocation}"]


def cmd_journal_recent(unit: str, lines: int = JOURNAL_LINES) -> list[str]:
    return ["journalctl", "-u", unit, "-o", "json", "--no-pager", "-n", str(lines)]


def cmd_kernel_since(epoch: int | None) -> list[str]:
    if epoch is None:
        return ["journalctl", "-k", "-b", "-n", "2000", "-o", "short-iso", "--no-pager"]
    return ["journalctl", "-k", "--since", f"@{epoch}", "-o", "short-iso", "--no-pager"]


def cmd_gpus() -> list[str]:
    return remote.nvidia_smi_gpus()


def cmd_gpu_apps() -> list[str]:
    return remote.nvidia_smi_apps()


def cmd_service_pids(unit: str) -> list[str]:
    return ["systemctl", "show", "-p", "ControlGroup", "--value", "--", unit]


def cmd_plugin_check(python: str) -> list[str]:
    return ["env", "SGLANG_PLUGINS=ddtree", python, "-c", PLUGIN_CHECK_SCRIPT]


# ------------------------------------------------------------------ observations and parsers


@dataclass(frozen=True)
class UnitObs:
    active: str = "unknown"
    sub: str = "unknown"
    result: str = "unknown"
    main_status: int = 0
    main_code: str = ""
    main_pid: int = 0
    restarts: int = 0
    invocation: str = ""
    load: str = "unknown"  # LoadState: loaded, not-found (the unit is not installed), ...

    @property
    def known(self) -> bool:
        """systemd answered about an installed unit (not a host without systemd, not a missing unit)."""
        return self.active != "unknown" and self.load not in ("not-found", "unknown", "")

    @property
    def failed(self) -> bool:
        return self.active == "failed" or self.result not in ("success", "unknown", "")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _int(text: str | None) -> int:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return 0


def parse_unit_state(text: str) -> UnitObs:
    kv: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv[key.strip()] = value.strip()
    return UnitObs(active=kv.get("ActiveState", "unknown"), sub=kv.get("SubState", "unknown"),
                   result=kv.get("Result", "unknown"), main_status=_int(kv.get("ExecMainStatus")),
                   main_code=kv.get("ExecMainCode", ""), main_pid=_int(kv.get("MainPID")),
                   restarts=_int(kv.get("NRestarts")), invocation=kv.get("InvocationID", ""),
                   load=kv.get("LoadState", "loaded" if "ActiveState" in kv else "unknown"))


_ALGO = re.compile(r"--speculative-algorithm[= ]+([A-Za-z0-9_]+)")
_MODE_OF_ALGO = {"DDTREE": "ddtree-shadow", "DFLASH": "dflash", "NEXTN": "nextn", "EAGLE": "nextn", "EAGLE3": "nextn"}


def parse_mode(exec_start: str) -> str | None:
    """The profile mode a unit runs, from its ExecStart (`--speculative-algorithm X`)."""
    m = _ALGO.search(exec_start)
    return _MODE_OF_ALGO.get(m.group(1).upper()) if m else None


@dataclass(frozen=True)
class Entry:
    message: str
    invocation: str
    realtime_us: int
    pid: int


def parse_journal_entries(text: str) -> list[Entry]:
    out: list[Entry] = []
    for raw in text.splitlines():
        if not raw.lstrip().startswith("{"):
            continue
        e = parse_json_entry(raw)
        if e is None:
            continue
        for msg in e.messages:
            out.append(Entry(msg, e.invocation, e.realtime_us, e.pid))
    return out


def split_invocations(entries: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """Entries grouped by start of the unit, oldest first (systemd's own lines join their start)."""
    order: list[str] = []
    groups: dict[str, list[Entry]] = {}
    current = ""
    for e in entries:
        inv = e.invocation or current
        if not inv:
            continue
        current = inv
        if inv not in groups:
            groups[inv] = []
            order.append(inv)
        groups[inv].append(e)
    return [(inv, groups[inv]) for inv in order]


@dataclass(frozen=True)
class PluginObs:
    ran: bool
    sglang: str | None = None
    registered: bool = False
    dflash_family: bool | None = None
    error: str | None = None


def parse_plugin_check(stdout: str, stderr: str = "", rc: int = 0) -> PluginObs:
    for line in reversed(stdout.strip().splitlines()):
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict):
            return PluginObs(True, raw.get("sglang"), bool(raw.get("registered")), raw.get("dflash_family"),
                             raw.get("error"))
    detail = (stderr or stdout).strip()[-2000:] or f"exit status {rc}"
    return PluginObs(False, error=detail)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_target_layer_ids(draft_cfg: dict[str, Any] | None, target_cfg: dict[str, Any] | None) -> tuple[Check, Finding | None]:
    """The draft's dflash_config.target_layer_ids against what the target captures
    (`ddtree_ops.draftcheck.check_target_layer_ids`, the rule preflight uses too)."""
    res = draft_layer_rule(draft_cfg, target_cfg)
    check = Check("draft target_layer_ids", res.status, res.detail)
    if res.status in ("ok", "skip"):
        return check, None
    severity = "fatal" if res.status == "fail" else "warning"
    return check, _static_finding("spec_decode_misconfig", severity, res.detail)


def check_plugin(obs: PluginObs) -> tuple[Check, Finding | None]:
    name = "DDTREE registered as DFlash-family"
    if not obs.ran or (obs.sglang is None and obs.error):
        detail = f"cannot import sglang with service.python: {(obs.error or '').strip().splitlines()[-1:] or ['?']}"
        # the import error itself may name a library or ABI problem: classify it
        sub = _classify_text(obs.error or "")
        if sub is not None:
            return Check(name, "fail", detail), sub
        return Check(name, "fail", detail), _static_finding("spec_decode_misconfig", "fatal", detail,
                                                            profile_key="service.python")
    if not obs.registered:
        detail = f"DDTREE is not registered (plugin not loaded): {(obs.error or '').strip()[-300:]}"
        return Check(name, "fail", detail), _static_finding("spec_decode_misconfig", "fatal", detail,
                                                            profile_key="service.python")
    if not obs.dflash_family:
        detail = ("DDTREE is registered but is_dflash_family() is False: SGLang will not configure the target's "
                  "hidden-state capture (target_layer_ids), so the draft sees nothing")
        return Check(name, "fail", detail), _static_finding("hidden_capture_missing", "fatal", detail,
                                                            profile_key="service.python")
    return Check(name, "ok", f"sglang {obs.sglang}: DDTREE is DFlash-family"), None


def check_acceptance(report: Report, speculative: bool) -> tuple[Check, Finding | None]:
    name = "acceptance length > 1.00"
    vals = report.accept.recent
    if not speculative:
        return Check(name, "skip", "not a speculative mode"), None
    if not vals:
        return Check(name, "skip", "no decode reports with an accept length in this start's journal yet"), None
    if report.dummy_weights:
        return Check(name, "skip", "--load-format dummy: random weights accept no draft token, 1.00 is expected"), None
    last = vals[-min(len(vals), 5):]
    if all(v <= 1.0 for v in last):
        detail = f"the last {len(last)} decode reports all show accept len 1.00: no drafted token is accepted"
        return Check(name, "fail", detail), _static_finding("hidden_capture_missing", "fatal", detail,
                                                            profile_key="service.python")
    avg = sum(last) / len(last)
    return Check(name, "ok" if avg > 1.1 else "warn", f"recent accept len {', '.join(f'{v:.2f}' for v in last)}"), None


def _static_finding(label: str, severity: str, detail: str, profile_key: str | None = "modes.<mode>.draft_model_path",
                    rule_id: str = "") -> Finding:
    return Finding(label=label, severity=severity, line=0, text=detail, evidence=detail,
                   remedy=detail, profile_key=profile_key, direction=None, rule_id=rule_id or f"check_{label}", role="cause")


def gpu_visibility(root: Finding, profile: Profile, diag: LiveDiagnosis) -> Finding:
    """The server found fewer cards than it was started for: the cards the profile gives it and
    its ranks against the cards nvidia-smi lists on the host (the catalogue's `host` variant)."""
    given = [c.index for c in profile.gpus] if profile.gpus else None
    ranks = profile.ranks_per_node
    have = [g.index for g in diag.gpus]
    smi = next((c for c in diag.checks if c.name == "nvidia-smi"), None)
    if have:
        host_cards = f"{len(have)} card(s): " + ", ".join(f"{g.index}: {g.name}" for g in diag.gpus)
    else:
        host_cards = "no card nvidia-smi could list" + (f" ({smi.detail})" if smi is not None else "")
    missing = [i for i in (given or []) if i not in have]
    fixes = []
    if missing:
        fixes.append(f"gpus lists {missing}, which this host does not have")
    if have and ranks > len(have):
        fixes.append(f"{ranks} rank(s) need {ranks} cards and the host has {len(have)}: lower parallel.tp_size "
                     f"(x dp_size x pp_size) to {len(have)} or less, or use a host with {ranks} cards")
    if have and (missing or given is None or len(given) != ranks):
        fixes.append(f"gpus: {have[:max(1, min(ranks, len(have)))]} would name cards that exist")
    facts = {"given": f"gpus {given}" if given is not None else "no gpus list (every card visible)",
             "ranks": f"{ranks} rank(s) on this node (parallel.tp_size {profile.sizes.tp_size})",
             "host_cards": host_cards, "fix": "; ".join(fixes) or "compare the two"}
    v = load_catalogue().by_id["gpu_not_visible"].variant("host")
    meaning, remedy = v.filled(facts)
    return replace(root, meaning=meaning, remedy=remedy, profile_key=v.profile_key,
                   context="; ".join(x for x in (root.context, f"profile: {facts['given']}, {facts['ranks']}; "
                                                  f"host: {host_cards}") if x))


def _classify_text(text: str) -> Finding | None:
    if not text.strip():
        return None
    sc = Scanner()
    sc.feed(text.splitlines())
    sc.finish()
    rc = sc.report().root_cause
    return rc if rc is not None and rc.label != "unclassified_crash" else None


# ------------------------------------------------------------------ the combined diagnosis


@dataclass(frozen=True)
class Invocation:
    invocation: str
    report: Report
    first_us: int = 0

    def to_json(self) -> dict[str, Any]:
        rc = self.report.root_cause
        return {"invocation": self.invocation, "lines": self.report.lines, "verdict": self.report.verdict,
                "root_cause": None if rc is None else {"label": rc.label, "line": rc.line, "evidence": rc.evidence}}


@dataclass
class LiveDiagnosis:
    host: str
    unit_name: str
    unit: UnitObs
    mode: str | None
    current: Report
    previous: list[Invocation] = field(default_factory=list)
    kernel: Report | None = None
    gpus: list[Gpu] = field(default_factory=list)
    gpu_apps: list[GpuApp] = field(default_factory=list)
    service_pids: set[int] = field(default_factory=set)
    checks: list[Check] = field(default_factory=list)
    extra: list[Finding] = field(default_factory=list)  # from kernel, GPU and static checks
    errors: list[str] = field(default_factory=list)
    # each start's journal timestamps (us), line by line: when a finding's line was written, to
    # order the failures of a multi-node service's nodes on one clock
    line_us: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    current_invocation: str = ""
    unreadable: str = ""  # why neither the unit nor the journal could be read (the verdict is then unreadable)
    # the health endpoint, asked only when this start's journal shows no sign of serving and the
    # unit runs: (HTTP status or None, what it said)
    health: tuple[int | None, str] | None = None

    def when_us(self, invocation: str, line: int) -> int | None:
        times = self.line_us.get(invocation) or []
        return times[line - 1][0] if 0 < line <= len(times) else None

    def previous_failure(self) -> Finding | None:
        """The cause the start before this one failed with, when this start has none (after a
        rolled-back deploy, the host serves the known-good release and the failed start is the last
        one before it)."""
        last = self.previous[-1] if self.previous else None
        if last is None or last.report.root_cause is None or self.current.root_cause is not None:
            return None
        rc = last.report.root_cause
        # a note, not a warning: the verdict is this start's (issue 32: a host that serves healthy
        # after a failed start is HEALTHY, never DEGRADED, which the deploy contract keeps for
        # "not serving")
        return replace(rc, severity="info", rule_id="previous_start_failed",
                       text=f"the previous start ({last.invocation[:12]}) failed: {rc.text.strip()}")

    @property
    def serving(self) -> tuple[int, str] | None:
        """This start's evidence of serving: its journal's, else the health endpoint's 200."""
        if self.current.serving is not None:
            return self.current.serving
        if self.health is not None and self.health[0] == 200:
            return (0, "health endpoint")
        return None

    def combined(self) -> Report:
        """One report: hardware first, then the journal's own cause, then host and static evidence."""
        findings = [*self.current.findings, *self.extra]
        before = self.previous_failure()
        if before is not None:
            findings.append(before)
        if self.unreadable:
            # nothing was read: no verdict from nothing (DESIGN: diagnose exits 3, could not read)
            return replace(self.current, verdict="unreadable", root_cause=None, findings=findings)
        hardware = [f for f in self.extra if f.hardware and f.severity == "fatal"]
        root = (hardware[0] if hardware else self.current.root_cause
                or choose_root([f for f in self.extra if f.severity == "fatal"]))
        oom = next((f for f in self.extra if f.label == "host_oom" and f.severity == "fatal"), None)
        if root is not None and root.label == "killed_by_signal" and oom is not None:
            # the kernel's OOM killer ran since this start: that is who sent the SIGKILL
            root = replace(oom, context=f"the kernel log since this start; the journal's line {root.line}: "
                                        f"{root.text.strip()[:160]}")
        if root is None and self.unit.failed:
            root = Finding(label="unclassified_crash", severity="fatal", line=0,
                           text=f"unit failed: Result={self.unit.result}, ExecMainStatus={self.unit.main_status}",
                           evidence=f"Result={self.unit.result}", remedy="Read the journal of this start; no line names the cause.",
                           profile_key=None, direction=None, rule_id="unit_failed", role="consequence")
            findings.append(root)
        serving = self.serving if self.unit.active == "active" or not self.unit.known else None
        return replace(self.current, verdict=verdict_of(root, findings, serving is not None), root_cause=root,
                       findings=findings, serving=serving)

    def to_json(self) -> dict[str, Any]:
        return {
            **({"unreadable": self.unreadable} if self.unreadable else {}),
            "host": self.host, "unit": {"name": self.unit_name, **self.unit.to_json()}, "mode": self.mode,
            "previous_starts": [i.to_json() for i in self.previous],
            "kernel": None if self.kernel is None else {"verdict": self.kernel.verdict,
                                                       "findings": [f.to_json() for f in self.kernel.findings]},
            "gpu": {"gpus": [g.__dict__ for g in self.gpus], "processes": [a.__dict__ for a in self.gpu_apps]},
            "checks": [c.to_json() for c in self.checks],
            "errors": self.errors,
            **({"health": {"status": self.health[0], "detail": self.health[1]}} if self.health is not None else {}),
            **({"previous_start_failed": _brief(p)} if (p := self.previous_failure()) is not None else {}),
        }


def _brief(f: Finding) -> dict[str, Any]:
    return {"label": f.label, "line": f.line, "evidence": f.evidence, "text": f.text, "remedy": f.remedy,
            "profile_key": f.profile_key}


def _classify_entries(entries: list[Entry]) -> Report:
    sc = Scanner()
    sc.feed([e.message for e in entries])
    sc.finish()
    return sc.report()


def _read_json(host: Host, path: str) -> dict[str, Any] | None:
    try:
        data = host.get(path)
    except Exception:  # a transport error reads as "could not read"; the check says so
        return None
    if data is None:
        return None
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _pids_in_cgroup(host: Host, unit: str) -> set[int]:
    cg = host.run(cmd_service_pids(unit), timeout=20).stdout.strip()
    if not cg:
        return set()
    res = host.run(["cat", "--", f"/sys/fs/cgroup{cg}/cgroup.procs"], timeout=20)
    return {int(x) for x in res.stdout.split() if x.isdigit()}


def diagnose_host(host: Host, profile: Profile, mode: str | None = None) -> LiveDiagnosis:
    unit = profile.service.unit
    errors: list[str] = []
    state_res = host.run(cmd_unit_state(unit), timeout=20)
    u = parse_unit_state(state_res.stdout)
    if not state_res.ok:
        errors.append(f"systemctl show failed: {(state_res.stderr or state_res.stdout).strip()[-200:]}")
    if mode is None:
        mode = parse_mode(host.run(cmd_exec_start(unit), timeout=20).stdout)

    # this start's journal, and earlier starts for context
    recent = parse_journal_entries(host.run(cmd_journal_recent(unit), timeout=60).stdout)
    starts = split_invocations(recent)
    current_inv = u.invocation or (starts[-1][0] if starts else "")
    if current_inv:
        res = host.run(cmd_journal_invocation(unit, current_inv), timeout=60)
        entries = parse_journal_entries(res.stdout) if res.ok else []
        if not res.ok:
            errors.append(f"journalctl for invocation {current_inv} failed: {res.stderr.strip()[-200:]}")
        if not entries:
            entries = dict(starts).get(current_inv, [])
    else:
        entries = [e for _, es in starts[-1:] for e in es]
    current = _classify_entries(entries)
    previous = [Invocation(inv, _classify_entries(es), es[0].realtime_us if es else 0)
                for inv, es in starts if inv != current_inv][-PREVIOUS_STARTS:]
    journal_read = bool(entries or recent)
    if not journal_read:
        errors.append(f"journal: no line of {unit} could be read (journald not running, no permission to read "
                      "it, or the unit never logged)")

    if not u.known and not journal_read:
        why = "systemd did not answer about the unit" if u.active == "unknown" else f"{unit} is not installed"
        detail = (state_res.stderr or state_res.stdout).strip().splitlines()[-1:] if not state_res.ok else []
        unreadable = f"could not read {unit} ({why}{': ' + detail[0] if detail else ''}) nor its journal"
    else:
        unreadable = ""
    diag = LiveDiagnosis(host=host.name, unit_name=unit, unit=u, mode=mode, current=current, previous=previous,
                         errors=errors, current_invocation=current_inv, unreadable=unreadable,
                         line_us={**{inv: [(e.realtime_us, e.message) for e in es] for inv, es in starts},
                                  current_inv: [(e.realtime_us, e.message) for e in entries]})

    # kernel log since this start: OOM killer, Xid
    first_us = min((e.realtime_us for e in entries if e.realtime_us), default=0)
    kres = host.run(cmd_kernel_since(first_us // 1_000_000 if first_us else None), timeout=60, sudo=True)
    if kres.ok:
        sc = Scanner()
        sc.feed(kres.stdout.splitlines())
        sc.finish()
        diag.kernel = sc.report()
        diag.extra += [f for f in diag.kernel.findings if f.severity in ("fatal", "warning")]
    else:
        diag.checks.append(Check("kernel log", "skip", (kres.stderr or kres.stdout).strip()[-200:] or "journalctl -k failed"))

    # GPU snapshot; a failing nvidia-smi is evidence too (driver/library mismatch)
    gres = host.run(cmd_gpus(), timeout=30)
    if gres.ok:
        diag.gpus = parse_smi_gpus(gres.stdout)[0]
        diag.gpu_apps = parse_smi_apps(host.run(cmd_gpu_apps(), timeout=30).stdout)
        diag.service_pids = _pids_in_cgroup(host, unit) | ({u.main_pid} if u.main_pid else set())
        strays = [a for a in diag.gpu_apps if a.pid not in diag.service_pids]
        if strays:
            detail = ", ".join(f"pid {a.pid} {a.name} {a.used_mib} MiB" for a in strays)
            diag.checks.append(Check("GPU memory held by other processes", "warn", detail))
            diag.extra.append(Finding(label="cuda_oom", severity="warning", line=0,
                                      text=f"GPU memory held by processes outside the service: {detail}",
                                      evidence=detail, remedy="Stop the stray processes before the next start "
                                      "(memory they hold is not free for mem_fraction_static).",
                                      profile_key=None, direction=None, rule_id="gpu_strays", role="cause"))
    else:
        detail = (gres.stderr or gres.stdout).strip()[-300:] or f"exit status {gres.rc}"
        diag.checks.append(Check("nvidia-smi", "fail", detail))
        sub = _classify_text(detail)
        if sub is not None:
            diag.extra.append(sub)

    if not journal_read and u.known:
        # the unit answered, the journal did not: say that the verdict rests on the unit alone
        diag.extra.append(_static_finding("unclassified_crash", "warning", errors[-1], profile_key=None,
                                          rule_id="journal_unreadable"))
    if current.root_cause is not None and current.root_cause.rule_id == "gpu_not_visible":
        named = gpu_visibility(current.root_cause, profile, diag)
        diag.current = replace(current, root_cause=named,
                               findings=[named if f is current.root_cause else f for f in current.findings])
        current = diag.current
    if current.serving is None and u.active == "active":
        # the journal of this start shows no sign of serving (rotated, rate-limited, or still
        # starting): the health endpoint is the live reader's own evidence
        diag.health = probe_health(host, profile)
        diag.checks.append(Check("health endpoint", "ok" if diag.health[0] == 200 else "warn", diag.health[1]))
    if current.memory.kv_tokens and diag.gpus:
        diag.checks.append(check_memory(current, predict_memory(host, profile, mode, diag)))

    # static checks for DFlash-family modes
    speculative = mode in ("dflash", "ddtree-shadow")
    if speculative and mode is not None:
        try:
            draft_path = profile.mode(mode).draft_model_path
        except Exception:
            draft_path = None
        if draft_path:
            chk, f = check_target_layer_ids(_read_json(host, f"{draft_path}/config.json"),
                                            _read_json(host, f"{profile.service.model_path}/config.json"))
            diag.checks.append(chk)
            if f is not None:
                diag.extra.append(f)
    if mode == "ddtree-shadow":
        pres = host.run(cmd_plugin_check(profile.service.python), timeout=180)
        chk, f = check_plugin(parse_plugin_check(pres.stdout, pres.stderr, pres.rc))
        diag.checks.append(chk)
        if f is not None:
            diag.extra.append(f)
    chk, f = check_acceptance(current, speculative or mode == "nextn")
    diag.checks.append(chk)
    if f is not None and not any(x.label == "hidden_capture_missing" for x in current.findings):
        diag.extra.append(f)
    return diag


HEALTH_PATH = "/health_generate"  # SGLang's health check that runs a generation (the gate's first probe)


def probe_health(host: Host, profile: Profile) -> tuple[int | None, str]:
    """GET /health_generate on the service port through the host: (status or None, what it said)."""
    try:
        resp = host.http("GET", profile.service.port, HEALTH_PATH, timeout=profile.gate.http_timeout_s)
    except Exception as exc:  # HttpUnavailable, a transport error: no evidence either way, said so
        return None, f"{HEALTH_PATH} did not answer: {str(exc)[-200:]}"
    return resp.status, f"{HEALTH_PATH} answered {resp.status}"


def predict_memory(host: Host, profile: Profile, mode: str | None, diag: LiveDiagnosis) -> Any:
    """What preflight would predict for this start, from the same files and today's GPU."""
    target_cfg = _read_json(host, f"{profile.service.model_path}/config.json")
    if target_cfg is None or not diag.gpus:
        return None
    try:
        target = memory.model_shape(target_cfg)
        index = _read_json(host, f"{profile.service.model_path}/model.safetensors.index.json")
        draft_path = profile.mode(mode).draft_model_path if mode else None
        draft_cfg = _read_json(host, f"{draft_path}/config.json") if draft_path else None
    except Exception:  # an unconfigured mode or unreadable config: no prediction, not a crash
        return None
    # the draft's own KV pool has the target's token capacity, for EAGLE/NEXTN and DFlash alike
    draft_cell = memory.model_shape(draft_cfg).cell_bytes(profile.memory.kv_cache_dtype) if draft_cfg else 0
    gpu = diag.gpus[0]
    others = sum(a.used_mib for a in diag.gpu_apps if a.pid not in diag.service_pids)
    return memory.plan(gpu_total_mib=gpu.memory_total_mib, free_mib=gpu.memory_total_mib - others,
                       target=target, weights=memory.weights_bytes(target_cfg, index), draft_cell=draft_cell,
                       draft_weights=memory.draft_weights_bytes(draft_cfg, target) if draft_cfg else 0,
                       mem_fraction_static=profile.memory.mem_fraction_static,
                       context_length=profile.memory.context_length,
                       concurrency=profile.memory.max_running_requests, kv_cache_dtype=profile.memory.kv_cache_dtype,
                       page_size=profile.memory.page_size)


def check_memory(report: Report, plan: Any) -> Check:
    """SGLang's own KV sizing from its log against the preflight formula: a gap means an input
    the formula did not see (other processes, a different checkpoint, other settings)."""
    seen = report.memory.kv_tokens or 0
    if plan is None:
        return Check("KV pool vs preflight", "skip", f"SGLang sized {seen:,} tokens; no prediction (configs unreadable)")
    gap = abs(seen - plan.tokens) / max(plan.tokens, 1)
    detail = (f"SGLang sized the KV pool at {seen:,} tokens; the preflight formula predicts {plan.tokens:,} "
              f"({gap:.1%} apart)")
    if report.memory.available_gpu_mem_gb is not None:
        detail += f"; available_gpu_mem={report.memory.available_gpu_mem_gb:g} GB after startup"
    return Check("KV pool vs preflight", "ok" if gap <= 0.10 else "warn",
                 detail if gap <= 0.10 else detail + ": the server saw different inputs than the profile "
                 "describes (GPU memory held elsewhere, another checkpoint or other flags)")

