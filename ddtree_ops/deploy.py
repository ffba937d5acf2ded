"""deploy and rollback: one transaction that ends with a verified service or the known-good one.

    lock -> read the state (attempts, current, pending) -> preflight   (refuse = nothing changed)
         -> the plan (plan.py): no change and healthy = a no-op
         -> confirm                                                     (refuse = nothing changed)
         -> from here on the change goes ahead: an interrupted earlier run resolved, the running unit
            adopted as the baseline (first contact), [plugin install]
         -> attempt start + release + pending -> install env and unit (write beside, rename)
            -> daemon-reload -> reset-failed -> restart
         -> gate -> PASS: the attempt ends passed | FAIL: it ends failed, diagnosis, and a rollback
            attempt to the target under the profile's policy (the last NEXTN release that passed)

Nothing is written to the host before the operator's yes: a refusal (preflight, lock, no --yes,
not confirmed, a fleet's stop, --dry-run) leaves every file there as it was. Every attempt is a
record of its own (`attempts.py`), so a later run never rewrites what an earlier one did.

State changes on the host are batched into one round trip per step (`releases.Change`). What this
and the multi-node service's transaction share (the outcome, the files, the gate's progress lines,
the verdict after a rollback) is `transaction.py`.
"""

from __future__ import annotations

import calendar
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

from ddtree_ops import attempts as records
from ddtree_ops import gate as gating
from ddtree_ops import lock, output, releases, remote
from ddtree_ops.attempts import Target
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError
from ddtree_ops.observe import parse_cursor, parse_systemctl_show, read_files
from ddtree_ops.plan import Plan, exec_start, launch_diff
from ddtree_ops.preflight import Preflight, run_preflight
from ddtree_ops.profile import Profile
from ddtree_ops.releases import Change, Layout, State, Step, StoredRelease
from ddtree_ops.render import Rendered, render
from ddtree_ops.status import DeployExit
from ddtree_ops.transaction import (STOPPED, Outcome, degrade, env_path_of, gate_progress, healthy_now, install_plugin,
                                    make_diff, read_again_after_a_drop, reconnect, refusal, settle_rollback,
                                    stage_files, unit_path_of)
from ddtree_ops.wheel import build

__all__ = ["STOPPED", "Outcome", "Restarted", "deploy", "rollback", "needs_rollback", "install", "rollback_to",
           "resolve_interrupted", "adopt_baseline", "explain_failure", "healthy_now", "plugin_for"]


# systemd steps of one install, in one round trip; prints the journal cursor and the InvocationID
# from before the restart so the gate reads and judges this start only. `stop` then `start`: a
# plain `restart` of a unit still activating (a server that never became ready keeps its start job
# running) is merged into that job and restarts nothing.
_RESTART = ('u="$1"; systemctl daemon-reload || exit 1; systemctl reset-failed -- "$u" 2>/dev/null; '
            'systemctl enable --quiet -- "$u" || exit 1; '
            'journalctl --unit "$u" --lines 0 --show-cursor --no-pager --quiet; '
            f'systemctl show --property {",".join(remote.UNIT_PROPS)} -- "$u"; '
            's=$(date +%s%N); systemctl stop -- "$u"; printf "stop_ns=%s\\n" $(( $(date +%s%N) - s )); '
            'systemctl start --no-block -- "$u"')


@dataclass(frozen=True)
class Restarted:
    cursor: str | None  # journal position just before the restart
    previous_invocation: str  # the start we replaced
    stop_s: float  # how long the old server took to stop (its own time, not the tool's)


