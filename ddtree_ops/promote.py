"""promote: from the shadow's verdict to a served tree, proven live, rolled back on a miss.

    lock -> the host serves a ddtree-shadow release, healthy -> scrape /metrics once
         -> the decision (pure, `decide`): promote | hold | refuse, each with its reason and the
            verdict's figures (rounds, exact rounds, tau_chain, tau_tree, r and where it came from,
            the projected speedup and its lower bound)                  hold / refuse = exit 3, nothing changed
         -> the plan: the ddtree release, the live window, the step's own rollback target (the
            ddtree-shadow release serving now)                          --dry-run stops here
         -> confirm -> a `promote` attempt: [plugin], install ddtree, the startup gate (as deploy)
         -> the live window: a scrape right after the gate, then every poll until N exact tree
            rounds or the deadline (`live_check`, pure): the served tau_tree is within the tolerance
            of the shadow's prediction, and the paired test (the tree against its own spine on the
            same rounds) does not say keep-chain; no traffic holds until the deadline and is a miss:
            it never passes on no data
         -> PASS: the attempt ends passed (exit 0) | MISS: it ends rolled-back and a rollback attempt
            returns the host to the ddtree-shadow release (exit 1, or 2 if that fails too)

The decision and the live check are the shadow's counters read through `treestats` (the plugin's own
verdict function), so what promote decides is what the server said. Promotion uses the transaction,
lock, records and audit of `deploy.py`; its rollback target is step-local by design: a miss goes
back one step (to the shadow, which keeps measuring), not to the NEXTN baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ddtree_ops import attempts as records
from ddtree_ops import gate as gating
from ddtree_ops import lock, output, releases, treestats
from ddtree_ops.attempts import Target
from ddtree_ops.deploy import explain_failure, install, plugin_for, rollback_to
from ddtree_ops.errors import OpsError
from ddtree_ops.fleet import Checked
from ddtree_ops.host import Host, HostError, HttpUnavailable
from ddtree_ops.plan import Plan, exec_start, launch_diff
from ddtree_ops.preflight import run_preflight
from ddtree_ops.profile import Profile
from ddtree_ops.releases import Change, Layout, Step
from ddtree_ops.render import render
from ddtree_ops.status import DeployExit
from ddtree_ops.transaction import Outcome, degrade, gate_progress, healthy_now, install_plugin, make_diff, refusal, \
    settle_rollback

SHADOW, TREE = "ddtree-shadow", "ddtree"
PROMOTE, HOLD, REFUSE = "promote", "hold", "refuse"


@dataclass(frozen=True)
class Bar:
    """What a promotion must clear, before the switch and live after it (the profile's `promote:`)."""

    min_rounds: int = 1000  # exact greedy rounds, in the shadow's window and again in the live window
    min_speedup: float = 1.05  # the projected speedup's one-sided 95% lower bound must reach this
    tolerance: float = 0.03  # the served tau_tree may fall this far below the shadow's prediction
    live_deadline_s: float = 600.0  # the live window's bound in time: no data by then is a miss
    poll_s: float = 5.0
    alpha: float = 0.05

    @classmethod
    def of(cls, p: Profile, **override: Any) -> Bar:
        s = p.promote
        values = dict(min_rounds=s.min_rounds, min_speedup=s.min_speedup, tolerance=s.tolerance,
                      live_deadline_s=s.live_deadline_s, poll_s=s.poll_s)
        values.update({k: v for k, v in override.items() if v is not None})
        return cls(**values)


@dataclass(frozen=True)
class Decision:
    decision: str  # promote | hold | refuse
    reason: str
    verdict: treestats.Verdict | None = None

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "reason": self.reason,
                "verdict": None if self.verdict is None else self.verdict.to_dict()}


