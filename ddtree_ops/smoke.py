"""Scheduled smoke checks that behave like monitoring plugins.

Shape (as everywhere in ddtree-ops): `observe_host` is the only part that talks to a host and it
only reads (systemctl show, the unit file's header, /health_generate, one /generate, /server_info,
/metrics); `judge` is a pure function from those observations and the profile's smoke thresholds
to a Nagios state with reasons and perfdata. Everything around it (status line, JSON, textfile
metrics, dead-man pings, the no-overlap lock, the small state file that remembers NRestarts and
golden outputs) is either pure rendering or a few lines of local I/O.

States follow the Nagios plugin contract: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, where UNKNOWN
means the check itself could not run (host unreachable, unit state unreadable, profile invalid).
Across hosts the overall state is the most severe one in Icinga's severity order
CRITICAL > UNKNOWN > WARNING > OK: a host we could not see at all may be down, which is worse than
a host we saw serving slowly, and never better than a host we saw broken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError, HttpUnavailable
from ddtree_ops.observe import UnitState
from ddtree_ops.status import NagiosExit

if TYPE_CHECKING:
    from ddtree_ops.profile import Profile, SmokeSection

PLUGIN = "DDTREE-SMOKE"
# Icinga's severity order; monitoring-plugins' max_state() would rank UNKNOWN below OK
SEVERITY = {NagiosExit.OK: 0, NagiosExit.WARNING: 1, NagiosExit.UNKNOWN: 2, NagiosExit.CRITICAL: 3}

# SGLang's --speculative-algorithm as /server_info reports it -> our mode names (NEXTN resolves to EAGLE)
ALGORITHM_MODES = {"NEXTN": "nextn", "EAGLE": "nextn", "EAGLE3": "nextn", "DFLASH": "dflash",
                   "DDTREE": "ddtree-shadow"}
# meta_info spellings across SGLang versions (facts/sglang-ddtree.md 3.5)
_ACCEPT_LEN_KEYS = ("spec_accept_length", "spec_accept_len")
_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")


def worst(states: Sequence[NagiosExit]) -> NagiosExit:
    return max(states, key=SEVERITY.__getitem__, default=NagiosExit.OK)


# ====================================================================== observations


@dataclass(frozen=True)
class HttpProbe:
    """One HTTP exchange: a status and a body, or the reason nothing usable came back."""

    status: int | None = None
    elapsed_s: float = 0.0
    error: str = ""
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


@dataclass(frozen=True)
class Generation:
    """What the smoke /generate answered, parsed (see `parse_generate`)."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    verify_ct: int | None = None
    accept_len: float | None = None
    spec_reported: bool = False  # any spec_* field in meta_info
    e2e_latency_s: float | None = None
    problem: str = ""  # a response that is not a usable completion


@dataclass(frozen=True)
class Golden:
    """The completion a check compares with: pinned in the profile (a prefix) or recorded (exact)."""

    text: str
    source: str  # "profile" or the recording it came from ("nextn on 2026-01-02T03:04:05Z")
    exact: bool
    stale: str = ""  # why a recording no longer applies (prompt, max tokens or model changed)


@dataclass(frozen=True)
class Previous:
    """What the last check of this host saw, from the state file."""

    restarts: int
    main_pid: int = 0
    invocation: str = ""
    checked_at: float = 0.0


@dataclass(frozen=True)
class Observation:
    host: str
    unit_name: str = ""
    mode: str | None = None  # from the installed unit's ddtree-ops header, else /server_info
    release: str | None = None
    connect_error: str = ""  # set: nothing else was observed
    profile_error: str = ""
    unit: UnitState | None = None
    unit_error: str = ""
    health: HttpProbe | None = None
    generate: HttpProbe | None = None
    generation: Generation | None = None
    algorithm: str | None = None  # speculative_algorithm from /server_info ("" = reported as none)
    server_accept_len: float | None = None  # /server_info internal_states avg_spec_accept_length
    metrics_accept_len: float | None = None  # /metrics sglang:spec_accept_length
    previous: Previous | None = None
    golden: Golden | None = None
    duration_s: float = 0.0  # the whole check, SSH connection included


# ====================================================================== pure parsers


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _acceptance(value: Any) -> float | None:
    """An acceptance length, or None: below 1 is impossible (the bonus token alone is 1), so a 0
    there is a gauge with nothing measured yet (an idle server), not a collapse."""
    x = _number(value)
    return x if x is not None and x >= 1.0 else None


def accept_length(meta: Mapping[str, Any]) -> float | None:
    """Acceptance length (tokens per verify step, bonus included) from /generate meta_info.

    Newer SGLang reports it directly; otherwise it is completion_tokens / spec_verify_ct, or
    1 + accepted drafts / verify steps where only the draft counters are there.
    """
    for key in _ACCEPT_LEN_KEYS:
        if (x := _acceptance(meta.get(key))) is not None:
            return x
    verify = _number(meta.get("spec_verify_ct"))
    if not verify:
        return None
    if (completion := _number(meta.get("completion_tokens"))) is not None:
        return _acceptance(completion / verify)
    for key in _ACCEPTED_KEYS:
        if (accepted := _number(meta.get(key))) is not None:
            return _acceptance(1.0 + accepted / verify)
    return None