def install(host: Host, unit_path: str, unit_text: str, env_path: str, env_text: str, unit: str, *,
            installed: tuple[bytes | None, bytes | None] | None = None, pre: Change | None = None,
            post: Change | None = None) -> Restarted:
    """Env first (the unit names it), then the unit, each written beside and renamed, and only
    when its bytes differ (a rollback after a failed write then has nothing to rewrite); then
    daemon-reload, reset-failed, enable and restart. `pre` (the attempt's start, release records,
    pending) goes first, `post` (the `current` marker) only once both files are written. One round
    trip, plus one to read the installed files when the caller does not know them."""
    if installed is None:
        files = read_files(host, [env_path, unit_path])
        installed = files[env_path], files[unit_path]
    change = stage_files(Change(list(pre.lines) if pre else []), unit_path, unit_text, env_path, env_text, installed)
    change.lines += post.lines if post else []
    res = host.run(["sh", "-c", releases.APPLY + _RESTART, "sh", unit],
                   stdin=("\n".join(change.lines) + "\n").encode(), sudo=True, timeout=180)
    res.check(f"installing and restarting {unit}")
    stop_ns = next((int(x.split("=", 1)[1]) for x in res.stdout.splitlines() if x.startswith("stop_ns=")), 0)
    return Restarted(parse_cursor(res.stdout), parse_systemctl_show(res.stdout).invocation, stop_ns / 1e9)


def explain_failure(result: gating.GateResult) -> tuple[dict[str, Any], list[str]]:
    return result.report.to_json(), [ln.message for ln in result.state.lines[-25:]]


def plugin_for(mode: str) -> Any:
    """The ddtree plugin wheel a mode needs on the host (the DDTREE modes), else None."""
    return build() if mode.startswith("ddtree") else None


def _layout(p: Profile) -> Layout:
    return Layout.for_service(p.service.state_dir, p.service.unit)


# ------------------------------------------------------------------ rollback


def rollback_to(host: Host, p: Profile, layout: Layout, release: StoredRelease, *, why: str,
                current: str | None, action: str = "rollback") -> gating.GateResult:
    """Install `release` through the gate, as an attempt of its own (`action`)."""
    mode = release.meta.get("mode", p.known_good_mode)
    rid = release.release_id
    # `why` quotes the journal: text, not markup
    output.say(f"{host.name}: rolling back to {rid} ({mode}): {output.escape(why)}", style="bold yellow")
    step = Step(layout, action, rid, mode, p.name, previous=current, cause=why)
    started = install(host, release.meta.get("unit_path", unit_path_of(p)), release.unit,
                      release.meta.get("env_path", env_path_of(p)), release.env, p.service.unit,
                      pre=step.begin(Change()), post=Change().mark(layout.current, rid))
    result = gating.run_gate(host, p, mode, cursor=started.cursor, previous_invocation=started.previous_invocation,
                             on_progress=gate_progress(action))
    done = step.end(Change(), records.PASSED if result.passed else records.FAILED,
                    "" if result.passed else result.reason)
    releases.apply(host, done, what=f"recording the {action}'s result")
    return result


def adopt_baseline(host: Host, p: Profile, layout: Layout, pf: Preflight) -> str | None:
    """First change on a host that already serves: keep what runs as the known-good baseline. Runs
    only inside a change that goes ahead (the operator said yes), never on a refusal."""
    if pf.installed_unit is None or pf.installed_env is None:
        return None
    ok, _ = healthy_now(host, p)
    if not ok:
        return None
    rid = baseline_id(pf)
    meta = {"release_id": rid, "host": p.name, "mode": p.known_good_mode, "created_at": releases.utc_now(),
            "by": releases.operator(), "adopted": True, "unit_path": unit_path_of(p), "env_path": env_path_of(p)}
    change = releases.record_release(Change(), layout, rid, pf.installed_unit, pf.installed_env, meta)
    step = Step(layout, "adopt", rid, p.known_good_mode, p.name, cause="the running unit becomes the baseline")
    step.begin(change, pending=False)
    step.end(change.mark(layout.current, rid), records.ADOPTED, "healthy when adopted")
    releases.apply(host, change, what="recording the baseline release")
    output.say(f"{host.name}: adopted the running {p.service.unit} as known-good baseline {rid}")
    return rid