def decide(counters: treestats.Counters | None, bar: Bar, *, no_data: str = "") -> Decision:
    """The shadow's counters to a decision (pure). `hold`: the measurement runs but does not justify
    a promotion (too few exact rounds, a lower bound under the bar, keep-chain); `refuse`: there is
    nothing to decide on (no scrape, no counters, a silent shadow). Inconclusive never promotes."""
    if counters is None:
        return Decision(REFUSE, f"no data: {no_data or '/metrics has no ddtree counters'}")
    v = treestats.verdict(counters, min_exact=bar.min_rounds, alpha=bar.alpha, bar=bar.min_speedup, mode="shadow")
    if counters.silent is not None:
        return Decision(REFUSE, f"silence: the shadow is not accounting ({counters.silent})", v)
    if v.exact_rounds < bar.min_rounds:
        return Decision(HOLD, f"rounds: {v.exact_rounds} exact greedy rounds of the {bar.min_rounds} needed "
                              f"({v.rounds} accounted)", v)
    if v.lower is None or v.speedup is None:
        return Decision(HOLD, f"verdict: {v.reason}", v)
    figures = (f"projected speedup {v.speedup:.3f} (tau_tree {v.tau_tree:.3f} / tau_chain {v.tau_chain:.3f} "
               f"at r {v.r:.3f}, {v.r_source}), {100 * (1 - bar.alpha):g}% lower bound {v.lower:.3f}")
    if v.recommendation == treestats.KEEP_CHAIN:
        return Decision(HOLD, f"verdict: keep-chain: {figures}", v)
    if v.lower < bar.min_speedup:
        return Decision(HOLD, f"bound: {figures} < {bar.min_speedup:g}", v)
    return Decision(PROMOTE, f"promote-tree: {figures} >= {bar.min_speedup:g} over {v.exact_rounds} exact rounds", v)


@dataclass(frozen=True)
class Live:
    """The live window after the switch, as far as it has got."""

    done: bool
    passed: bool
    reason: str
    verdict: treestats.Verdict | None = None
    ratio: float | None = None  # served tau_tree / the shadow's predicted tau_tree

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "tau_tree_ratio": self.ratio,
                "verdict": None if self.verdict is None else self.verdict.to_dict()}


def live_check(predicted: treestats.Verdict, window: treestats.Counters, bar: Bar, *, out_of_time: bool) -> Live:
    """Whether the served tree kept the shadow's promise over `window` (pure). Not done while it has
    fewer than `bar.min_rounds` exact rounds and time is left; out of time, that is a miss."""
    if window.restarted:
        return Live(True, False, "the server restarted during the live window")
    v = treestats.verdict(window, min_exact=bar.min_rounds, alpha=bar.alpha, mode="tree")
    if v.exact_rounds < bar.min_rounds or v.tau_tree is None:
        if not out_of_time:
            return Live(False, False, f"{v.exact_rounds} of {bar.min_rounds} exact tree rounds", v)
        what = "no traffic reached the tree" if v.exact_rounds == 0 else \
            f"only {v.exact_rounds} of {bar.min_rounds} exact tree rounds"
        return Live(True, False, f"{what} within {bar.live_deadline_s:g}s: a promotion never passes on no data", v)
    assert predicted.tau_tree is not None
    ratio = v.tau_tree / predicted.tau_tree
    served = f"served tau_tree {v.tau_tree:.3f} against the shadow's {predicted.tau_tree:.3f} ({100 * (ratio - 1):+.1f}%)"
    if ratio < 1 - bar.tolerance:
        return Live(True, False, f"{served}: more than {100 * bar.tolerance:g}% below the prediction", v, ratio)
    if v.recommendation == treestats.KEEP_CHAIN:
        return Live(True, False, f"{served}, but the paired test says keep-chain: {v.reason}", v, ratio)
    return Live(True, True, f"{served} over {v.exact_rounds} exact rounds; paired test {v.recommendation}"
                            + (f" (tau_chain on the same rounds {v.tau_chain:.3f})" if v.tau_chain else ""), v, ratio)


# ------------------------------------------------------------------ reading the host


def scrape(host: Host, p: Profile) -> tuple[treestats.Counters | None, str]:
    """The ddtree counters of the service's /metrics, or None and why (a missing scrape is an error
    of the measurement, never a verdict)."""
    try:
        resp = host.http("GET", p.service.port, "/metrics", timeout=p.gate.http_timeout_s)
    except HttpUnavailable as exc:
        return None, f"/metrics did not answer ({exc})"
    if resp.status != 200:
        return None, f"/metrics answered HTTP {resp.status}"
    return treestats.parse_metrics(resp.text), "/metrics has no ddtree counters (is --enable-metrics set?)"


