"""What a host's transaction (`deploy.py`) and a multi-node service's (`service.py`) share.

    the outcome        `Outcome`: the command's result, exit code and JSON document
    the files          where a release's unit and env file go, the diff an operator reads, the
                       change that writes them beside and renames them
    asking             `refusal`: no way to ask, not confirmed, or a fleet's stop
    the gate's lines   `gate_progress`: what an operator sees while a start is gated
    after a failure    `reconnect` after a dropped connection (`read_again_after_a_drop` before any
                       change), `settle_rollback`: exit 1 when the
                       rollback left the known-good release healthy, exit 2 when it did not
    the plugin         `install_plugin` into the host's SGLang venv

Everything here acts on one host; the service applies it node by node.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ddtree_ops import gate as gating
from ddtree_ops import output, remote
from ddtree_ops.host import Host, HostError, HostUnreachable, HttpUnavailable
from ddtree_ops.observe import unit_state
from ddtree_ops.plan import Plan
from ddtree_ops.preflight import Preflight
from ddtree_ops.profile import Profile
from ddtree_ops.releases import Change
from ddtree_ops.render import Rendered, redact
from ddtree_ops.status import DEGRADED, ROLLED_BACK, DeployExit

# the reason of a deploy that a fleet's interrupt stopped before it changed anything
STOPPED = "stopped before any change: the rollout was interrupted"


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
    command: str = "deploy"  # deploy | rollback | promote: the command this outcome answers
    plan: Plan | None = None
    attempt: str | None = None  # the id of the attempt this command recorded on the host, if any

    def to_json(self) -> dict[str, Any]:
        def gate_json(g: gating.GateResult | None) -> dict[str, Any] | None:
            if g is None:
                return None
            return {"passed": g.passed, "reason": g.reason, "elapsed_s": round(g.elapsed_s, 3),
                    "ready_after_s": g.state.ready_at,
                    "smoke": None if g.state.smoke is None else g.state.smoke.__dict__}

        return {"command": self.command, "host": self.host, "mode": self.mode, "release_id": self.release_id,
                "result": self.result, "exit_code": int(self.exit_code), "reason": self.reason,
                "known_good": self.known_good, "attempt": self.attempt,
                "plan": None if self.plan is None else self.plan.to_json(),
                "preflight": None if self.preflight is None else self.preflight.to_json(),
                "gate": gate_json(self.gate), "rollback_gate": gate_json(self.rollback_gate),
                "diagnosis": self.diagnosis, "evidence": self.evidence,
                "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
                "ssh_round_trips": self.round_trips, "events": self.events}


# ------------------------------------------------------------------ the files of a release


def env_path_of(p: Profile) -> str:
    return f"{p.service.env_dir}/{p.service.unit.removesuffix('.service')}.env"


def unit_path_of(p: Profile) -> str:
    return f"/etc/systemd/system/{p.service.unit}"


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


def stage_files(change: Change, unit_path: str, unit_text: str, env_path: str, env_text: str,
                installed: tuple[bytes | None, bytes | None]) -> Change:
    """Env first (the unit names it), then the unit, each written beside and renamed, and only when
    its bytes differ from `installed` (env, unit): a rollback after a failed write has nothing to
    rewrite. Leftovers of an earlier cut-off write go first."""
    change.remove(f"{env_path}.ddtree-new").remove(f"{unit_path}.ddtree-new")
    if installed[0] != env_text.encode():
        change.mkdir(env_path.rsplit("/", 1)[0]).write(env_path, env_text, 0o600)
    if installed[1] != unit_text.encode():
        change.write(unit_path, unit_text, 0o644)
    return change


# ------------------------------------------------------------------ health, asking, progress


def health_status(host: Host, p: Profile) -> int | None:
    """/health_generate's HTTP status on the service port, None when nothing answers."""
    try:
        return host.http("GET", p.service.port, "/health_generate", timeout=min(p.gate.http_timeout_s, 5)).status
    except HttpUnavailable:
        return None


def healthy_now(host: Host, p: Profile) -> tuple[bool, str]:
    u = unit_state(host, p.service.unit)
    if not u.running:
        return False, f"unit {u.describe()}"
    try:
        status = host.http("GET", p.service.port, "/health_generate", timeout=min(p.gate.http_timeout_s, 5)).status
    except HttpUnavailable as exc:
        return False, str(exc)
    return status == 200, f"unit {u.describe()}, /health_generate {status}"