def parse_generate(body: bytes) -> Generation:
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return Generation(problem=f"answered 200 with a non-JSON body: {body[:80]!r}")
    if isinstance(doc, list) and doc:  # a batched answer; we sent one prompt
        doc = doc[0]
    if not isinstance(doc, dict):
        return Generation(problem="answered 200 with JSON that is not an object")
    meta = doc.get("meta_info") if isinstance(doc.get("meta_info"), dict) else {}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):  # SGLang: {"type": "length", "length": 16}
        finish = finish.get("type")
    completion = _number(meta.get("completion_tokens"))
    verify = _number(meta.get("spec_verify_ct"))
    text = doc.get("text")
    return Generation(
        text=text if isinstance(text, str) else "",
        finish_reason=str(finish) if finish is not None else None,
        completion_tokens=int(completion) if completion is not None else None,
        verify_ct=int(verify) if verify is not None else None,
        accept_len=accept_length(meta),
        spec_reported=any(str(k).startswith("spec_") for k in meta),
        e2e_latency_s=_number(meta.get("e2e_latency")),
        problem="" if isinstance(text, str) else "answered without a text field",
    )


def parse_server_info(body: bytes) -> tuple[str | None, float | None]:
    """(speculative algorithm, mean recent acceptance length over the scheduler ranks)."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    algo = doc.get("speculative_algorithm")
    algorithm = None if "speculative_algorithm" not in doc else (
        "" if algo in (None, "", "NONE", "None") else str(algo).upper())
    values = [x for s in doc.get("internal_states") or [] if isinstance(s, dict)
              if (x := _acceptance(s.get("avg_spec_accept_length"))) is not None]
    return algorithm, (sum(values) / len(values) if values else None)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics_accept(text: str) -> float | None:
    """Mean of the `sglang:spec_accept_length` gauge over its series (one per rank)."""
    values = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == "sglang:spec_accept_length" and (x := _acceptance(m.group(3))) is not None:
            values.append(x)
    return sum(values) / len(values) if values else None


def parse_unit_header(text: str) -> tuple[str | None, str | None]:
    """(mode, release) from the first comment that render.py writes into every unit it installs."""
    for line in text.splitlines()[:5]:
        if line.startswith("# ddtree-ops") and "mode=" in line:
            fields = dict(w.split("=", 1) for w in line[1:].split() if "=" in w)
            return fields.get("mode"), fields.get("release")
    return None, None


# ====================================================================== the verdict


@dataclass(frozen=True)
class Check:
    name: str
    state: NagiosExit | None  # None: not run (says why in detail)
    detail: str
    reason: str = ""  # what goes on the status line when the state is not OK

    @property
    def status(self) -> str:
        return "skipped" if self.state is None else self.state.name.lower()


@dataclass(frozen=True)
class Perf:
    label: str
    value: float
    uom: str = ""
    warn: str = ""
    crit: str = ""
    min: str = ""

    def render(self) -> str:
        value = f"{self.value:.3f}".rstrip("0").rstrip(".") if self.uom == "s" else _fmt(self.value)
        tail = ";".join((self.warn, self.crit, self.min)).rstrip(";")
        label = self.label.replace("'", "''")  # the plugin guidelines' escape for a quote in a label
        return f"'{label}'={value}{self.uom}" + (f";{tail}" if tail else "")


@dataclass(frozen=True)
class HostResult:
    host: str
    mode: str | None
    state: NagiosExit
    checks: tuple[Check, ...]
    perfdata: tuple[Perf, ...]
    observation: Observation

    @property
    def reasons(self) -> list[str]:
        return [c.reason or c.detail for c in self.checks if c.state not in (None, NagiosExit.OK)]

    @property
    def served(self) -> bool:
        """The host answered a real request and nothing critical was found (OK or WARNING)."""
        return self.state in (NagiosExit.OK, NagiosExit.WARNING)

    def value(self, name: str) -> float | None:
        return next((p.value for p in self.perfdata if p.label == f"{self.host}_{name}"), None)


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _thr(x: float) -> str:
    return f"{x:g}"


def judge(obs: Observation, cfg: SmokeSection) -> HostResult:
    """The whole verdict for one host: pure, so every rule is tested on made-up observations."""
    h = obs.host
    checks: list[Check] = []
    perf: list[Perf] = []

    def done(extra: Sequence[Check] = ()) -> HostResult:
        allc = tuple(checks) + tuple(extra)
        state = worst([c.state for c in allc if c.state is not None])
        return HostResult(h, obs.mode, state, allc, tuple(perf), obs)

    if obs.profile_error:
        return done([Check("profile", NagiosExit.UNKNOWN, obs.profile_error, f"profile: {obs.profile_error}")])
    if obs.connect_error:
        why = obs.connect_error.removeprefix(f"{h}: ")
        return done([Check("connect", NagiosExit.UNKNOWN, obs.connect_error, f"unreachable: {why}")])

    # -- unit
    u = obs.unit
    if u is None:
        checks.append(Check("unit", NagiosExit.UNKNOWN, f"could not read the state of {obs.unit_name}: "
                                                       f"{obs.unit_error or 'no answer'}"))
    else:
        perf.append(Perf(f"{h}_restarts", u.restarts, "c"))
        if not u.exists:
            checks.append(Check("unit", NagiosExit.CRITICAL, f"{obs.unit_name} is not installed ({u.load})",
                                f"{obs.unit_name} not installed"))
        elif u.active != "active":
            checks.append(Check("unit", NagiosExit.CRITICAL, f"{obs.unit_name} is {u.describe()}",
                                f"unit {u.active}/{u.sub}" + (f" ({u.result})" if u.result not in
                                                              ("success", "", "unknown") else "")))
        else:
            checks.append(Check("unit", NagiosExit.OK, u.describe()))
        checks.append(_restarts_check(obs, u))

    # -- /health_generate: a real 1-token generation through the scheduler
    hp = obs.health
    if hp is None:
        checks.append(Check("health", None, "not asked"))
    elif hp.error:
        checks.append(Check("health", NagiosExit.CRITICAL, f"/health_generate: {hp.error}",
                            f"/health_generate {_short(hp.error)}"))
    elif hp.status != 200:
        checks.append(Check("health", NagiosExit.CRITICAL, f"/health_generate answered {hp.status}",
                            f"/health_generate HTTP {hp.status}"))
    else:
        checks.append(Check("health", NagiosExit.OK, f"/health_generate 200 in {hp.elapsed_s:.2f}s"))
        perf.append(Perf(f"{h}_health", hp.elapsed_s, "s"))

    # -- the smoke request
    gp, gen = obs.generate, obs.generation
    if gp is None:
        why = "health check failed" if hp is not None and not hp.ok else "not asked"
        checks += [Check("generate", None, why), Check("accept_len", None, why)]
        return done()
    if gp.error:
        checks.append(Check("generate", NagiosExit.CRITICAL, f"/generate: {gp.error}",
                            f"/generate {_short(gp.error)}"))
        checks.append(Check("accept_len", None, "no completion"))
        return done()
    if gp.status != 200:
        body = gp.body[:120].decode("utf-8", "replace")
        checks.append(Check("generate", NagiosExit.CRITICAL, f"/generate answered {gp.status}: {body}",
                            f"/generate HTTP {gp.status}"))
        checks.append(Check("accept_len", None, "no completion"))
        return done()
    assert gen is not None
    perf.append(Perf(f"{h}_latency", gp.elapsed_s, "s", _thr(cfg.latency_warning_s), _thr(cfg.latency_critical_s), "0"))
    checks.append(_generate_check(gp, gen, cfg))
    if gen.problem or not gen.text.strip():
        checks.append(Check("accept_len", None, "no completion"))
        return done()
    checks.append(_accept_check(obs, gen, cfg, perf))
    checks.append(_golden_check(obs.golden, gen.text))
    return done()


_HTTP_PREFIX = re.compile(r"^(?:[\w.-]+: )?(?:(?:GET|POST) \S+ on port \d+ )?")


def _short(error: str) -> str:
    """An HttpUnavailable message without the host name and request, for the status line."""
    text = _HTTP_PREFIX.sub("", error, count=1)
    return text if len(text) <= 60 else text[:57] + "..."


def _restarts_check(obs: Observation, u: UnitState) -> Check:
    prev = obs.previous
    if prev is None:
        return Check("restarts", NagiosExit.OK, f"NRestarts={u.restarts} (no earlier check to compare with)")
    if u.restarts > prev.restarts:
        n = u.restarts - prev.restarts
        return Check("restarts", NagiosExit.WARNING,
                     f"systemd restarted {obs.unit_name} {n}x since the last check (NRestarts {prev.restarts} -> "
                     f"{u.restarts}): it crashed and came back", f"restarted {n}x since last check")
    if prev.main_pid and u.main_pid and u.main_pid != prev.main_pid:
        # a deploy or a manual restart changes MainPID without counting in NRestarts: not a crash
        return Check("restarts", NagiosExit.OK, f"NRestarts={u.restarts}; started again by hand since the last "
                                                f"check (pid {prev.main_pid} -> {u.main_pid})")
    return Check("restarts", NagiosExit.OK, f"NRestarts={u.restarts}, unchanged since the last check")


def _generate_check(gp: HttpProbe, gen: Generation, cfg: SmokeSection) -> Check:
    if gen.problem:
        return Check("generate", NagiosExit.CRITICAL, f"/generate {gen.problem}", f"/generate {gen.problem}")
    if not gen.text.strip():
        return Check("generate", NagiosExit.CRITICAL, "/generate returned an empty completion",
                     "empty completion")
    took = f"{gp.elapsed_s:.2f}s"
    tokens = f", {gen.completion_tokens} tokens" if gen.completion_tokens is not None else ""
    detail = f"/generate {took}{tokens}, finish {gen.finish_reason or '?'}: {gen.text[:60]!r}"
    if gp.elapsed_s > cfg.latency_critical_s:
        return Check("generate", NagiosExit.CRITICAL, detail, f"latency {took} > {_thr(cfg.latency_critical_s)}s")
    if gp.elapsed_s > cfg.latency_warning_s:
        return Check("generate", NagiosExit.WARNING, detail, f"latency {took} > {_thr(cfg.latency_warning_s)}s")
    return Check("generate", NagiosExit.OK, detail)


def _accept_check(obs: Observation, gen: Generation, cfg: SmokeSection, perf: list[Perf]) -> Check:
    expected = obs.mode is not None or bool(obs.algorithm)
    sources = [("request", gen.accept_len), ("server avg", obs.server_accept_len),
               ("/metrics", obs.metrics_accept_len)]
    seen = [(name, x) for name, x in sources if x is not None]
    if not seen:
        if gen.verify_ct == 0 and (gen.completion_tokens or 0) > 1:
            return Check("accept_len", NagiosExit.CRITICAL,
                         f"spec_verify_ct is 0 for {gen.completion_tokens} tokens: no speculative verify step ran",
                         "no speculative verify steps (draft path broken)")
        if not expected:  # every mode we deploy speculates; a server of unknown origin may not
            return Check("accept_len", None, "the server does not run speculative decoding")
        return Check("accept_len", NagiosExit.WARNING,
                     "no acceptance length reported (no spec_* fields in meta_info, none in /server_info or "
                     "/metrics): cannot tell whether the draft path works", "accept_len not reported")
    # the request's own figure leads the perfdata: it is the freshest; server figures average over time
    perf.append(Perf(f"{obs.host}_accept_len", seen[0][1], "", f"{_thr(cfg.accept_len_warning)}:",
                     f"{_thr(cfg.accept_len_critical)}:", "0"))
    detail = ", ".join(f"{x:.2f} ({name})" for name, x in seen)
    judged = []
    for name, x in seen:
        label = "accept_len" if name == "request" else f"accept_len {name}"
        if x < cfg.accept_len_critical:
            judged.append((NagiosExit.CRITICAL, f"{label} {x:.2f} < {_thr(cfg.accept_len_critical)} (draft path broken)"))
        elif x < cfg.accept_len_warning:
            judged.append((NagiosExit.WARNING, f"{label} {x:.2f} < {_thr(cfg.accept_len_warning)}"))
    if not judged:
        return Check("accept_len", NagiosExit.OK, detail)
    state = worst([s for s, _ in judged])
    # the status line names the freshest source at the worst state; the detail lists them all
    return Check("accept_len", state, detail, next(r for s, r in judged if s == state))


def _golden_check(golden: Golden | None, text: str) -> Check:
    if golden is None:
        return Check("golden", None, "no golden output (profile smoke.golden or smoke --record-golden)")
    if golden.stale:
        return Check("golden", None, f"the recorded golden output no longer applies ({golden.stale}); "
                                     "record it again with --record-golden")
    if golden.exact:
        same, where = text == golden.text, _first_difference(text, golden.text)
    else:  # a pinned prefix from the profile; leading whitespace is tokenizer noise, not content
        same = text.lstrip().startswith(golden.text.lstrip())
        where = _first_difference(text.lstrip()[:len(golden.text.lstrip())], golden.text.lstrip())
    if same:
        return Check("golden", NagiosExit.OK, f"matches the golden output ({golden.source})")
    # WARNING, not CRITICAL: greedy speculative outputs are not bitwise stable across algorithms
    # (batched verification numerics), so a difference is a lead to follow, not proof of breakage.
    return Check("golden", NagiosExit.WARNING, f"output differs from the golden output ({golden.source}) {where}",
                 "output differs from golden")


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at character {i}: got {a[i:i + 20]!r}, expected {b[i:i + 20]!r}"


# ====================================================================== rendering


def status_line(results: Sequence[HostResult]) -> str:
    """The one Nagios line: state, per-host summary, then all perfdata after `|`."""
    overall = worst([r.state for r in results])
    parts = [f"{r.host}: " + ("OK" if r.state is NagiosExit.OK else ", ".join(r.reasons) or r.state.name)
             for r in results]
    perf = " ".join(p.render() for r in results for p in r.perfdata)
    line = f"{PLUGIN} {overall.name} - " + ("; ".join(parts) or "no hosts")
    # '|' would start the perfdata early; Nagios has no escape for it
    line = line.replace("|", "/")
    return f"{line} | {perf}" if perf else line


def detail_lines(results: Sequence[HostResult]) -> list[str]:
    """Nagios long output: one block per host, one line per check."""
    out = []
    for r in results:
        mode = f" [{r.mode}]" if r.mode else ""
        out.append(f"{r.host}{mode}: {r.state.name} ({r.observation.duration_s:.2f}s)")
        for c in r.checks:
            out.append(f"  {c.name}: {c.status.upper()} {c.detail}".replace("|", "/"))
    return out


def to_json(results: Sequence[HostResult], *, started_at: str, finished_at: str) -> dict[str, Any]:
    overall = worst([r.state for r in results])
    return {
        "command": "smoke", "result": overall.name.lower(), "exit_code": int(overall),
        "summary": status_line(results).split(" | ")[0], "started_at": started_at, "finished_at": finished_at,
        "hosts": [{
            "host": r.host, "mode": r.mode, "release": r.observation.release, "result": r.state.name.lower(),
            "exit_code": int(r.state), "reasons": r.reasons, "duration_ms": round(r.observation.duration_s * 1000),
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in r.checks],
            "metrics": {p.label.removeprefix(f"{r.host}_"): p.value for p in r.perfdata},
            "unit": asdict(r.observation.unit) if r.observation.unit else None,
        } for r in results],
    }


# ====================================================================== observing one host


def observe_host(host: Host, p: Profile, *, previous: Previous | None = None,
                 golden: Golden | None = None) -> Observation:
    """Read-only: every call below asks; nothing restarts, writes or flushes anything.

    A failed probe becomes part of the observation (a verdict's input); only a lost SSH
    connection escapes, and the caller turns it into UNKNOWN.
    """
    from ddtree_ops import observe

    port, unit_name = p.service.port, p.service.unit
    obs = Observation(host=p.name, unit_name=unit_name, previous=previous, golden=golden)
    try:
        unit = observe.unit_state(host, unit_name)
        obs = replace(obs, unit=unit) if unit.load != "unknown" else replace(obs, unit_error="systemctl show said nothing")
    except HostError:
        raise
    except (OpsError, OSError) as exc:  # e.g. the command timed out: this check could not run
        obs = replace(obs, unit_error=str(exc))
    if obs.unit is not None and obs.unit.fragment:
        with contextlib.suppress(OpsError, OSError):
            head = host.get(obs.unit.fragment)
            mode, release = parse_unit_header(head.decode("utf-8", "replace")) if head else (None, None)
            obs = replace(obs, mode=mode, release=release)

    health = _probe(host, "GET", port, "/health_generate", timeout=p.gate.http_timeout_s)
    obs = replace(obs, health=health)
    if not health.ok:  # a hung or dead server would only make every further probe wait out its timeout
        return obs

    body = {"text": p.smoke.prompt, "sampling_params": {"temperature": 0, "max_new_tokens": p.smoke.max_new_tokens}}
    # past the critical budget the answer is CRITICAL whatever it says; one more second tells how late
    gen_probe = _probe(host, "POST", port, "/generate", body=body, timeout=p.smoke.latency_critical_s + 1.0)
    obs = replace(obs, generate=gen_probe, generation=parse_generate(gen_probe.body) if gen_probe.ok else None)

    info = _probe(host, "GET", port, "/server_info", timeout=5.0)
    if info.status == 404:  # SGLang before /server_info
        info = _probe(host, "GET", port, "/get_server_info", timeout=5.0)
    algorithm, server_accept = parse_server_info(info.body) if info.ok else (None, None)
    metrics = _probe(host, "GET", port, "/metrics", timeout=5.0)
    metrics_accept = parse_metrics_accept(metrics.body.decode("utf-8", "replace")) if metrics.ok else None
    mode = obs.mode or (ALGORITHM_MODES.get(algorithm or "") if algorithm else None)
    return replace(obs, mode=mode, algorithm=algorithm, server_accept_len=server_accept,
                   metrics_accept_len=metrics_accept)


def _probe(host: Host, method: str, port: int, path: str, *, body: Any = None, timeout: float) -> HttpProbe:
    t0 = time.monotonic()
    try:
        resp = host.http(method, port, path, body=body, timeout=timeout)
    except HttpUnavailable as exc:
        return HttpProbe(error=str(exc), elapsed_s=time.monotonic() - t0)
    return HttpProbe(resp.status, resp.elapsed_s, body=resp.body)


# ====================================================================== many hosts, in parallel

Connect = Callable[["Profile"], Any]  # returns a context manager yielding a Host


@dataclass(frozen=True)
class Target:
    """One host to check: its profile, or why there is none."""

    name: str
    profile: Profile | None = None
    error: str = ""


def check_host(target: Target, connect: Connect, *, state: StateStore | None = None,
               record: bool = False) -> HostResult:
    t0 = time.monotonic()
    if target.profile is None:
        return judge(Observation(host=target.name, profile_error=target.error), _default_smoke())
    p = target.profile
    previous = state.previous(p.name) if state else None
    golden = None if record or state is None else state.golden_for(p)
    try:
        with connect(p) as host:
            obs = observe_host(host, p, previous=previous, golden=golden)
    except HostError as exc:
        obs = Observation(host=p.name, unit_name=p.service.unit, connect_error=str(exc))
    except Exception as exc:  # noqa: BLE001 - a plugin that crashes exits 1, which Nagios reads as WARNING
        why = str(exc) if isinstance(exc, OpsError) else f"{type(exc).__name__}: {exc}"
        obs = Observation(host=p.name, unit_name=p.service.unit, connect_error=f"check could not finish: {why}")
    obs = replace(obs, duration_s=time.monotonic() - t0)
    return judge(obs, p.smoke)


def _default_smoke() -> SmokeSection:
    from ddtree_ops.profile import SmokeSection

    return SmokeSection()


def check_hosts(targets: Sequence[Target], connect: Connect, *, jobs: int = 0,
                state: StateStore | None = None, record: bool = False) -> list[HostResult]:
    """Each host on its own thread with its own SSH connection; results in the order given.

    jobs=1 checks one host after the other (the benchmark's baseline); 0 means all at once.
    """
    workers = max(1, min(len(targets), jobs or len(targets)))

    def one(t: Target) -> HostResult:
        return check_host(t, connect, state=state, record=record)

    if workers == 1:
        return [one(t) for t in targets]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="smoke") as pool:
        return list(pool.map(one, targets))


# ====================================================================== state kept between runs


def default_state_dir() -> Path:
    """$DDTREE_OPS_STATE_DIR, else the XDG state home: the timer (User= sets HOME) and the
    operator's own runs share one memory of NRestarts and golden outputs."""
    if os.environ.get("DDTREE_OPS_STATE_DIR"):
        return Path(os.environ["DDTREE_OPS_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "ddtree-ops"


class StateStore:
    """NRestarts per host between runs (restarts rising = WARNING) and recorded golden outputs.

    Lives on the control machine; written only under the run lock, so runs never race on it.
    A missing or unreadable file means "no earlier check", never a failed one.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._hosts: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((directory / "smoke-state.json").read_text())
            self._hosts = dict(doc.get("hosts", {}))

    def previous(self, host: str) -> Previous | None:
        h = self._hosts.get(host)
        if not isinstance(h, dict) or "restarts" not in h:
            return None
        return Previous(int(h["restarts"]), int(h.get("main_pid", 0)), str(h.get("invocation", "")),
                        float(h.get("checked_at", 0)))

    def update(self, results: Sequence[HostResult], now: float) -> None:
        for r in results:
            u = r.observation.unit
            if u is not None:
                self._hosts[r.host] = {"restarts": u.restarts, "main_pid": u.main_pid,
                                       "invocation": u.invocation, "checked_at": now}
        doc = {"schema_version": 1, "hosts": self._hosts}
        write_atomic(self.dir / "smoke-state.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")

    # -- golden outputs (shadow replay)

    def golden_path(self, host: str) -> Path:
        return self.dir / "golden" / f"{host}.json"

    def golden_for(self, p: Profile) -> Golden | None:
        if p.smoke.golden:
            return Golden(p.smoke.golden, "profile smoke.golden", exact=False)
        try:
            rec = json.loads(self.golden_path(p.name).read_text())
        except (OSError, ValueError):
            return None
        source = f"recorded on {rec.get('mode') or '?'} at {rec.get('recorded_at', '?')}"
        stale = [what for what, now, then in (
            ("prompt", p.smoke.prompt, rec.get("prompt")), ("max_new_tokens", p.smoke.max_new_tokens,
                                                            rec.get("max_new_tokens")),
            ("model", p.service.model_path, rec.get("model_path"))) if now != then]
        return Golden(str(rec.get("text", "")), source, exact=True,
                      stale=", ".join(f"{w} changed" for w in stale))

    def record_golden(self, p: Profile, result: HostResult, when: str) -> Path | None:
        """Keep what the host answered now as the output every later check must reproduce."""
        gen = result.observation.generation
        if gen is None or gen.problem or not gen.text.strip():
            return None
        rec = {"schema_version": 1, "host": p.name, "mode": result.mode, "release": result.observation.release,
               "model_path": p.service.model_path, "prompt": p.smoke.prompt,
               "max_new_tokens": p.smoke.max_new_tokens, "text": gen.text, "recorded_at": when}
        path = self.golden_path(p.name)
        write_atomic(path, json.dumps(rec, indent=2) + "\n")
        return path


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Temp file in the same directory, fsync, rename: readers see the old file or the new one.

    The temp name does not end in `.prom`, so node_exporter never reads a half-written file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ====================================================================== textfile collector

_METRICS = {
    "ddtree_smoke_success": "1 when the host served the smoke request with nothing critical (OK or WARNING), else 0.",
    "ddtree_smoke_state": "Nagios state of the last smoke check: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.",
    "ddtree_smoke_latency_seconds": "Wall time of the smoke /generate request.",
    "ddtree_smoke_accept_length": "Speculative acceptance length of the smoke request (tokens per verify step).",
    "ddtree_smoke_unit_restarts": "systemd NRestarts of the SGLang unit.",
    "ddtree_smoke_duration_seconds": "Wall time of the whole check of the host.",
    "ddtree_smoke_last_run_timestamp_seconds": "When the host was last checked.",
    "ddtree_smoke_last_success_timestamp_seconds": "When the host last passed (kept from the previous file on failure).",
}
_LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def read_prom(text: str) -> list[Sample]:
    """Our own samples back from a textfile we wrote (enough of the exposition format for that)."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith("ddtree_smoke_"):
            continue
        labels = tuple((k, bytes(v, "utf-8").decode("unicode_escape")) for k, v in _LABELS.findall(m.group(2) or ""))
        if (x := _number(m.group(3))) is not None:
            out.append(Sample(m.group(1), labels, x))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prom(results: Sequence[HostResult], previous: Sequence[Sample], now: float) -> str:
    """This run's samples, plus every sample of hosts this run did not check (one file can serve
    several timers), plus the last success time of hosts that failed now."""
    checked = {r.host for r in results}
    samples = [s for s in previous if s.label("host") not in checked]
    for r in results:
        old_mode = next((s.label("mode") for s in previous if s.label("host") == r.host), None)
        labels = (("host", r.host), ("mode", r.mode or old_mode or "unknown"))
        values: dict[str, float | None] = {
            "ddtree_smoke_success": 1.0 if r.served else 0.0,
            "ddtree_smoke_state": float(int(r.state)),
            "ddtree_smoke_latency_seconds": r.value("latency"),
            "ddtree_smoke_accept_length": r.value("accept_len"),
            "ddtree_smoke_unit_restarts": r.value("restarts"),
            "ddtree_smoke_duration_seconds": r.observation.duration_s,
            "ddtree_smoke_last_run_timestamp_seconds": now,
        }
        if r.served:
            values["ddtree_smoke_last_success_timestamp_seconds"] = now
        else:
            kept = [s.value for s in previous if s.name == "ddtree_smoke_last_success_timestamp_seconds"
                    and s.label("host") == r.host]
            values["ddtree_smoke_last_success_timestamp_seconds"] = max(kept) if kept else None
        samples += [Sample(name, labels, v) for name, v in values.items() if v is not None]
    lines = []
    for name, help_text in _METRICS.items():
        mine = sorted((s for s in samples if s.name == name), key=lambda s: s.labels)
        if not mine:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels) + "} " + repr(float(s.value))
                  for s in mine]
    return "\n".join(lines) + "\n"


def write_prom(path: Path, results: Sequence[HostResult], now: float) -> None:
    try:
        previous = read_prom(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        previous = []
    except (OSError, UnicodeDecodeError) as exc:
        raise OpsError(f"cannot read the existing textfile {path}: {exc}") from None
    write_atomic(path, render_prom(results, previous, now))


# ====================================================================== dead-man pings


class Pinger:
    """healthchecks.io-style pings: `/start` when a run begins, `/<exit code>` when it ends.

    Each ping runs on a daemon thread and is waited for at most `timeout` seconds, so a dead
    ping endpoint adds at most about two seconds to a run and can never change its exit code.
    A run id pairs the start with its end when runs of the same check overlap elsewhere.
    """

    def __init__(self, url: str, *, timeout: float = 2.0, on_error: Callable[[str], None] | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.rid = str(uuid.uuid4())
        self.on_error = on_error
        self._start: threading.Thread | None = None
        self._t_start = 0.0

    def _target(self, suffix: str) -> str:
        parts = urllib.parse.urlsplit(self.url)
        path = parts.path.rstrip("/") + "/" + suffix
        query = "&".join(q for q in (parts.query, f"rid={self.rid}") if q)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))

    def _send(self, suffix: str, body: bytes) -> None:
        url = self._target(suffix)
        try:
            req = urllib.request.Request(url, data=body, method="POST",
                                         headers={"User-Agent": "ddtree-ops smoke", "Content-Type": "text/plain"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - operator-given URL
                resp.read(1024)
        except Exception as exc:  # noqa: BLE001 - any failure of a ping is only worth a warning
            if self.on_error:
                self.on_error(f"ping {url} failed: {exc}")

    def _spawn(self, suffix: str, body: bytes) -> threading.Thread:
        t = threading.Thread(target=self._send, args=(suffix, body), daemon=True, name=f"ping-{suffix}")
        t.start()
        return t

    def start(self) -> None:
        """Sent in the background: the checks do not wait for it."""
        self._t_start = time.monotonic()
        self._start = self._spawn("start", b"")

    def finish(self, exit_code: int, body: str) -> None:
        """Waits at most `timeout` (plus half a second for the last ping) in all."""
        end = time.monotonic() + self.timeout
        if self._start is not None:  # keep /start before /<rc> when it is merely slow
            self._start.join(max(0.0, min(end, self._t_start + self.timeout) - time.monotonic()))
        last = self._spawn(str(exit_code), body.encode("utf-8", "replace")[:10_000])
        last.join(max(0.5, end - time.monotonic()))


# ====================================================================== no overlap


LOCK_PATH = "/run/lock/ddtree-smoke.lock"


def default_lock_path() -> Path:
    """/run/lock (not /tmp: tmp cleaners and PrivateTmp= would split or delete the lock)."""
    if os.environ.get("DDTREE_OPS_SMOKE_LOCK"):
        return Path(os.environ["DDTREE_OPS_SMOKE_LOCK"])
    if os.access(os.path.dirname(LOCK_PATH), os.W_OK):
        return Path(LOCK_PATH)
    if os.environ.get("XDG_RUNTIME_DIR") and os.access(os.environ["XDG_RUNTIME_DIR"], os.W_OK):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "ddtree-smoke.lock"
    return Path(tempfile.gettempdir()) / f"ddtree-smoke-{os.getuid()}.lock"


@dataclass
class RunLock:
    """`flock -n` in process. Held by the open file description, so the kernel drops it when the
    process dies however it dies: no stale lock files to clean up.

    Under cron's `flock -n LOCK ddtree-ops smoke ...` wrapper we inherit a descriptor that already
    holds the very same lock; we take that one over instead of skipping ourselves.
    """

    path: Path
    holder: str = ""  # who holds it, when we did not get it
    _fd: int | None = field(default=None, repr=False)

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        inherited = _inherited_fd(self.path)
        fd = inherited if inherited is not None else _open_lock(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            with contextlib.suppress(OSError):
                self.holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            if inherited is None:
                os.close(fd)
            return False
        self._fd = fd
        with contextlib.suppress(OSError):  # who holds it, for the message of a skipped run
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        return True

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        got = self.acquire()
        try:
            yield got
        finally:
            if got:
                self.release()


def _open_lock(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except PermissionError:
        # another user's lock file in sticky /run/lock: a read-only descriptor locks just as well
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _inherited_fd(path: Path) -> int | None:
    try:
        target = os.stat(path)
    except OSError:
        return None
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        with contextlib.suppress(OSError):
            # a descriptor this process opened itself is close-on-exec (see _open_lock); one that
            # flock(1) passed down is not
            if fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return fd
    return None


# ====================================================================== one run, end to end


def load_targets(names: Sequence[str], *, all_hosts: bool, overrides: Sequence[str] = ()) -> list[Target]:
    """Profiles for the named hosts (or every profile). A name without a profile is a usage
    error (exit 64, nothing checked); a profile that does not validate makes its host UNKNOWN."""
    from ddtree_ops.errors import ProfileError, UsageError
    from ddtree_ops.profile import available_hosts, load_profile

    known = available_hosts()
    if all_hosts and names:
        raise UsageError("give host names or --all, not both")
    chosen = list(known) if all_hosts else list(dict.fromkeys(names))
    if not chosen:
        raise UsageError("name at least one host, or --all" + ("" if known else " (no profiles found)"))
    missing = [n for n in chosen if n not in known]
    if missing:
        raise UsageError(f"no profile for {', '.join(missing)} (profiles: {', '.join(known) or 'none'})")
    targets = []
    for name in chosen:
        try:
            targets.append(Target(name, load_profile(name, overrides=list(overrides))))
        except ProfileError as exc:
            targets.append(Target(name, error=exc.problems[0] if exc.problems else str(exc)))
    return targets


@dataclass
class RunOutcome:
    results: list[HostResult]
    started_at: str
    finished_at: str
    skipped: bool = False
    lock_path: str = ""
    lock_holder: str = ""
    recorded: dict[str, str] = field(default_factory=dict)  # host -> golden file written

    @property
    def exit_code(self) -> int:
        return 0 if self.skipped else int(worst([r.state for r in self.results]))

    def summary(self) -> str:
        if self.skipped:
            who = f" ({self.lock_holder})" if self.lock_holder else ""
            return f"{PLUGIN} OK - skipped: another smoke run holds {self.lock_path}{who}"
        return status_line(self.results)

    def document(self) -> dict[str, Any]:
        if self.skipped:
            return {"command": "smoke", "result": "skipped", "exit_code": 0, "summary": self.summary(),
                    "started_at": self.started_at, "finished_at": self.finished_at, "hosts": []}
        doc = to_json(self.results, started_at=self.started_at, finished_at=self.finished_at)
        if self.recorded:
            doc["golden_recorded"] = self.recorded
        return doc


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def run(targets: Sequence[Target], connect: Connect, *, lock_path: Path, state_dir: Path | None,
        prom_file: Path | None = None, ping_url: str | None = None, jobs: int = 0, record_golden: bool = False,
        warn: Callable[[str], None] = lambda _m: None) -> RunOutcome:
    """Lock, ping /start, check every host in parallel, remember, write metrics, ping /<rc>."""
    started = time.time()
    lock = RunLock(lock_path)
    with lock.held() as got:
        if not got:
            return RunOutcome([], _utc(started), _utc(time.time()), skipped=True, lock_path=str(lock_path),
                              lock_holder=lock.holder)
        pinger = Pinger(ping_url, on_error=warn) if ping_url else None
        if pinger:
            pinger.start()
        store = StateStore(state_dir) if state_dir else None
        results = check_hosts(targets, connect, jobs=jobs, state=store, record=record_golden)
        now = time.time()
        outcome = RunOutcome(results, _utc(started), _utc(now))
        if store is not None:
            try:
                store.update(results, now)
                if record_golden:
                    for t, r in zip(targets, results):
                        if t.profile is not None and (path := store.record_golden(t.profile, r, _utc(now))):
                            outcome.recorded[r.host] = str(path)
                        elif t.profile is not None:
                            warn(f"{r.host}: no completion to record as the golden output ({', '.join(r.reasons)})")
            except OSError as exc:
                warn(f"cannot write the smoke state in {store.dir}: {exc}")
        if prom_file is not None:
            try:
                write_prom(prom_file, results, now)
            except (OSError, OpsError) as exc:
                warn(f"cannot write {prom_file}: {exc}")
        if pinger:
            pinger.finish(outcome.exit_code, "\n".join([outcome.summary(), *detail_lines(results)]))
        return outcome