@dataclass
class PromoteOutcome(Outcome):
    decision: Decision | None = None
    live: Live | None = None

    def to_json(self) -> dict[str, Any]:
        doc = super().to_json()
        d = self.decision
        doc.update(decision=d.decision if d else REFUSE, decision_reason=d.reason if d else self.reason,
                   verdict=None if d is None or d.verdict is None else d.verdict.to_dict(),
                   live=None if self.live is None else self.live.to_json())
        return doc


# ------------------------------------------------------------------ the transaction


def promote(host: Host, p: Profile, bar: Bar | None = None, *, dry_run: bool = False, assume_yes: bool = False,
            confirm: Callable[[str], bool] | None = None, lock_wait_s: float = 0,
            on_plan: Callable[[Outcome], None] | None = None, stop: Callable[[], bool] | None = None,
            abort: Callable[[], bool] | None = None,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
            ) -> PromoteOutcome:
    """`stop` and `abort` are a fleet's, as for `deploy.deploy`: stop before the host is changed, and
    roll it back while its start or its live window is watched."""
    t0 = clock()
    bar = bar or Bar.of(p)
    p.mode(TREE)  # an unconfigured tree mode is a usage error before any connection
    rendered = render(p, TREE)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    out = PromoteOutcome(p.name, TREE, rendered.release_id, DeployExit.REFUSED, "refused", "", command="promote")

    def finish() -> PromoteOutcome:
        out.timings["total"] = clock() - t0
        out.round_trips = getattr(host, "round_trips", 0)
        return out

    def refuse(decision: Decision) -> PromoteOutcome:
        out.decision, out.reason = decision, f"{decision.decision}: {decision.reason}"
        return finish()

    plugin = plugin_for(TREE)

    def prepare() -> tuple[Any, Target | None]:
        state = releases.read_state(host, layout)
        current_mode = state.mode_of(state.current)
        if state.pending is not None:
            return state, None
        if current_mode != SHADOW:
            out.decision = Decision(REFUSE, f"{p.name} runs {state.current or 'no recorded release'} "
                                            f"({current_mode or 'mode unknown'}); promote starts from a "
                                            f"{SHADOW} release (deploy it, let the shadow measure, then promote)")
            return state, None
        ok, detail = healthy_now(host, p)
        if not ok:
            out.decision = Decision(REFUSE, f"the {SHADOW} release {state.current} is not healthy ({detail})")
            return state, None
        counters, why = scrape(host, p)
        out.decision = decide(counters, bar, no_data=why)
        target = Target(state.current, SHADOW, "promote", f"the {SHADOW} release serving before the promotion")
        return state, target

    if dry_run:
        state, target = prepare()
        if state.pending is not None:
            return refuse(Decision(REFUSE, f"an unfinished {state.pending.get('action')} is pending; "
                                           f"`ddtree-ops rollback {p.name}` resolves it"))
        if target is not None:
            _plan(out, p, host, rendered, state, target, plugin, bar, layout, on_plan)
        if out.decision is not None and out.decision.decision == PROMOTE:
            out.exit_code, out.result, out.reason = DeployExit.OK, "dry-run", f"dry run: would promote; {out.decision.reason}"
            return finish()
        return refuse(out.decision or Decision(REFUSE, "no decision"))

    with lock.held(host, layout, command=f"promote {p.name}", release=rendered.release_id, wait_s=lock_wait_s):
        state, target = prepare()
        if state.pending is not None:
            return refuse(Decision(REFUSE, f"an unfinished {state.pending.get('action')} of "
                                           f"{state.pending.get('release_id')} is pending; `ddtree-ops rollback "
                                           f"{p.name}` resolves it first"))
        assert out.decision is not None
        if out.decision.decision != PROMOTE or target is None:
            return refuse(out.decision)
        pf = _plan(out, p, host, rendered, state, target, plugin, bar, layout, on_plan)
        if pf.failed:
            return refuse(Decision(REFUSE, "preflight: " + "; ".join(f"{c.name}: {c.detail}" for c in pf.failed),
                                   out.decision.verdict))
        why_not = refusal(f"Promote {p.name} from {state.current} to the served tree {rendered.release_id}?",
                          "a host", assume_yes=assume_yes, confirm=confirm, stop=stop)
        if why_not:
            out.reason = why_not
            return finish()
        return _switch(host, p, bar, rendered, layout, state, target, pf, plugin, out, finish, clock, sleep, abort)


