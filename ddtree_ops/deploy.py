"""deploy and rollback: one transaction that ends with a verified service or the known-good one.

    lock -> resolve an interrupted earlier deploy -> preflight (refuse = nothing changed)
         -> no-op when the same release is installed and healthy
         -> plan + diff -> confirm -> [plugin install] -> record release + pending
         -> install env and unit (write beside, rename) -> daemon-reload -> reset-failed -> restart
         -> gate -> PASS: known-good | FAIL: diagnosis, reinstall known-good, same gate

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

from ddtree_ops import gate as gating
from ddtree_ops import lock, output, releases, remote
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError
from ddtree_ops.observe import parse_cursor, parse_systemctl_show, read_files
from ddtree_ops.preflight import Preflight, run_preflight
from ddtree_ops.profile import PLUGIN_MODES, Profile
from ddtree_ops.releases import Change, Layout, StoredRelease
from ddtree_ops.render import Rendered, render
from ddtree_ops.status import DeployExit
from ddtree_ops.transaction import (STOPPED, Outcome, degrade, env_path_of, gate_progress, healthy_now, install_plugin,
                                    make_diff, reconnect, record_rollback, refusal, settle_rollback, stage_files,
                                    unit_path_of)
from ddtree_ops.wheel import build

__all__ = ["STOPPED", "Outcome", "Restarted", "deploy", "rollback", "needs_rollback", "install", "rollback_to",
           "resolve_interrupted", "adopt_baseline", "explain_failure", "healthy_now"]


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
            installed: tuple[bytes | None, bytes | None] | None = None, pre: Change | None = None) -> Restarted:
    """Env first (the unit names it), then the unit, each written beside and renamed, and only
    when its bytes differ (a rollback after a failed write then has nothing to rewrite); then
    daemon-reload, reset-failed, enable and restart. `pre` (release records, pending) goes first.
    One round trip, plus one to read the installed files when the caller does not know them."""
    if installed is None:
        files = read_files(host, [env_path, unit_path])
        installed = files[env_path], files[unit_path]
    change = stage_files(Change(list(pre.lines) if pre else []), unit_path, unit_text, env_path, env_text, installed)
    res = host.run(["sh", "-c", releases.APPLY + _RESTART, "sh", unit],
                   stdin=("\n".join(change.lines) + "\n").encode(), sudo=True, timeout=180)
    res.check(f"installing and restarting {unit}")
    stop_ns = next((int(x.split("=", 1)[1]) for x in res.stdout.splitlines() if x.startswith("stop_ns=")), 0)
    return Restarted(parse_cursor(res.stdout), parse_systemctl_show(res.stdout).invocation, stop_ns / 1e9)


def explain_failure(result: gating.GateResult) -> tuple[dict[str, Any], list[str]]:
    return result.report.to_json(), [ln.message for ln in result.state.lines[-25:]]


# ------------------------------------------------------------------ rollback


def rollback_to(host: Host, p: Profile, layout: Layout, release: StoredRelease, *, why: str,
                current: str | None) -> gating.GateResult:
    mode = release.meta.get("mode", p.known_good_mode)
    rid = release.release_id
    # `why` quotes the journal: text, not markup
    output.say(f"{host.name}: rolling back to {rid} ({mode}): {output.escape(why)}", style="bold yellow")
    pre = Change().write(layout.pending, releases.pending_doc(rid, current, "rollback")).audit(
        layout, f"rollback {p.name} release={rid} reason={why!r}")
    started = install(host, release.meta.get("unit_path", unit_path_of(p)), release.unit,
                      release.meta.get("env_path", env_path_of(p)), release.env, p.service.unit, pre=pre)
    result = gating.run_gate(host, p, mode, cursor=started.cursor, previous_invocation=started.previous_invocation,
                             on_progress=gate_progress("rollback"))
    done = Change()
    if result.passed:
        done.mark(layout.current, rid).remove(layout.pending).audit(layout, f"rollback {p.name} release={rid} result=healthy")
    else:
        done.audit(layout, f"rollback {p.name} release={rid} result=FAILED {result.reason!r}")
    releases.apply(host, done, what="recording the rollback's result")
    return result


def _known_good_release(host: Host, layout: Layout, rid: str | None) -> StoredRelease | None:
    return releases.load_release(host, layout, rid) if rid else None


def adopt_baseline(host: Host, p: Profile, layout: Layout, pf: Preflight) -> str | None:
    """First deploy on a host that already serves: keep what runs as the known-good baseline."""
    if pf.installed_unit is None or pf.installed_env is None:
        return None
    ok, _ = healthy_now(host, p)
    if not ok:
        return None
    rid = "baseline-" + hashlib.sha256((pf.installed_unit + pf.installed_env).encode()).hexdigest()[:12]
    meta = {"release_id": rid, "host": p.name, "mode": p.known_good_mode, "status": "good",
            "created_at": releases.utc_now(), "by": releases.operator(), "adopted": True,
            "unit_path": unit_path_of(p), "env_path": env_path_of(p)}
    change = releases.record_release(Change(), layout, rid, pf.installed_unit, pf.installed_env, meta)
    change.mark(layout.known_good, rid).mark(layout.current, rid).audit(
        layout, f"adopt {p.name} release={rid} (the running unit becomes the known-good baseline)")
    releases.apply(host, change, what="recording the baseline release")
    output.say(f"{host.name}: adopted the running {p.service.unit} as known-good baseline {rid}")
    return rid


def _age_s(stamp: str | None) -> float:
    try:
        return max(0.0, time.time() - calendar.timegm(time.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return float("inf")


def resolve_interrupted(host: Host, p: Profile, layout: Layout, state: releases.State) -> str | None:
    """A deploy or rollback that never finished left pending.json: finish it or roll it back."""
    pending = state.pending
    if pending is None:
        return None
    rid = pending.get("release_id")
    note = (f"{host.name}: an earlier {pending.get('action', 'deploy')} of {rid} by {pending.get('by', '?')} "
            f"(pid {pending.get('pid', '?')}, {pending.get('started_at', '?')}) did not finish")
    output.warn(note)
    interrupted = releases.load_release(host, layout, rid) if rid else None
    installed = read_files(host, [unit_path_of(p)])[unit_path_of(p)]
    if interrupted and installed == interrupted.unit.encode():
        # the start began when that run did: it gets what is left of its deadline, not a new one
        left = p.gate.startup_deadline_s - _age_s(pending.get("started_at"))
        output.say(f"{host.name}: release {rid} is installed; gating it now to finish that {pending.get('action')}")
        result = gating.run_gate(host, p, interrupted.meta.get("mode", p.known_good_mode), cursor=None,
                                 on_progress=gate_progress("resume"),
                                 deadline_s=max(left, p.gate.stay_healthy_s + 4 * p.gate.poll_interval_s))
        if result.passed:
            change = releases.set_status(Change(), layout, interrupted, "good")
            change.mark(layout.known_good, rid).mark(layout.current, rid).remove(layout.pending).audit(
                layout, f"resume {p.name} release={rid} result=passed")
            releases.apply(host, change, what="recording the finished deploy")
            return f"finished the interrupted {pending.get('action')}: {rid} passed the gate"
        why = f"the interrupted release failed the gate: {result.reason}"
    else:
        why = "the interrupted change never reached a verified state"
    kg = _known_good_release(host, layout, state.known_good)
    if kg is None:
        raise OpsError(f"{note}, and there is no known-good release to return to", exit_code=DeployExit.DEGRADED)
    result = rollback_to(host, p, layout, kg, why=why, current=state.current)
    if not result.passed:
        raise OpsError(f"{host.name}: rollback to {kg.release_id} failed the gate: {result.reason}",
                       exit_code=DeployExit.DEGRADED)
    if interrupted and interrupted.release_id != kg.release_id:
        releases.apply(host, releases.set_status(Change(), layout, interrupted, "failed"), what="marking it failed")
    return f"rolled back the interrupted change to {kg.release_id}"


# ------------------------------------------------------------------ deploy


def deploy(host: Host, p: Profile, mode: str, *, dry_run: bool = False, assume_yes: bool = False,
           confirm: Callable[[str], bool] | None = None, force_restart: bool = False,
           lock_wait_s: float = 0, on_plan: Callable[[Outcome], None] | None = None,
           stop: Callable[[], bool] | None = None, abort: Callable[[], bool] | None = None) -> Outcome:
    """`on_plan(out)` is called once the preflight and the diff are decided (out.preflight, out.diff),
    before any confirmation or change, so an operator reads the plan before the gate's progress.
    A fleet passes `stop` (checked just before the host is changed: true leaves it untouched) and
    `abort` (checked while the new release is gated: true rolls it back, as Ctrl-C does for a
    single deploy)."""
    t0 = time.monotonic()
    rendered = render(p, mode)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    out = Outcome(p.name, mode, rendered.release_id, DeployExit.REFUSED, "refused", "")

    def finish() -> Outcome:
        out.timings["total"] = time.monotonic() - t0
        out.round_trips = getattr(host, "round_trips", 0)
        return out

    plugin = build() if mode in PLUGIN_MODES else None
    if dry_run:
        pf = run_preflight(host, p, mode, rendered, layout, plugin.version if plugin else "")
        out.preflight, out.timings["preflight"] = pf, time.monotonic() - t0
        out.diff = make_diff(rendered, pf, set(p.service.secrets))
        if on_plan:
            on_plan(out)
        pending = releases.read_pending(host, layout)
        if pending:
            out.events.append(f"an interrupted {pending.get('action')} of {pending.get('release_id')} would be "
                              "resolved first")
        out.exit_code = DeployExit.OK if pf.ok else DeployExit.REFUSED
        out.result = "dry-run" if pf.ok else "refused"
        out.reason = "dry run: nothing changed" if pf.ok else "preflight: " + "; ".join(c.detail for c in pf.failed)
        return finish()

    with lock.held(host, layout, command=f"deploy {p.name} --mode {mode}", release=rendered.release_id,
                   wait_s=lock_wait_s):
        state = releases.read_state(host, layout)
        resolved = resolve_interrupted(host, p, layout, state)
        if resolved:
            out.events.append(resolved)
            state = releases.read_state(host, layout)
        t_pf = time.monotonic()
        pf = run_preflight(host, p, mode, rendered, layout, plugin.version if plugin else "")
        out.preflight, out.timings["preflight"] = pf, time.monotonic() - t_pf
        out.diff = make_diff(rendered, pf, set(p.service.secrets))
        if on_plan:
            on_plan(out)
        if pf.failed:
            out.reason = "preflight refused the deploy: " + "; ".join(f"{c.name}: {c.detail}" for c in pf.failed)
            return finish()
        kg = state.known_good or adopt_baseline(host, p, layout, pf)
        out.known_good = kg
        same = pf.installed_unit == rendered.unit_text and pf.installed_env == rendered.env_text
        if same and not force_restart and not pf.plugin_needed:
            ok, detail = healthy_now(host, p)
            if ok:
                out.exit_code, out.result = DeployExit.OK, "no-change"
                out.reason = f"no changes: {rendered.release_id} is installed and healthy ({detail})"
                return finish()
        why_not = refusal(f"Deploy {rendered.release_id} to {p.name} and restart {p.service.unit}?", "a host",
                          assume_yes=assume_yes, confirm=confirm, stop=stop)
        if why_not:
            out.reason = why_not
            return finish()
        return _transaction(host, p, mode, rendered, layout, pf, plugin, kg, state.current, out, finish, abort)


def _transaction(host: Host, p: Profile, mode: str, rendered: Rendered, layout: Layout, pf: Preflight,
                 plugin: Any, kg: str | None, current: str | None, out: Outcome,
                 finish: Callable[[], Outcome], abort: Callable[[], bool] | None = None) -> Outcome:
    touched = False
    rid = rendered.release_id
    meta = releases.meta_for(rendered, "pending")
    try:
        if plugin is not None and pf.plugin_needed:
            install_plugin(host, p, plugin)
            out.events.append(f"installed the ddtree plugin {plugin.version} into {p.service.python}")
        t_install = time.monotonic()
        # the release and the pending record land before the unit is touched (same script, earlier lines)
        pre = releases.record_release(Change(), layout, rid, rendered.unit_text, rendered.env_text, meta)
        pre.write(layout.pending, releases.pending_doc(rid, current, "deploy")).audit(
            layout, f"deploy {p.name} release={rid} mode={mode} start")
        installed = (pf.installed_env.encode() if pf.installed_env is not None else None,
                     pf.installed_unit.encode() if pf.installed_unit is not None else None)
        touched = True
        started = install(host, rendered.unit_path, rendered.unit_text, rendered.env_path, rendered.env_text,
                          p.service.unit, installed=installed, pre=pre)
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
            done = releases.set_status(Change(), layout, meta, "good")
            done.mark(layout.known_good, rid).mark(layout.current, rid).remove(layout.pending).audit(
                layout, f"deploy {p.name} release={rid} result=passed")
            releases.apply(host, done, what="recording the passed deploy")
            releases.prune(host, layout, p.releases.keep)
            out.timings["record"] = time.monotonic() - t_done
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", result.reason
            out.known_good = rid
            return finish()
        out.diagnosis, out.evidence = explain_failure(result)
        out.reason = f"gate failed: {result.reason}"
        releases.apply(host, releases.set_status(Change(), layout, meta, "failed").audit(
            layout, f"deploy {p.name} release={rid} result=FAILED {result.reason!r}"), what="recording the failure")
    except KeyboardInterrupt:
        if not touched:
            raise
        out.reason = "interrupted (Ctrl-C) after the unit was changed"
        output.warn(f"{p.name}: interrupted; rolling back to the known-good release (Ctrl-C again to abandon; the "
                    "next deploy or rollback will then finish the job)")
    except HostError as exc:
        # the connection dropped mid-change: reconnect and roll back now; if the host stays out of
        # reach, the pending record on it lets the next deploy or rollback repair it
        out.reason = f"the connection dropped while installing {rid}: {exc}"
        if not reconnect(host):
            degrade(out, f". The host has a pending record for {rid}; run `ddtree-ops rollback {p.name}` (or deploy "
                         "again) once it is reachable: it finishes or rolls back that change.")
            return finish()
        output.warn(f"{p.name}: reconnected after the drop; rolling back to the known-good release")
        releases.apply(host, releases.set_status(Change(), layout, meta, "failed"), what="recording the failure")
    except OpsError as exc:
        if not touched:
            raise
        out.reason = f"installing {rid} failed: {exc}"
        releases.apply(host, Change().audit(layout, f"deploy {p.name} release={rid} result=FAILED {str(exc)!r}"),
                       what="recording the failure")
    return _roll_back_after_failure(host, p, layout, kg, current, out, finish)


def _roll_back_after_failure(host: Host, p: Profile, layout: Layout, kg: str | None, current: str | None,
                             out: Outcome, finish: Callable[[], Outcome]) -> Outcome:
    release = _known_good_release(host, layout, kg)
    if release is None:
        degrade(out, "; there is no known-good release on this host to roll back to")
        return finish()
    try:
        t_rb = time.monotonic()
        rb = rollback_to(host, p, layout, release, why=out.reason, current=current)
        out.rollback_gate = rb
        out.timings["rollback"] = time.monotonic() - t_rb
    except (HostError, OpsError) as exc:
        degrade(out, f"; rollback to {kg} could not run: {exc}")
        return finish()
    settle_rollback(out, rb.passed, healthy=f"; rolled back to {kg}, which is healthy again",
                    failed=f"; rollback to {kg} ALSO FAILED: {rb.reason}")
    return finish()


def needs_rollback(host: Host, p: Profile) -> tuple[bool, str]:
    """Whether the host's last change did not pass, and why: a pending change, not running what is
    recorded as known-good, or unhealthy."""
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    pending = releases.read_pending(host, layout)
    if pending:
        return True, f"an unfinished {pending.get('action')} of {pending.get('release_id')} is pending"
    kg = releases.read_text(host, layout.known_good)
    cur = releases.read_text(host, layout.current)
    if kg and cur and kg != cur:
        return True, f"running {cur}, not the known-good {kg}"
    ok, detail = healthy_now(host, p)
    if not ok:
        return True, f"not healthy ({detail})"
    return False, f"healthy on known-good {kg or cur or 'release'}; nothing to do"


def rollback(host: Host, p: Profile, *, to: str | None = None, lock_wait_s: float = 0) -> Outcome:
    t0 = time.monotonic()
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    out = Outcome(p.name, p.known_good_mode, to or "", DeployExit.REFUSED, "refused", "")
    with lock.held(host, layout, command=f"rollback {p.name}", release=to, wait_s=lock_wait_s):
        state = releases.read_state(host, layout)
        target = to or state.known_good
        if not target:
            out.reason = f"{p.name}: no known-good release recorded under {layout.root}; nothing to roll back to"
            return out
        out.release_id = target
        release = releases.load_release(host, layout, target)
        if release is None:
            out.reason = f"{p.name}: release {target} is not kept on the host (see `ddtree-ops history {p.name}`)"
            return out
        out.mode = release.meta.get("mode", p.known_good_mode)
        pending = state.pending
        why = "requested by the operator" if not pending else (
            f"the {pending.get('action')} of {pending.get('release_id')} did not finish")
        try:
            result = rollback_to(host, p, layout, release, why=why, current=state.current)
        except HostError as exc:
            out.exit_code, out.result, out.reason = DeployExit.DEGRADED, "degraded", str(exc)
            return out
        out.gate = result
        if result.passed:
            record_rollback(host, layout, target, pending)
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", f"{target} serving: {result.reason}"
        else:
            out.diagnosis, out.evidence = explain_failure(result)
            out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
            out.reason = f"rollback to {target} failed the gate: {result.reason}"
    out.timings["total"] = time.monotonic() - t0
    out.round_trips = getattr(host, "round_trips", 0)
    return out