def baseline_id(pf: Preflight) -> str:
    return "baseline-" + hashlib.sha256(((pf.installed_unit or "") + (pf.installed_env or "")).encode()).hexdigest()[:12]


def _age_s(stamp: str | None) -> float:
    try:
        return max(0.0, time.time() - calendar.timegm(time.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return float("inf")


def resolve_interrupted(host: Host, p: Profile, layout: Layout, state: State) -> str | None:
    """A run that never finished left pending.json: its attempt ends `interrupted`; then its
    release, if installed, is gated (a `resume` attempt, with what is left of its deadline), and
    otherwise, or if that fails, the host goes back to its rollback target."""
    pending = state.pending
    if pending is None:
        return None
    rid = pending.get("release_id")
    note = (f"{host.name}: an earlier {pending.get('action', 'deploy')} of {rid} by {pending.get('by', '?')} "
            f"(pid {pending.get('pid', '?')}, {pending.get('started_at', '?')}) did not finish")
    output.warn(note)
    releases.apply(host, releases.end_interrupted(Change(), layout, p.name, state, "the run was cut off before it ended"),
                   what="recording the interrupted run")
    interrupted = releases.load_release(host, layout, rid) if rid else None
    installed = read_files(host, [unit_path_of(p)])[unit_path_of(p)]
    if interrupted and installed == interrupted.unit.encode():
        # the start began when that run did: it gets what is left of its deadline, not a new one
        left = p.gate.startup_deadline_s - _age_s(pending.get("started_at"))
        mode = interrupted.meta.get("mode", p.known_good_mode)
        output.say(f"{host.name}: release {rid} is installed; gating it now to finish that {pending.get('action')}")
        step = Step(layout, "resume", rid, mode, p.name, previous=state.current,
                    cause=f"finishing the interrupted {pending.get('action')}")
        releases.apply(host, step.begin(Change()), what="recording the resume")
        result = gating.run_gate(host, p, mode, cursor=None, on_progress=gate_progress("resume"),
                                 deadline_s=max(left, p.gate.stay_healthy_s + 4 * p.gate.poll_interval_s))
        releases.apply(host, step.end(Change().mark(layout.current, rid), records.PASSED if result.passed
                                      else records.FAILED, "" if result.passed else result.reason),
                       what="recording the resume's result")
        if result.passed:
            return f"finished the interrupted {pending.get('action')}: {rid} passed the gate"
        why = f"the interrupted release failed the gate: {result.reason}"
    else:
        why = "the interrupted change never reached a verified state"
    state = releases.read_state(host, layout)
    target = state.target(p)
    kg = releases.load_release(host, layout, target.release_id) if target else None
    if kg is None:
        raise OpsError(f"{note}, and there is no known-good release to return to", exit_code=DeployExit.DEGRADED)
    result = rollback_to(host, p, layout, kg, why=why, current=state.current)
    if not result.passed:
        raise OpsError(f"{host.name}: rollback to {kg.release_id} failed the gate: {result.reason}",
                       exit_code=DeployExit.DEGRADED)
    return f"rolled back the interrupted change to {kg.release_id}"


# ------------------------------------------------------------------ the plan


def _plan(p: Profile, action: str, rendered: Rendered, mode_source: str, state: State, pf: Preflight,
          target: Target | None, plugin: Any, *, changes: bool, diff: str) -> Plan:
    adopt = baseline_id(pf) if target is None and pf.installed_unit is not None else None
    if adopt:  # on first contact the running unit is what a failure returns to
        target = Target(adopt, p.known_good_mode, "adopted", "the running unit, adopted as the baseline first")
    pending = state.pending
    resolve = (f"an interrupted {pending.get('action')} of {pending.get('release_id')} (since "
               f"{pending.get('started_at', '?')}) is finished or rolled back") if pending else None
    return Plan(p.name, action, rendered.release_id, rendered.mode, mode_source, changes=changes,
                current=state.current, current_mode=state.mode_of(state.current) or ("?" if state.current else None),
                rollback_target=target, resolve=resolve, adopt=adopt if changes else None,
                plugin=plugin.version if plugin is not None and pf.plugin_needed else None, restart=changes,
                deadline_s=p.gate.startup_deadline_s, stay_healthy_s=p.gate.stay_healthy_s, diff=diff,
                launch=launch_diff(exec_start(pf.installed_unit), rendered.argv))


# ------------------------------------------------------------------ deploy


def deploy(host: Host, p: Profile, mode: str | None = None, *, dry_run: bool = False, assume_yes: bool = False,
           confirm: Callable[[str], bool] | None = None, force_restart: bool = False,
           lock_wait_s: float = 0, on_plan: Callable[[Outcome], None] | None = None,
           stop: Callable[[], bool] | None = None, abort: Callable[[], bool] | None = None) -> Outcome:
    """`mode` overrides the profile's `mode:` (None: converge to it). `on_plan(out)` is called once
    the plan is decided (out.plan, out.preflight), before any confirmation or change. A fleet passes
    `stop` (checked just before the host is changed: true leaves it untouched) and `abort` (checked
    while the new release is gated: true rolls it back, as Ctrl-C does for a single deploy)."""
    t0 = time.monotonic()
    mode_source = "--mode" if mode is not None and mode != p.desired_mode else "profile"
    mode = mode or p.desired_mode
    rendered = render(p, mode)
    layout = _layout(p)
    out = Outcome(p.name, mode, rendered.release_id, DeployExit.REFUSED, "refused", "")

    def finish() -> Outcome:
        out.timings["total"] = time.monotonic() - t0
        out.round_trips = getattr(host, "round_trips", 0)
        return out

    plugin = plugin_for(mode)

    def decide() -> tuple[State, Preflight, bool]:
        """Read-only: the state, the preflight, the plan; whether the release is installed already."""
        state = releases.read_state(host, layout)
        t_pf = time.monotonic()
        pf = run_preflight(host, p, mode, rendered, layout, plugin.version if plugin else "")
        out.preflight, out.timings["preflight"] = pf, time.monotonic() - t_pf
        out.diff = make_diff(rendered, pf, set(p.service.secrets))
        same = pf.installed_unit == rendered.unit_text and pf.installed_env == rendered.env_text
        changes = force_restart or not same or pf.plugin_needed or state.pending is not None
        out.plan = _plan(p, "deploy", rendered, mode_source, state, pf, state.target(p), plugin,
                         changes=changes, diff=out.diff)
        out.known_good = out.plan.rollback_target.release_id if out.plan.rollback_target else None
        if on_plan:
            on_plan(out)
        return state, pf, same

    if dry_run:
        _, pf, _ = read_again_after_a_drop(decide, host)
        out.exit_code = DeployExit.OK if pf.ok else DeployExit.REFUSED
        out.result = "dry-run" if pf.ok else "refused"
        out.reason = "dry run: nothing changed" if pf.ok else "preflight: " + "; ".join(c.detail for c in pf.failed)
        return finish()

    with lock.held(host, layout, command=f"deploy {p.name} --mode {mode}", release=rendered.release_id,
                   wait_s=lock_wait_s):
        state, pf, same = read_again_after_a_drop(decide, host)
        if pf.failed:
            out.reason = "preflight refused the deploy: " + "; ".join(f"{c.name}: {c.detail}" for c in pf.failed)
            return finish()
        if same and not force_restart and not pf.plugin_needed and state.pending is None:
            ok, detail = healthy_now(host, p)
            if ok:
                out.exit_code, out.result = DeployExit.OK, "no-change"
                out.reason = f"no changes: {rendered.release_id} is installed and healthy ({detail})"
                return finish()
            out.plan.changes = out.plan.restart = True  # installed but not serving: restart and gate it
        why_not = refusal(f"Deploy {rendered.release_id} ({mode}) to {p.name} and restart {p.service.unit}?",
                          "a host", assume_yes=assume_yes, confirm=confirm, stop=stop)
        if why_not:
            out.reason = why_not
            return finish()
        # the operator said yes: from here on the host changes
        if state.migrated:
            releases.apply(host, releases.migrate_records(Change(), layout, state), what="migrating the records")
        if state.pending is not None:
            out.events.append(resolve_interrupted(host, p, layout, state) or "")
            state = releases.read_state(host, layout)
            pf = _reread_installed(host, p, pf)
            if (pf.installed_unit == rendered.unit_text and pf.installed_env == rendered.env_text
                    and not force_restart and not pf.plugin_needed and healthy_now(host, p)[0]):
                out.exit_code, out.result = DeployExit.OK, "no-change"
                out.reason = f"{rendered.release_id} is installed and healthy now that the earlier run is resolved"
                return finish()
        target = state.target(p)
        if target is None:
            if adopt_baseline(host, p, layout, pf):
                state = releases.read_state(host, layout)
                target = state.target(p)
        out.known_good = target.release_id if target else None
        return _transaction(host, p, mode, mode_source, rendered, layout, pf, plugin, target, state, out, finish,
                            abort)


def _reread_installed(host: Host, p: Profile, pf: Preflight) -> Preflight:
    """After an interrupted run was resolved, what is installed now (the preflight's other facts stand)."""
    files = read_files(host, [unit_path_of(p), env_path_of(p)])
    pf.installed_unit = None if files[unit_path_of(p)] is None else files[unit_path_of(p)].decode()
    pf.installed_env = None if files[env_path_of(p)] is None else files[env_path_of(p)].decode()
    return pf


def _transaction(host: Host, p: Profile, mode: str, mode_source: str, rendered: Rendered, layout: Layout,
                 pf: Preflight, plugin: Any, target: Target | None, state: State, out: Outcome,
                 finish: Callable[[], Outcome], abort: Callable[[], bool] | None = None) -> Outcome:
    touched = False
    rid = rendered.release_id
    step = Step(layout, "deploy", rid, mode, p.name, previous=state.current, mode_source=mode_source)
    out.attempt = step.id
    try:
        if plugin is not None and pf.plugin_needed:
            install_plugin(host, p, plugin)
            out.events.append(f"installed the ddtree plugin {plugin.version} into {p.service.python}")
        t_install = time.monotonic()
        # the attempt, the release and the pending record land before the unit is touched (same
        # script, earlier lines); a release already kept keeps its meta.json (when it was first made)
        pre = Change() if rid in state.metas else releases.record_release(
            Change(), layout, rid, rendered.unit_text, rendered.env_text, releases.meta_for(rendered))
        step.begin(pre)
        installed = (pf.installed_env.encode() if pf.installed_env is not None else None,
                     pf.installed_unit.encode() if pf.installed_unit is not None else None)
        touched = True
        started = install(host, rendered.unit_path, rendered.unit_text, rendered.env_path, rendered.env_text,
                          p.service.unit, installed=installed, pre=pre, post=Change().mark(layout.current, rid))
        out.timings["install"] = time.monotonic() - t_install
        out.timings["service_stop"] = started.stop_s
        output.say(f"{p.name}: installed {rid}, restarting {p.service.unit}; gating")
        result = gating.run_gate(host, p, mode, cursor=started.cursor,
                                 previous_invocation=started.previous_invocation,
                                 on_progress=gate_progress(mode, abort))
        out.gate = result
        out.timings["gate"] = result.elapsed_s
        if result.passed:
            t_done = time.monotonic()
            releases.apply(host, step.end(Change(), records.PASSED), what="recording the passed deploy")
            releases.prune(host, layout, p.releases.keep, p)
            out.timings["record"] = time.monotonic() - t_done
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", result.reason
            return finish()
        out.diagnosis, out.evidence = explain_failure(result)
        out.reason = f"gate failed: {result.reason}"
        releases.apply(host, step.end(Change(), records.FAILED, result.reason), what="recording the failure")
    except KeyboardInterrupt:
        if not touched:
            raise
        out.reason = "interrupted (Ctrl-C) after the unit was changed"
        output.warn(f"{p.name}: interrupted; rolling back to the known-good release (Ctrl-C again to abandon; the "
                    "next deploy or rollback will then finish the job)")
        releases.apply(host, step.end(Change(), records.INTERRUPTED, out.reason), what="recording the interruption")
    except HostError as exc:
        # the connection dropped mid-change: reconnect and roll back now; if the host stays out of
        # reach, the pending record on it lets the next deploy or rollback repair it
        out.reason = f"the connection dropped while installing {rid}: {exc}"
        if not reconnect(host):
            degrade(out, f". The host has a pending record for {rid}; run `ddtree-ops rollback {p.name}` (or deploy "
                         "again) once it is reachable: it finishes or rolls back that change.")
            return finish()
        output.warn(f"{p.name}: reconnected after the drop; rolling back to the known-good release")
        releases.apply(host, step.end(Change(), records.INTERRUPTED, out.reason), what="recording the interruption")
    except OpsError as exc:
        if not touched:
            raise
        out.reason = f"installing {rid} failed: {exc}"
        releases.apply(host, step.end(Change(), records.FAILED, str(exc)), what="recording the failure")
    return _roll_back_after_failure(host, p, layout, target, rid, out, finish)


def _roll_back_after_failure(host: Host, p: Profile, layout: Layout, target: Target | None, current: str | None,
                             out: Outcome, finish: Callable[[], Outcome]) -> Outcome:
    release = releases.load_release(host, layout, target.release_id) if target else None
    if release is None:
        degrade(out, "; there is no known-good release on this host to roll back to")
        return finish()
    kg = release.release_id
    try:
        t_rb = time.monotonic()
        rb = rollback_to(host, p, layout, release, why=out.reason, current=current)
        out.rollback_gate = rb
        out.timings["rollback"] = time.monotonic() - t_rb
    except (HostError, OpsError) as exc:
        degrade(out, f"; rollback to {kg} could not run: {exc}")
        return finish()
    settle_rollback(out, rb.passed, healthy=f"; rolled back to {kg} ({release.meta.get('mode', '?')}), which is "
                                            "healthy again",
                    failed=f"; rollback to {kg} ALSO FAILED: {rb.reason}")
    return finish()


def needs_rollback(host: Host, p: Profile) -> tuple[bool, str]:
    """Whether the host's last change did not pass, and why: an unfinished change, a last change
    that did not pass, or a service that is not healthy."""
    state = releases.read_state(host, _layout(p))
    if state.pending:
        return True, f"an unfinished {state.pending.get('action')} of {state.pending.get('release_id')} is pending"
    last = records.last_change(state.attempts)
    if last is not None and not last.good:
        return True, f"the last {last.action} of {last.release_id} ended {last.outcome}"
    ok, detail = healthy_now(host, p)
    if not ok:
        return True, f"not healthy ({detail})"
    return False, f"healthy on {state.current or 'its release'}; its last change passed; nothing to do"


# ------------------------------------------------------------------ rollback


def rollback(host: Host, p: Profile, *, to: str | None = None, dry_run: bool = False, assume_yes: bool = False,
             confirm: Callable[[str], bool] | None = None, lock_wait_s: float = 0,
             on_plan: Callable[[Outcome], None] | None = None) -> Outcome:
    """The rollback target (the profile's policy: the last NEXTN release that passed), or `to`
    (a release id, or `previous`), through the same gate. A target already installed by the tool (the
    record's current release), its files in place and healthy, is a no-op that says so; otherwise it
    asks, as a deploy does."""
    t0 = time.monotonic()
    layout = _layout(p)
    out = Outcome(p.name, p.known_good_mode, to or "", DeployExit.REFUSED, "refused", "", command="rollback")

    def finish() -> Outcome:
        out.timings["total"] = time.monotonic() - t0
        out.round_trips = getattr(host, "round_trips", 0)
        return out

    def decide() -> tuple[State, StoredRelease | None]:
        state = releases.read_state(host, layout)
        if to is None:
            target = state.target(p)
        elif to == "previous":
            target = records.previous_target(state.attempts, state.current)
        else:
            target = Target(to, state.mode_of(to) or "?", "--to", "named by the operator")
        if target is None:
            out.reason = (f"{p.name}: no release has passed on this host under {layout.root}; nothing to roll back "
                          "to" if to is None else f"{p.name}: no release passed before {state.current}")
            return state, None
        out.release_id, out.known_good = target.release_id, target.release_id
        release = releases.load_release(host, layout, target.release_id)
        if release is None:
            out.reason = f"{p.name}: release {target.release_id} is not kept on the host (see `ddtree-ops history {p.name}`)"
            return state, None
        out.mode = release.meta.get("mode", target.mode)
        files = read_files(host, [release.meta.get("unit_path", unit_path_of(p)), release.meta.get("env_path",
                                                                                                    env_path_of(p))])
        same = list(files.values()) == [release.unit.encode(), release.env.encode()]
        plan = Plan(p.name, "rollback", target.release_id, out.mode, f"rollback target: {target.why}", changes=True,
                    current=state.current, current_mode=state.mode_of(state.current), rollback_target=None,
                    restart=True, deadline_s=p.gate.startup_deadline_s, stay_healthy_s=p.gate.stay_healthy_s)
        if state.pending:
            plan.resolve = (f"the unfinished {state.pending.get('action')} of {state.pending.get('release_id')} ends "
                            "interrupted")
        # a no-op only where the record says the target is what was started: files put back by hand match
        # it too, but the process serving may still be the release before (files are read at a start)
        if same and state.pending is None and state.current == target.release_id:
            ok, detail = healthy_now(host, p)
            if ok:
                plan.changes = plan.restart = False
                out.plan = plan
                out.exit_code, out.result = DeployExit.OK, "no-change"
                out.reason = (f"{target.release_id} ({out.mode}, {target.why}) is serving and healthy ({detail}); "
                              "nothing to roll back")
                return state, None
        old = next(iter(files.values()))
        plan.launch = launch_diff(exec_start(None if old is None else old.decode()), exec_start(release.unit))
        out.plan = plan
        if on_plan:
            on_plan(out)
        return state, release

    if dry_run:
        _, release = decide()
        if release is not None:
            out.exit_code, out.result, out.reason = DeployExit.OK, "dry-run", "dry run: nothing changed"
        return finish()

    with lock.held(host, layout, command=f"rollback {p.name}", release=to, wait_s=lock_wait_s):
        state, release = decide()
        if release is None:
            return finish()
        why_not = refusal(f"Roll {p.name} back to {release.release_id} ({out.mode}) and restart {p.service.unit}?",
                          "a host", assume_yes=assume_yes, confirm=confirm, stop=None)
        if why_not:
            out.reason = why_not
            return finish()
        change = releases.migrate_records(Change(), layout, state)
        if state.pending:
            releases.end_interrupted(change, layout, p.name, state, "cut off; the operator rolled back")
        releases.apply(host, change, what="recording the interrupted run")
        why = "requested by the operator" if not state.pending else (
            f"the {state.pending.get('action')} of {state.pending.get('release_id')} did not finish")
        try:
            result = rollback_to(host, p, layout, release, why=why, current=state.current)
        except HostError as exc:
            out.exit_code, out.result, out.reason = DeployExit.DEGRADED, "degraded", str(exc)
            return finish()
        out.gate = result
        if result.passed:
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", f"{release.release_id} serving: {result.reason}"
        else:
            out.diagnosis, out.evidence = explain_failure(result)
            out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
            out.reason = f"rollback to {release.release_id} failed the gate: {result.reason}"
    return finish()