def _plan(out: PromoteOutcome, p: Profile, host: Host, rendered: Any, state: Any, target: Target, plugin: Any,
          bar: Bar, layout: Layout, on_plan: Callable[[Outcome], None] | None) -> Any:
    pf = run_preflight(host, p, TREE, rendered, layout, plugin.version if plugin else "")
    out.preflight = pf
    out.diff = make_diff(rendered, pf, set(p.service.secrets))
    out.known_good = target.release_id
    out.plan = Plan(p.name, "promote", rendered.release_id, TREE, "the shadow's verdict", changes=True,
                    current=state.current, current_mode=SHADOW, rollback_target=target,
                    plugin=plugin.version if plugin is not None and pf.plugin_needed else None, restart=True,
                    deadline_s=p.gate.startup_deadline_s, stay_healthy_s=p.gate.stay_healthy_s, diff=out.diff,
                    launch=launch_diff(exec_start(pf.installed_unit), rendered.argv),
                    notes=[f"then live: at least {bar.min_rounds} exact tree rounds within {bar.live_deadline_s:g}s, "
                           f"served tau_tree at most {100 * bar.tolerance:g}% below the shadow's, and the paired "
                           "test not keep-chain; else back to the shadow release"])
    if on_plan:
        on_plan(out)
    return pf


def _switch(host: Host, p: Profile, bar: Bar, rendered: Any, layout: Layout, state: Any, target: Target, pf: Any,
            plugin: Any, out: PromoteOutcome, finish: Callable[[], PromoteOutcome],
            clock: Callable[[], float], sleep: Callable[[float], None],
            abort: Callable[[], bool] | None) -> PromoteOutcome:
    assert out.decision is not None and out.decision.verdict is not None
    rid = rendered.release_id
    step = Step(layout, "promote", rid, TREE, p.name, previous=state.current, mode_source="promote",
                cause=out.decision.reason)
    out.attempt = step.id
    touched = False
    try:
        if plugin is not None and pf.plugin_needed:
            install_plugin(host, p, plugin)
            out.events.append(f"installed the ddtree plugin {plugin.version} into {p.service.python}")
        pre = Change() if rid in state.metas else releases.record_release(
            Change(), layout, rid, rendered.unit_text, rendered.env_text, releases.meta_for(rendered))
        step.begin(pre)
        touched = True
        installed = (None if pf.installed_env is None else pf.installed_env.encode(),
                     None if pf.installed_unit is None else pf.installed_unit.encode())
        started = install(host, rendered.unit_path, rendered.unit_text, rendered.env_path, rendered.env_text,
                          p.service.unit, installed=installed, pre=pre, post=Change().mark(layout.current, rid))
        output.say(f"{p.name}: promoted to {rid} (the served tree); gating its start")
        result = gating.run_gate(host, p, TREE, cursor=started.cursor, previous_invocation=started.previous_invocation,
                                 on_progress=gate_progress(TREE, abort))
        out.gate, out.timings["gate"] = result, result.elapsed_s
        if not result.passed:
            out.diagnosis, out.evidence = explain_failure(result)
            out.reason = f"the served tree failed its start gate: {result.reason}"
            releases.apply(host, step.end(Change(), records.FAILED, result.reason), what="recording the failure")
        else:
            t_live = clock()
            out.live = _watch_live(host, p, out.decision.verdict, bar, clock, sleep, abort)
            out.timings["live"] = clock() - t_live
            if out.live.passed:
                releases.apply(host, step.end(Change(), records.PASSED, out.live.reason),
                               what="recording the promotion")
                out.exit_code, out.result = DeployExit.OK, "ok"
                out.reason = f"promoted and verified live: {out.live.reason}"
                return finish()
            out.reason = f"the served tree missed live: {out.live.reason}"
            releases.apply(host, step.end(Change(), records.ROLLED_BACK, out.live.reason), what="recording the miss")
    except KeyboardInterrupt:
        if not touched:
            raise
        out.reason = "interrupted (Ctrl-C) after the unit was changed"
        releases.apply(host, step.end(Change(), records.INTERRUPTED, out.reason), what="recording the interruption")
    except (HostError, OpsError) as exc:
        if not touched:
            raise
        out.reason = f"promoting {rid} failed: {exc}"
        try:
            releases.apply(host, step.end(Change(), records.FAILED, str(exc)), what="recording the failure")
        except (HostError, OpsError):
            degrade(out, f". The host keeps a pending record for {rid}; `ddtree-ops rollback {p.name}` repairs it.")
            return finish()
    shadow = releases.load_release(host, layout, target.release_id)
    if shadow is None:
        degrade(out, f"; the {SHADOW} release {target.release_id} is not kept on the host")
        return finish()
    rb = rollback_to(host, p, layout, shadow, why=out.reason, current=rid)
    out.rollback_gate = rb
    settle_rollback(out, rb.passed, healthy=f"; back on the {SHADOW} release {target.release_id}, healthy",
                    failed=f"; the rollback to {target.release_id} ALSO FAILED: {rb.reason}")
    return finish()


