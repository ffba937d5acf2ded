"""Judging one host: a pure function from the observations and the profile's smoke thresholds to
a Nagios state with reasons and perfdata.

States follow the Nagios plugin contract: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, where UNKNOWN
means the check itself could not run (host unreachable, unit state unreadable, profile invalid).
Across hosts the overall state is the most severe one in Icinga's severity order
CRITICAL > UNKNOWN > WARNING > OK: a host we could not see at all may be down, which is worse than
a host we saw serving slowly, and never better than a host we saw broken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ddtree_ops.observe import UnitState
from ddtree_ops.smoke.observe import Golden, HttpProbe, Observation
from ddtree_ops.smoke.parse import Generation
from ddtree_ops.status import NagiosExit
from ddtree_ops.treestats import KEEP_CHAIN, Verdict, verdict, window

if TYPE_CHECKING:
    from ddtree_ops.profile import SmokeSection


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
    if obs.mode == "ddtree":
        checks.append(_tree_check(obs, perf))
    elif obs.mode == "ddtree-shadow" or obs.algorithm == "DDTREE":
        checks.append(_shadow_check(obs, perf))
    checks.append(_golden_check(obs.golden, gen.text))
    return done()


def _window(obs: Observation, mode: str) -> tuple[Verdict, str]:
    """The plugin's verdict over this check's own window: its counters now minus those the last check
    of this host kept (the whole life of the server when there is none, or it restarted since)."""
    prev = obs.previous.counters if obs.previous is not None else None
    if prev is not None and obs.unit is not None and obs.previous is not None and obs.previous.invocation \
            and obs.unit.invocation and obs.previous.invocation != obs.unit.invocation:
        prev = None        # another start of the unit since: its counters began at 0 (even if they are higher now)
    assert obs.counters is not None
    win = window(prev, obs.counters)
    since = "since the last check" if prev is not None and not win.restarted else "since the server started"
    return verdict(win, mode=mode), since


def _paired_figures(h: str, v: Verdict, since: str, perf: list[Perf]) -> str:
    perf.append(Perf(f"{h}_exact_rounds", v.exact_rounds))
    if v.tau_tree is None or v.tau_chain is None:
        return f"no exact round {since} ({v.rounds} accounted)"
    perf.extend([Perf(f"{h}_tau_tree", round(v.tau_tree, 3)), Perf(f"{h}_tau_chain", round(v.tau_chain, 3))])
    text = f"{v.exact_rounds} exact rounds {since}: tau_tree {v.tau_tree:.2f}, paired tau_chain {v.tau_chain:.2f}"
    if v.r is not None and v.speedup is not None:
        perf.extend([Perf(f"{h}_cost_ratio", round(v.r, 3)), Perf(f"{h}_speedup", round(v.speedup, 3))])
        lower = f" (lower bound {v.lower:.3f})" if v.lower is not None else ""
        text += f", r {v.r:.2f} ({v.r_source}), projected speedup {v.speedup:.3f}{lower}: {v.recommendation}"
    return text


def _tree_check(obs: Observation, perf: list[Perf]) -> Check:
    """A tree-serving host (mode ddtree) measures the chain on the same rounds: the served tau_tree, the
    paired tau_chain and the verify cost ratio over this check's window. A tree that does not pay for
    its cost there (keep-chain) is a WARNING: the host should go back to the shadow."""
    if obs.counters is None:
        return Check("tree", None, "no ddtree counters on /metrics (metrics off, or a plugin without them)")
    v, since = _window(obs, "tree")
    if v.silent is not None and not v.exact_rounds:
        return Check("tree", NagiosExit.WARNING, f"tree accounting is not running: {v.silent}",
                     "tree accounting not running")
    detail = _paired_figures(obs.host, v, since, perf)
    if v.recommendation == KEEP_CHAIN:
        return Check("tree", NagiosExit.WARNING, detail, "the served tree does not pay for its verify cost")
    return Check("tree", NagiosExit.OK, detail)


def _shadow_check(obs: Observation, perf: list[Perf]) -> Check:
    """DDTREE shadow's point is the measurement: a server that serves but accounts nothing is a
    WARNING (the plugin's `ddtree_silent{reason}`), not OK. With the plugin's counters the figures are
    this check's window's; a plugin of before them has its gauges read."""
    if obs.counters is not None:
        v, since = _window(obs, "shadow")
        if v.silent is not None and not v.rounds:
            return Check("shadow", NagiosExit.WARNING, f"shadow accounting is not running: {v.silent}",
                         "shadow accounting not running")
        return Check("shadow", NagiosExit.OK, _paired_figures(obs.host, v, since, perf))
    sh = obs.shadow
    if sh is None or not sh.present:
        return Check("shadow", None, "no ddtree_shadow_* gauges on /metrics (metrics off, or before the first report)")
    if sh.silent is not None:
        return Check("shadow", NagiosExit.WARNING, f"shadow accounting is not running: {sh.silent}",
                     "shadow accounting not running")
    if sh.rounds is not None:
        perf.append(Perf(f"{obs.host}_shadow_rounds", sh.rounds, "c"))
    if sh.tau_tree_lower is not None:
        perf.append(Perf(f"{obs.host}_tau_tree_lower", sh.tau_tree_lower))
    tau = f", tau chain {sh.tau_chain:.2f}, tree lower bound {sh.tau_tree_lower:.2f}" if (
        sh.tau_chain is not None and sh.tau_tree_lower is not None) else ""
    return Check("shadow", NagiosExit.OK, f"{sh.rounds or 0:.0f} rounds accounted{tau}")


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