def refusal(question: str, what: str, *, assume_yes: bool, confirm: Callable[[str], bool] | None,
            stop: Callable[[], bool] | None) -> str | None:
    """Why a change must not start now (no way to ask, not confirmed, interrupted), or None; `what`
    names what would change ("a host", "hosts")."""
    if not assume_yes:
        if confirm is None:
            return f"refusing to change {what} without confirmation: pass --yes (stdin is not a terminal)"
        if not confirm(question):
            return "not confirmed; nothing changed"
    if stop is not None and stop():
        return STOPPED
    return None


def gate_progress(label: str, abort: Callable[[], bool] | None = None
                  ) -> Callable[[gating.GateState, gating.Observation], None]:
    """The gate's progress for people: a line when the phase changes and every 10 s. `abort` (a
    fleet interrupted twice) turns the next observation into Ctrl-C: the start is rolled back."""
    last = {"phase": None, "t": -10.0}

    def show(state: gating.GateState, obs: gating.Observation) -> None:
        if abort is not None and abort():
            # a fleet interrupted twice: this host rolls back now, as a single deploy does on Ctrl-C
            raise KeyboardInterrupt
        output.status(f"{label} {obs.t:.0f}s of {state.cfg.deadline_s:g}s: {state.phase.value}, "
                      f"waiting for {state.waiting_for()} (unit {obs.unit.active}/{obs.unit.sub})"
                      if state.status is gating.Status.WAIT else f"{label}: {state.status.value}")
        if state.phase != last["phase"] or obs.t - last["t"] >= 10:
            last["phase"], last["t"] = state.phase, obs.t
            if state.status is gating.Status.WAIT:
                # "\[": the label is text, not rich markup (unescaped, "[nextn]" vanished as a style tag)
                output.say(f"  \\[{label}] {obs.t:5.1f}s of {state.cfg.deadline_s:g}s: waiting for "
                           f"{state.waiting_for()} (unit {obs.unit.active}/{obs.unit.sub})", style="dim")

    return show


# ------------------------------------------------------------------ after a failure


def reconnect(host: Host) -> bool:
    """After a dropped connection: whether the host answers again (a Host without `reconnect`,
    or one that stays out of reach, does not)."""
    again = getattr(host, "reconnect", None)
    if again is None:
        return False
    try:
        again()
    except HostError:
        return False
    return True


T = TypeVar("T")


def read_again_after_a_drop(read: Callable[[], T], host: Host) -> T:
    """A read-only step (the state, the preflight) whose connection dropped: reconnect and read once
    more. Nothing has changed on the host yet, so reading again is safe, and a host that dropped one
    connection is not refused for it; a second drop, or a host that stays out of reach, is raised."""
    try:
        return read()
    except HostUnreachable as exc:
        if not reconnect(host):
            raise
        output.warn(f"{exc}; reconnected, reading the host again")
        return read()


def degrade(out: Outcome, why: str) -> None:
    """Exit 2: the host (or a node) is left without a verified release; `why` ends the reason."""
    out.exit_code, out.result = DeployExit.DEGRADED, DEGRADED
    out.reason += why


def settle_rollback(out: Outcome, passed: bool, *, healthy: str, failed: str) -> None:
    """The verdict once a failed change's rollback has run its gate: exit 1 when the known-good
    release serves and is healthy again, exit 2 when the rollback failed too. `healthy` and
    `failed` end the reason in the caller's words."""
    if passed:
        out.exit_code, out.result = DeployExit.ROLLED_BACK, ROLLED_BACK
        out.reason += healthy
    else:
        degrade(out, failed)


def install_plugin(host: Host, p: Profile, plugin: Any) -> None:
    path = f"/tmp/{plugin.filename}"
    host.put(path, plugin.data, mode=0o644)
    try:
        res = host.run(remote.pip_install(p.service.python, path), sudo=True, timeout=300)
        res.check(f"installing the ddtree plugin into {p.service.python}")
    finally:
        host.run(remote.remove(path), timeout=20)