def _watch_live(host: Host, p: Profile, predicted: treestats.Verdict, bar: Bar, clock: Callable[[], float],
                sleep: Callable[[float], None], abort: Callable[[], bool] | None = None) -> Live:
    """Scrape right after the gate, then every `bar.poll_s` until the window decides or the deadline."""
    start = clock()
    before, why = scrape(host, p)
    if before is None:
        return Live(True, False, f"no data at the start of the live window: {why}")
    last = -bar.poll_s
    while True:
        if abort is not None and abort():
            raise KeyboardInterrupt  # a fleet interrupted twice: back to the shadow now
        elapsed = clock() - start
        out_of_time = elapsed >= bar.live_deadline_s
        now, why = scrape(host, p)
        if now is None:
            live = Live(True, False, f"the live window lost its data: {why}")
        else:
            live = live_check(predicted, treestats.window(before, now), bar, out_of_time=out_of_time)
        if live.done:
            return live
        if elapsed - last >= 10:
            last = elapsed
            output.say(f"  \\[live] {elapsed:5.1f}s of {bar.live_deadline_s:g}s: {live.reason}", style="dim")
        output.status(f"live {elapsed:.0f}s of {bar.live_deadline_s:g}s: {live.reason}")
        sleep(min(bar.poll_s, max(0.0, bar.live_deadline_s - elapsed)) or bar.poll_s)


# ------------------------------------------------------------------ a fleet of hosts


def check_for_fleet(t: Any, connect: Any) -> Checked:
    """A fleet's read-only look at one host (fleet.Checked): the decision and the tree's preflight.
    A host whose decision is not `promote` is held: reported with its reason, never a failure."""
    p = t.profile
    bar = Bar.of(p)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    t0 = time.monotonic()
    with connect(p) as h:
        state = releases.read_state(h, layout)
        mode = state.mode_of(state.current)
        if state.pending is not None:
            decision = Decision(REFUSE, f"an unfinished {state.pending.get('action')} is pending")
        elif mode != SHADOW:
            decision = Decision(HOLD, f"runs {state.current or 'no recorded release'} ({mode or 'mode unknown'}), "
                                      f"not a {SHADOW} release")
        else:
            counters, why = scrape(h, p)
            decision = decide(counters, bar, no_data=why)
        pf = None
        if decision.decision == PROMOTE:
            plugin = plugin_for(TREE)
            pf = run_preflight(h, p, TREE, render(p, TREE), layout, plugin.version if plugin else "")
    c = Checked(t.name, decision.decision == PROMOTE and (pf is None or pf.ok), current=state.current,
                known_good=state.current, pending=state.pending, change="promote", preflight=pf,
                seconds=time.monotonic() - t0)
    if decision.decision != PROMOTE:
        c.held, c.reason = True, f"{decision.decision}: {decision.reason}"
    elif pf is not None and pf.failed:
        c.reason = "preflight: " + "; ".join(f"{x.name}: {x.detail}" for x in pf.failed)
    return c


def run_for_fleet(host: Host, p: Profile, *, stop: Callable[[], bool], abort: Callable[[], bool]) -> Outcome:
    return promote(host, p, assume_yes=True, stop=stop, abort=abort)
