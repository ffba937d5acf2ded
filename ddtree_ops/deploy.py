"""deploy and rollback: one transaction that ends with a verified service or the known-good one.

    lock -> resolve an interrupted earlier deploy -> preflight (refuse = nothing changed)
         -> no-op when the same release is installed and healthy
         -> plan + diff -> confirm -> [plugin install] -> record release + pending
         -> install env and unit (write beside, rename) -> daemon-reload -> reset-failed -> restart
         -> gate -> PASS: known-good | FAIL: diagnosis, reinstall known-good, same gate
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ddtree_ops import gate as gating
from ddtree_ops import lock, output, releases, remote
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError, HttpUnavailable
from ddtree_ops.observe import journal_cursor, unit_state
from ddtree_ops.preflight import Preflight, run_preflight
from ddtree_ops.profile import Profile
from ddtree_ops.releases import Layout
from ddtree_ops.render import Rendered, redact, render
from ddtree_ops.status import DeployExit


@dataclass
class Outcome:
    host: str
    mode: str
    release_id: str
    exit_code: int
    result: str  # ok | no-change | dry-run | rolled-back | degraded | refused
    reason: str
    known_good: str | None = None
    preflight: Preflight | None = None
    gate: gating.GateResult | None = None
    rollback_gate: gating.GateResult | None = None
    diagnosis: dict[str, Any] | None = None
    evidence: list[str] = field(default_factory=list)
    diff: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    round_trips: int = 0
    events: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def gate_json(g: gating.GateResult | None) -> dict[str, Any] | None:
            if g is None:
                return None
            return {"passed": g.passed, "reason": g.reason, "elapsed_s": round(g.elapsed_s, 3),
                    "smoke": None if g.state.smoke is None else g.state.smoke.__dict__}

        return {"command": "deploy", "host": self.host, "mode": self.mode, "release_id": self.release_id,
                "result": self.result, "exit_code": self.exit_code, "reason": self.reason,
                "known_good": self.known_good,
                "preflight": None if self.preflight is None else self.preflight.to_json(),
                "gate": gate_json(self.gate), "rollback_gate": gate_json(self.rollback_gate),
                "diagnosis": self.diagnosis, "evidence": self.evidence,
                "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
                "ssh_round_trips": self.round_trips, "events": self.events}


class Interrupted(Exception):
    """Ctrl-C inside the transaction, after the unit was touched."""


# ------------------------------------------------------------------ pieces


def redact_env(text: str | None, secret_keys: set[str]) -> str:
    if text is None:
        return ""
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in secret_keys:
            out.append(f"{key}={redact(value.strip().strip(chr(39)).strip(chr(34)))}")
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def make_diff(rendered: Rendered, pf: Preflight, secret_keys: set[str]) -> str:
    parts = []
    for label, old, new in ((rendered.unit_path, pf.installed_unit, rendered.unit_text),
                            (rendered.env_path, redact_env(pf.installed_env, secret_keys) if pf.installed_env else None,
                             rendered.env_redacted)):
        a = (old or "").splitlines(keepends=True)
        b = new.splitlines(keepends=True)
        parts.extend(difflib.unified_diff(a, b, f"{label} (installed)" if old is not None else "/dev/null",
                                          f"{label} (release {rendered.release_id})"))
    return "".join(parts)


def healthy_now(host: Host, p: Profile) -> tuple[bool, str]:
    u = unit_state(host, p.service.unit)
    if not u.running:
        return False, f"unit {u.describe()}"
    try:
        status = host.http("GET", p.service.port, "/health_generate", timeout=min(p.gate.http_timeout_s, 5)).status
    except HttpUnavailable as exc:
        return False, str(exc)
    return status == 200, f"unit {u.describe()}, /health_generate {status}"


def install(host: Host, layout: Layout, unit_path: str, unit_text: str, env_path: str, env_text: str,
            unit: str) -> tuple[str | None, str]:
    """Env first (the unit names it), then the unit; each written beside and renamed, and only
    when its bytes differ (a rollback after a failed write then has nothing to rewrite).
    Returns the journal cursor and the InvocationID taken just before the restart: the gate reads
    and judges this start only."""
    from ddtree_ops.observe import read_files

    # staging files left by a run whose connection dropped between write and rename
    host.run(remote.remove(f"{env_path}.ddtree-new", f"{unit_path}.ddtree-new"), sudo=True, timeout=20)
    current = read_files(host, [env_path, unit_path])
    if current[env_path] != env_text.encode():
        host.run(remote.mkdirs(env_path.rsplit("/", 1)[0]), sudo=True, timeout=20).check("creating the env directory")
        releases.write_atomic(host, env_path, env_text.encode(), mode=0o600)
    if current[unit_path] != unit_text.encode():
        releases.write_atomic(host, unit_path, unit_text.encode(), mode=0o644)
    host.run(remote.daemon_reload(), sudo=True, timeout=60).check("systemctl daemon-reload")
    host.run(remote.reset_failed(unit), sudo=True, timeout=20)
    host.run(remote.enable(unit), sudo=True, timeout=30)
    cursor = journal_cursor(host, unit)
    before = unit_state(host, unit).invocation
    host.run(remote.restart(unit), sudo=True, timeout=60).check(f"systemctl restart {unit}")
    return cursor, before


def _progress(label: str) -> Callable[[gating.GateState, gating.Observation], None]:
    last = {"phase": None, "t": -10.0}

    def show(state: gating.GateState, obs: gating.Observation) -> None:
        if state.phase != last["phase"] or obs.t - last["t"] >= 10:
            last["phase"], last["t"] = state.phase, obs.t
            if state.status is gating.Status.WAIT:
                output.say(f"  [{label}] {obs.t:5.1f}s of {state.cfg.deadline_s:g}s: waiting for "
                           f"{state.waiting_for()} (unit {obs.unit.active}/{obs.unit.sub})", style="dim")

    return show


def explain_failure(result: gating.GateResult) -> tuple[dict[str, Any], list[str]]:
    report = result.report
    doc = report.to_json()
    evidence = [ln.message for ln in result.state.lines[-25:]]
    return doc, evidence


# ------------------------------------------------------------------ rollback


def known_good(host: Host, layout: Layout) -> str | None:
    return releases.read_text(host, layout.known_good)


def rollback_to(host: Host, p: Profile, layout: Layout, release_id: str, *, why: str) -> gating.GateResult:
    files = releases.release_files(host, layout, release_id)
    if files is None:
        raise OpsError(f"{host.name}: release {release_id} is not in {layout.releases}; cannot roll back to it",
                       exit_code=DeployExit.DEGRADED)
    meta = releases.load_meta(host, layout, release_id) or {}
    mode = meta.get("mode", p.known_good_mode)
    unit_text, env_text = files
    output.say(f"{host.name}: rolling back to {release_id} ({mode}): {why}", style="bold yellow")
    releases.write_pending(host, layout, release_id=release_id, previous=releases.read_text(host, layout.current),
                           action="rollback")
    cursor, before = install(host, layout, meta.get("unit_path", f"/etc/systemd/system/{p.service.unit}"),
                             unit_text,
                             meta.get("env_path", f"{p.service.env_dir}/{p.service.unit.removesuffix('.service')}.env"),
                             env_text, p.service.unit)
    releases.audit(host, layout, f"rollback {p.name} release={release_id} reason={why!r}")
    result = gating.run_gate(host, p, mode, cursor=cursor, previous_invocation=before,
                             on_progress=_progress("rollback"))
    if result.passed:
        releases.mark(host, layout.current, release_id)
        releases.clear_pending(host, layout)
        releases.audit(host, layout, f"rollback {p.name} release={release_id} result=healthy")
    else:
        releases.audit(host, layout, f"rollback {p.name} release={release_id} result=FAILED {result.reason!r}")
    return result


def adopt_baseline(host: Host, p: Profile, layout: Layout, pf: Preflight) -> str | None:
    """First deploy on a host that already serves: keep what runs as the known-good baseline."""
    if pf.installed_unit is None or pf.installed_env is None:
        return None
    ok, _ = healthy_now(host, p)
    if not ok:
        return None
    import hashlib

    rid = "baseline-" + hashlib.sha256((pf.installed_unit + pf.installed_env).encode()).hexdigest()[:12]
    d = layout.release_dir(rid)
    host.run(remote.mkdirs(d, mode="0700"), sudo=True, timeout=20).check(f"creating {d}")
    releases.write_atomic(host, f"{d}/unit", pf.installed_unit.encode())
    releases.write_atomic(host, f"{d}/env", pf.installed_env.encode(), mode=0o600)
    import json

    meta = {"release_id": rid, "host": p.name, "mode": p.known_good_mode, "status": "good",
            "created_at": releases.utc_now(), "by": releases.operator(), "adopted": True,
            "unit_path": f"/etc/systemd/system/{p.service.unit}",
            "env_path": f"{p.service.env_dir}/{p.service.unit.removesuffix('.service')}.env"}
    releases.write_atomic(host, f"{d}/meta.json", json.dumps(meta, indent=1).encode())
    releases.mark(host, layout.known_good, rid)
    releases.mark(host, layout.current, rid)
    releases.audit(host, layout, f"adopt {p.name} release={rid} (the running unit becomes the known-good baseline)")
    output.say(f"{host.name}: adopted the running {p.service.unit} as known-good baseline {rid}")
    return rid


def _age_s(stamp: str | None) -> float:
    import calendar

    try:
        return max(0.0, time.time() - calendar.timegm(time.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return float("inf")


def resolve_interrupted(host: Host, p: Profile, layout: Layout) -> str | None:
    """A deploy or rollback that never finished left pending.json: finish it or roll it back."""
    pending = releases.read_pending(host, layout)
    if pending is None:
        return None
    rid = pending.get("release_id")
    note = (f"{host.name}: an earlier {pending.get('action', 'deploy')} of {rid} by {pending.get('by', '?')} "
            f"(pid {pending.get('pid', '?')}, {pending.get('started_at', '?')}) did not finish")
    output.warn(note)
    kg = known_good(host, layout)
    installed = (host.get(f"/etc/systemd/system/{p.service.unit}") or b"").decode()
    files = releases.release_files(host, layout, rid) if rid else None
    if files and installed == files[0]:
        meta = releases.load_meta(host, layout, rid) or {}
        # the start began when that run did: it gets what is left of its deadline, not a new one
        left = p.gate.startup_deadline_s - _age_s(pending.get("started_at"))
        output.say(f"{host.name}: release {rid} is installed; gating it now to finish that {pending.get('action')}")
        result = gating.run_gate(host, p, meta.get("mode", p.known_good_mode), cursor=None,
                                 on_progress=_progress("resume"),
                                 deadline_s=max(left, p.gate.stay_healthy_s + 4 * p.gate.poll_interval_s))
        if result.passed:
            releases.set_status(host, layout, rid, "good")
            releases.mark(host, layout.known_good, rid)
            releases.mark(host, layout.current, rid)
            releases.clear_pending(host, layout)
            releases.audit(host, layout, f"resume {p.name} release={rid} result=passed")
            return f"finished the interrupted {pending.get('action')}: {rid} passed the gate"
        why = f"the interrupted release failed the gate: {result.reason}"
    else:
        why = "the interrupted change never reached a verified state"
    if not kg:
        raise OpsError(f"{note}, and there is no known-good release to return to", exit_code=DeployExit.DEGRADED)
    result = rollback_to(host, p, layout, kg, why=why)
    if not result.passed:
        raise OpsError(f"{host.name}: rollback to {kg} failed the gate: {result.reason}", exit_code=DeployExit.DEGRADED)
    if rid and rid != kg:
        releases.set_status(host, layout, rid, "failed")
    return f"rolled back the interrupted change to {kg}"


# ------------------------------------------------------------------ deploy


def deploy(host: Host, p: Profile, mode: str, *, dry_run: bool = False, assume_yes: bool = False,
           confirm: Callable[[str], bool] | None = None, force_restart: bool = False, lock_wait_s: float = 0,
           skip_preflight_checks: tuple[str, ...] = ()) -> Outcome:
    t0 = time.monotonic()
    rendered = render(p, mode)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    out = Outcome(p.name, mode, rendered.release_id, DeployExit.REFUSED, "refused", "")

    def finish() -> Outcome:
        out.timings["total"] = time.monotonic() - t0
        out.round_trips = getattr(host, "round_trips", 0)
        return out

    from ddtree_ops.wheel import build

    plugin = build() if mode == "ddtree-shadow" else None
    if dry_run:
        pf = run_preflight(host, p, mode, rendered, layout, plugin.version if plugin else "")
        out.preflight, out.timings["preflight"] = pf, time.monotonic() - t0
        out.diff = make_diff(rendered, pf, set(p.service.secrets))
        pending = releases.read_pending(host, layout)
        if pending:
            out.events.append(f"an interrupted {pending.get('action')} of {pending.get('release_id')} would be "
                              "resolved first")
        ok = pf.ok
        out.exit_code = DeployExit.OK if ok else DeployExit.REFUSED
        out.result = "dry-run" if ok else "refused"
        out.reason = "dry run: nothing changed" if ok else "preflight: " + "; ".join(c.detail for c in pf.failed)
        return finish()

    with lock.held(host, layout, command=f"deploy {p.name} --mode {mode}", release=rendered.release_id,
                   wait_s=lock_wait_s):
        resolved = resolve_interrupted(host, p, layout)
        if resolved:
            out.events.append(resolved)
        pf = run_preflight(host, p, mode, rendered, layout, plugin.version if plugin else "")
        out.preflight, out.timings["preflight"] = pf, time.monotonic() - t0
        out.diff = make_diff(rendered, pf, set(p.service.secrets))
        failed = [c for c in pf.failed if c.name not in skip_preflight_checks]
        if failed:
            out.reason = "preflight refused the deploy: " + "; ".join(f"{c.name}: {c.detail}" for c in failed)
            return finish()
        kg = known_good(host, layout) or adopt_baseline(host, p, layout, pf)
        out.known_good = kg
        same = pf.installed_unit == rendered.unit_text and pf.installed_env == rendered.env_text
        if same and not force_restart and not pf.plugin_needed:
            ok, detail = healthy_now(host, p)
            if ok:
                out.exit_code, out.result = DeployExit.OK, "no-change"
                out.reason = f"no changes: {rendered.release_id} is installed and healthy ({detail})"
                return finish()
        if not assume_yes:
            question = f"Deploy {rendered.release_id} to {p.name} and restart {p.service.unit}?"
            if confirm is None:
                out.reason = "refusing to change a host without confirmation: pass --yes (stdin is not a terminal)"
                return finish()
            if not confirm(question):
                out.reason = "not confirmed; nothing changed"
                return finish()
        return _transaction(host, p, mode, rendered, layout, pf, plugin, kg, out, finish)


def _transaction(host: Host, p: Profile, mode: str, rendered: Rendered, layout: Layout, pf: Preflight,
                 plugin: Any, kg: str | None, out: Outcome, finish: Callable[[], Outcome]) -> Outcome:
    touched = False
    try:
        if plugin is not None and pf.plugin_needed:
            install_plugin(host, p, plugin)
            out.events.append(f"installed the ddtree plugin {plugin.version} into {p.service.python}")
        releases.save_release(host, layout, rendered, status="pending")
        releases.write_pending(host, layout, release_id=rendered.release_id,
                               previous=releases.read_text(host, layout.current), action="deploy")
        releases.audit(host, layout, f"deploy {p.name} release={rendered.release_id} mode={mode} start")
        touched = True
        t_install = time.monotonic()
        cursor, before = install(host, layout, rendered.unit_path, rendered.unit_text, rendered.env_path,
                                 rendered.env_text, p.service.unit)
        out.timings["install"] = time.monotonic() - t_install
        output.say(f"{p.name}: installed {rendered.release_id}, restarting {p.service.unit}; gating")
        result = gating.run_gate(host, p, mode, cursor=cursor, previous_invocation=before,
                                 on_progress=_progress(mode))
        out.gate = result
        out.timings["gate"] = result.elapsed_s
        if result.passed:
            releases.set_status(host, layout, rendered.release_id, "good")
            releases.mark(host, layout.known_good, rendered.release_id)
            releases.mark(host, layout.current, rendered.release_id)
            releases.clear_pending(host, layout)
            releases.audit(host, layout, f"deploy {p.name} release={rendered.release_id} result=passed")
            releases.prune(host, layout, p.releases.keep)
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", result.reason
            out.known_good = rendered.release_id
            return finish()
        out.diagnosis, out.evidence = explain_failure(result)
        out.reason = f"gate failed: {result.reason}"
        releases.set_status(host, layout, rendered.release_id, "failed")
        releases.audit(host, layout, f"deploy {p.name} release={rendered.release_id} result=FAILED {result.reason!r}")
    except KeyboardInterrupt:
        if not touched:
            raise
        out.reason = "interrupted (Ctrl-C) after the unit was changed"
        output.warn(f"{p.name}: interrupted; rolling back to the known-good release (Ctrl-C again to abandon; the "
                    "next deploy or rollback will then finish the job)")
    except HostError as exc:
        # the connection dropped mid-change: reconnect and roll back now; if the host stays out of
        # reach, the pending record on it lets the next deploy or rollback repair it
        out.reason = f"the connection dropped while installing {rendered.release_id}: {exc}"
        if not _reconnect(host):
            out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
            out.reason += (f". The host has a pending record for {rendered.release_id}; run `ddtree-ops rollback "
                           f"{p.name}` (or deploy again) once it is reachable: it finishes or rolls back that change.")
            return finish()
        output.warn(f"{p.name}: reconnected after the drop; rolling back to the known-good release")
        releases.set_status(host, layout, rendered.release_id, "failed")
    except OpsError as exc:
        if not touched:
            raise
        out.reason = f"installing {rendered.release_id} failed: {exc}"
        releases.audit(host, layout, f"deploy {p.name} release={rendered.release_id} result=FAILED {str(exc)!r}")
    return _roll_back_after_failure(host, p, layout, kg, out, finish)


def _roll_back_after_failure(host: Host, p: Profile, layout: Layout, kg: str | None, out: Outcome,
                             finish: Callable[[], Outcome]) -> Outcome:
    if not kg:
        out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
        out.reason += "; there is no known-good release on this host to roll back to"
        return finish()
    try:
        t_rb = time.monotonic()
        rb = rollback_to(host, p, layout, kg, why=out.reason)
        out.rollback_gate = rb
        out.timings["rollback"] = time.monotonic() - t_rb
    except (HostError, OpsError) as exc:
        out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
        out.reason += f"; rollback to {kg} could not run: {exc}"
        return finish()
    if rb.passed:
        out.exit_code, out.result = DeployExit.ROLLED_BACK, "rolled-back"
        out.reason += f"; rolled back to {kg}, which is healthy again"
    else:
        out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
        out.reason += f"; rollback to {kg} ALSO FAILED: {rb.reason}"
    return finish()


def _reconnect(host: Host) -> bool:
    reconnect = getattr(host, "reconnect", None)
    if reconnect is None:
        return False
    try:
        reconnect()
    except HostError:
        return False
    return True


def install_plugin(host: Host, p: Profile, plugin: Any) -> None:
    path = f"/tmp/{plugin.filename}"
    host.put(path, plugin.data, mode=0o644)
    try:
        res = host.run(remote.pip_install(p.service.python, path), sudo=True, timeout=300)
        res.check(f"installing the ddtree plugin into {p.service.python}")
    finally:
        host.run(remote.remove(path), timeout=20)


def rollback(host: Host, p: Profile, *, to: str | None = None, lock_wait_s: float = 0) -> Outcome:
    t0 = time.monotonic()
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    target = to
    out = Outcome(p.name, p.known_good_mode, target or "", DeployExit.REFUSED, "refused", "")
    with lock.held(host, layout, command=f"rollback {p.name}", release=to, wait_s=lock_wait_s):
        pending = releases.read_pending(host, layout)
        target = to or known_good(host, layout)
        if not target:
            out.reason = f"{p.name}: no known-good release recorded under {layout.root}; nothing to roll back to"
            return out
        out.release_id = target
        meta = releases.load_meta(host, layout, target)
        if meta is None:
            out.reason = f"{p.name}: release {target} is not kept on the host (see `ddtree-ops history {p.name}`)"
            return out
        out.mode = meta.get("mode", p.known_good_mode)
        why = "requested by the operator" if not pending else (
            f"the {pending.get('action')} of {pending.get('release_id')} did not finish")
        try:
            result = rollback_to(host, p, layout, target, why=why)
        except HostError as exc:
            out.exit_code, out.result, out.reason = DeployExit.DEGRADED, "degraded", str(exc)
            return out
        out.gate = result
        if result.passed:
            releases.mark(host, layout.known_good, target)
            out.exit_code, out.result, out.reason = DeployExit.OK, "ok", f"{target} serving: {result.reason}"
            if pending and pending.get("release_id") not in (None, target):
                releases.set_status(host, layout, pending["release_id"], "failed")
        else:
            out.diagnosis, out.evidence = explain_failure(result)
            out.exit_code, out.result = DeployExit.DEGRADED, "degraded"
            out.reason = f"rollback to {target} failed the gate: {result.reason}"
    out.timings["total"] = time.monotonic() - t0
    out.round_trips = getattr(host, "round_trips", 0)
    return out
