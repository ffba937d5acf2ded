"""Fleet deploys: a canary, then waves of hosts in parallel, each host its own transaction, with a
failure budget; and the read-mostly commands (history, lock status, diagnose, rollback) across many
hosts.

    targets -> hosts (inventory.py) -> profiles and releases            pure, before any connection
    preflight every host side by side, read-only                        a refusal stops here: exit 3
    plan: the canary, then waves (`plan_waves`, pure)                    --dry-run stops here
    confirm once (or --yes)
    canary -> judge -> wave 1 -> judge -> ...    each host: `deploy.deploy` on its own thread and SSH
                                                 connection: lock, pending record, gate, rollback
    no new host starts once the canary failed, a host is degraded, the failures exceed --max-fail,
    or after Ctrl-C / SIGTERM; a host already started always finishes: it passes or rolls back
    one table and one exit code (`exit_code`, pure)

The plan (sizes, waves, the budget, the exit code) is `fleet_plan.py`, pure. A failure is a host
rolled back or degraded; a host refused at its own turn (its lock taken meanwhile, unreachable)
changed nothing and is reported, not counted.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

from ddtree_ops import deploy as transaction
from ddtree_ops import output, releases
from ddtree_ops.diagnose.classify import Scanner
from ddtree_ops.errors import OpsError
from ddtree_ops.fleet_plan import (DEGRADED, DRY_RUN, FAILED, HELD, NO_CHANGE, OK, REFUSED, ROLLED_BACK,
                                   SERVING_NEW, SKIPPED, Rollout, Size, exit_code, parse_batch, parse_budget,
                                   plan_waves)
from ddtree_ops.host import Host
from ddtree_ops.lock import LockInfo, read_lock
from ddtree_ops.preflight import Preflight, run_preflight
from ddtree_ops.profile import Profile
from ddtree_ops.releases import Layout
from ddtree_ops.render import render
from ddtree_ops.status import DeployExit
from ddtree_ops.transaction import STOPPED, Outcome, read_again_after_a_drop

__all__ = ["Size", "Rollout", "parse_batch", "parse_budget", "plan_waves", "exit_code", "Target", "Checked",
           "HostResult", "FleetOutcome", "Options", "deploy_fleet", "check_one", "across", "summary_lines", "causes",
           "shorten", "FAILED", "SERVING_NEW", "DRY_RUN", "SKIPPED", "HELD"]

Connect = Callable[[Profile], AbstractContextManager[Host]]
T = TypeVar("T")

# --------------------------------------------------------------------------- results


@dataclass
class Target:
    name: str
    profile: Profile
    release_id: str
    gpu_class: str
    mode: str = ""  # what this host will run: --mode, or its profile's `mode:`

    def __post_init__(self) -> None:
        self.mode = self.mode or self.profile.desired_mode


@dataclass
class Checked:
    """What the preflight phase learned about one host (read-only)."""

    host: str
    ok: bool
    reason: str = ""
    current: str | None = None
    known_good: str | None = None
    pending: dict[str, Any] | None = None
    change: str = ""  # "install" | "no change"
    preflight: Preflight | None = None
    seconds: float = 0.0
    held: bool = False  # a promotion's host whose shadow does not justify the tree: reported, not planned


@dataclass
class HostResult:
    host: str
    wave: int | None  # 0 = the canary; None = never planned (refused in preflight)
    result: str
    reason: str
    cause: str = ""
    release: str | None = None  # what it serves now, as far as this run knows
    target_release: str = ""
    known_good: str | None = None
    seconds: float = 0.0
    outcome: Outcome | None = None
    log: list[str] = field(default_factory=list)
    root_cause: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "wave": self.wave, "result": self.result,
                "exit_code": exit_code([self.result]), "reason": self.reason, "cause": self.cause,
                "release": self.release, "target_release": self.target_release, "known_good": self.known_good,
                "seconds": round(self.seconds, 3), "root_cause": self.root_cause,
                "deploy": None if self.outcome is None else self.outcome.to_json(), "log": self.log}


@dataclass
class FleetOutcome:
    mode: str
    targets: list[str]
    rollout: Rollout
    waves: list[list[str]]
    hosts: list[HostResult]
    stopped: str | None = None
    started_at: str = ""
    finished_at: str = ""
    seconds: float = 0.0
    dry_run: bool = False
    command: str = "deploy"

    @property
    def exit_code(self) -> int:
        if self.dry_run:  # as a single host's --dry-run: 0 the plan stands, 3 a host would be refused (or,
            # promoting, every host would be held: nothing would change)
            nothing = bool(self.hosts) and all(h.result == HELD for h in self.hosts)
            return int(DeployExit.REFUSED) if nothing or any(h.result == REFUSED for h in self.hosts) \
                else int(DeployExit.OK)
        return exit_code([h.result for h in self.hosts])

    @property
    def failures(self) -> int:
        return sum(h.result in FAILED for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        code = self.exit_code
        return {"command": self.command, "mode": self.mode, "targets": self.targets,
                "result": {0: "ok", 1: "rolled-back", 2: "degraded", 3: "refused"}[code] if not self.dry_run else
                ("dry-run" if code == 0 else "refused"),
                "exit_code": code, "stopped": self.stopped,
                "rollout": {"canary": self.rollout.canary, "batch": [str(s) for s in self.rollout.batch],
                            "max_fail": str(self.rollout.max_fail),
                            "allowed_failures": self.rollout.allowed_failures(len(self.hosts)),
                            "canary_stay_s": self.rollout.canary_stay_s, "skip_refused": self.rollout.skip_refused},
                "waves": self.waves, "failures": self.failures,
                "counts": {r: n for r in (OK, NO_CHANGE, ROLLED_BACK, DEGRADED, HELD, REFUSED, SKIPPED, DRY_RUN)
                           if (n := sum(h.result == r for h in self.hosts))},
                "started_at": self.started_at, "finished_at": self.finished_at,
                "seconds": round(self.seconds, 3), "hosts": [h.to_json() for h in self.hosts]}


def summary_lines(out: FleetOutcome) -> list[str]:
    """The one table: a line per host. SERVING is what the host serves now as far as this run knows
    ("-" when nothing verified does); CAUSE is why a host did not end on the new release, and
    stays empty for those that did."""
    rows = [("HOST", "WAVE", "RESULT", "TIME", "SERVING", "CAUSE")]
    for h in out.hosts:
        wave = "-" if h.wave is None else ("canary" if h.wave == 0 else str(h.wave))
        rows.append((h.host, wave, h.result, f"{h.seconds:.1f}s" if h.seconds else "-", h.release or "-",
                     h.cause or "-"))
    return output.table(rows)


# --------------------------------------------------------------------------- the run


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def across(names: Sequence[str], fn: Callable[[str], T], *, jobs: int = 16) -> list[tuple[str, T | None, str]]:
    """fn on every name side by side; (name, value, error) in the order given. An OpsError becomes
    that host's error line; anything else is a bug and is raised."""

    def one(name: str) -> tuple[str, T | None, str]:
        try:
            return name, fn(name), ""
        except OpsError as exc:
            return name, None, str(exc).removeprefix(f"{name}: ")

    if not names:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(names))), thread_name_prefix="fleet") as pool:
        return list(pool.map(one, names))


def check_one(t: Target, connect: Connect) -> Checked:
    """Lock, pending record, releases and the whole preflight of one host; changes nothing."""
    t0 = time.monotonic()
    p, mode = t.profile, t.mode
    rendered = render(p, mode)
    layout = Layout.for_service(p.service.state_dir, p.service.unit)
    plugin = transaction.plugin_for(mode)
    with connect(p) as h:
        def read() -> tuple[LockInfo | None, releases.State, Preflight]:
            return (read_lock(h, layout), releases.read_state(h, layout),
                    run_preflight(h, p, mode, rendered, layout, plugin.version if plugin else ""))

        held, state, pf = read_again_after_a_drop(read, h)
    kg = state.target(p)
    c = Checked(t.name, True, current=state.current, known_good=kg.release_id if kg else None, pending=state.pending,
                preflight=pf, seconds=time.monotonic() - t0)
    same = pf.installed_unit == rendered.unit_text and pf.installed_env == rendered.env_text
    # the diff is the single-host view (`deploy HOST --dry-run`); a fleet's plan says install / no change
    c.change = "no change" if same and not pf.plugin_needed else "install"
    if held is not None:
        c.ok, c.reason = False, (f"deploy lock held by {held.by} (pid {held.pid}) for `{held.command}` "
                                 f"since {held.since}")
    elif pf.failed:
        c.ok, c.reason = False, "preflight: " + "; ".join(f"{x.name}: {x.detail}" for x in pf.failed)
    return c


class Interrupts:
    """Ctrl-C and SIGTERM while waves run: the first starts no new host and lets the running ones
    finish or roll back; the second rolls the running ones back now; the third abandons them (the
    pending record on each host lets the next `ddtree-ops rollback` repair it)."""

    def __init__(self) -> None:
        self.count = 0
        self.running: set[str] = set()
        self._old: dict[int, Any] = {}

    @property
    def stop(self) -> bool:
        return self.count >= 1

    @property
    def abort(self) -> bool:
        return self.count >= 2

    def _handle(self, signum: int, _frame: Any) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        running = ", ".join(sorted(self.running)) or "none"
        if self.count == 1:
            output.say(f"[bold yellow]{name}: no new host will start.[/] Running: {running}; each finishes its own "
                       "transaction (passes or rolls back). Again: roll them back now.")
        elif self.count == 2:
            output.say(f"[bold yellow]{name} again: rolling back the running hosts now[/] ({running}). Again: "
                       "abandon them; the next `ddtree-ops rollback` finds and repairs them.")
        else:
            self.restore()
            raise KeyboardInterrupt

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def __exit__(self, *exc: object) -> None:
        self.restore()


@dataclass
class Options:
    mode: str | None  # --mode for every host; None: each host's profile `mode:`
    rollout: Rollout
    dry_run: bool = False
    assume_yes: bool = False
    confirm: Callable[[str], bool] | None = None
    force_restart: bool = False
    lock_wait_s: float = 0.0
    verbose: bool = False
    jobs: int = 16
    # another per-host transaction than deploy (promote): how each host is checked read-only, and run
    check: Callable[[Target, Connect], Checked] | None = None
    run: Callable[..., Outcome] | None = None
    verb: str = "Deploy"


def deploy_fleet(targets: Sequence[Target], connect: Connect, opts: Options,
                 requested: Sequence[str] = ()) -> FleetOutcome:
    t_start, wall = time.monotonic(), time.time()
    names = [t.name for t in targets]
    by_name = {t.name: t for t in targets}
    modes = sorted({t.mode for t in targets})
    out = FleetOutcome(opts.mode or (modes[0] if len(modes) == 1 else "per-host"), list(requested) or names,
                       opts.rollout, [], [], started_at=utc(wall), dry_run=opts.dry_run, command=opts.verb.lower())

    def finish() -> FleetOutcome:
        out.seconds = time.monotonic() - t_start
        out.finished_at = utc(time.time())
        order = {n: i for i, n in enumerate(names)}
        out.hosts.sort(key=lambda h: (h.wave if h.wave is not None else -1, order[h.host]))
        return out

    # 1. preflight everything, side by side; nothing changes. Meanwhile the gate's signature
    # catalogue compiles once (about a second), not in every host's thread of the first wave.
    warm = threading.Thread(target=_warm_gate, daemon=True, name="warm-catalogue")
    warm.start()
    output.say(f"preflight of {len(names)} host{'s' if len(names) != 1 else ''} ({out.mode}) ...")
    checked: dict[str, Checked] = {}
    check = opts.check or check_one
    for name, c, err in across(names, lambda n: check(by_name[n], connect), jobs=opts.jobs):
        checked[name] = c if c is not None else Checked(name, False, reason=f"unreachable: {err}")
    refused = [c for c in checked.values() if not c.ok]
    held = [c for c in refused if c.held]
    refused = [c for c in refused if not c.held]
    for c in held:
        output.say(f"  [yellow]held[/] {c.host}: {output.escape(c.reason)}")
        out.hosts.append(HostResult(c.host, None, HELD, c.reason, shorten(c.reason), c.current,
                                    by_name[c.host].release_id, c.known_good, c.seconds))
    for c in refused:
        output.say(f"  [red]refused[/] {c.host}: {output.escape(c.reason)}")
    plannable = [n for n in names if checked[n].ok]
    if refused and opts.rollout.skip_refused:
        output.say(f"--skip-refused: {len(refused)} refused host(s) left out; the rollout goes on with "
                   f"{len(plannable)}")
    classes = {n: by_name[n].gpu_class for n in names}
    out.waves = plan_waves(plannable, opts.rollout, classes) if plannable else []
    wave_of = {h: i for i, w in enumerate(out.waves) for h in w}
    for c in refused:
        out.hosts.append(HostResult(c.host, None, REFUSED, c.reason, shorten(c.reason), c.current,
                                    by_name[c.host].release_id, c.known_good, c.seconds))
    if refused and not opts.rollout.skip_refused:
        out.stopped = (f"{len(refused)} host(s) would be refused; nothing was changed "
                       "(--skip-refused deploys to the others)")
        for n in names:
            if checked[n].ok:
                out.hosts.append(_skipped(by_name[n], checked[n], wave_of.get(n), "not started: another host was "
                                          "refused in preflight"))
        return finish()
    if not plannable:
        out.stopped = ("every host was held or refused; nothing was changed" if held else
                       "every host was refused; nothing was changed")
        return finish()
    _announce(out, checked, by_name)
    if opts.dry_run:
        for n in plannable:
            c = checked[n]
            out.hosts.append(HostResult(n, wave_of[n], DRY_RUN, f"dry run: would {c.change}", c.change, c.current,
                                        by_name[n].release_id, c.known_good, c.seconds))
        return finish()
    if not opts.assume_yes:
        question = (f"{opts.verb} {out.mode} to {len(plannable)} hosts ({len(out.waves[0])} canary, then "
                    f"{len(out.waves) - 1} wave(s))?")
        if opts.confirm is None or not opts.confirm(question):
            why = ("refusing to change hosts without confirmation: pass --yes (stdin is not a terminal)"
                   if opts.confirm is None else "not confirmed; nothing changed")
            out.stopped = why
            for n in plannable:
                out.hosts.append(_skipped(by_name[n], checked[n], wave_of[n], f"not started: {why}"))
            return finish()

    # 2. the canary, then the waves
    warm.join()
    budget = opts.rollout.allowed_failures(len(plannable))
    with Interrupts() as intr:
        for i, wave in enumerate(out.waves):
            if not wave:
                continue
            if out.stopped is None and intr.stop:
                out.stopped = "interrupted (Ctrl-C / SIGTERM): no new host started"
            if out.stopped is not None:
                for n in wave:
                    out.hosts.append(_skipped(by_name[n], checked[n], i, f"not started: {_why_stopped(out.stopped)}"))
                continue
            label = "canary" if i == 0 else f"wave {i}/{len(out.waves) - 1}"
            output.say(f"[bold]{label}:[/] {', '.join(wave)}")
            results = _run_wave(wave, i, by_name, checked, connect, opts, intr)
            out.hosts.extend(results)
            for r in results:
                output.say("  " + _line(r))
            failed = [r for r in results if r.result in FAILED]
            if i == 0 and any(r.result not in SERVING_NEW for r in results):
                out.stopped = ("the canary failed: nothing else was touched" if failed else
                               "the canary did not run (refused at its turn): nothing else was touched")
            elif any(r.result == DEGRADED for r in results):
                out.stopped = "a host is degraded: no further host starts"
            elif out.failures > budget:
                out.stopped = (f"failure budget spent: {out.failures} failed, --max-fail {opts.rollout.max_fail} "
                               f"allows {budget}")
            elif intr.stop:
                out.stopped = "interrupted (Ctrl-C / SIGTERM): no new host started"
            if out.stopped and i < len(out.waves) - 1:
                output.say(f"[bold yellow]stopping:[/] {output.escape(out.stopped)}")
    return finish()


def _warm_gate() -> None:
    Scanner()


def _why_stopped(stopped: str) -> str:
    return stopped.split(":")[0]


def _skipped(t: Target, c: Checked, wave: int | None, why: str) -> HostResult:
    return HostResult(t.name, wave, SKIPPED, why, why, c.current, t.release_id, c.known_good)


def _announce(out: FleetOutcome, checked: Mapping[str, Checked], by_name: Mapping[str, Target]) -> None:
    n = sum(len(w) for w in out.waves)
    changes = sum(checked[h].change == "install" for w in out.waves for h in w)
    output.say(f"plan: {n} hosts, {changes} to install, {n - changes} already on their release; "
               f"{out.rollout.describe(n)}")
    for i, wave in enumerate(out.waves):
        if wave:
            head = "canary" if i == 0 else f"wave {i}"
            output.say(f"  {head:<8} {', '.join(wave)}")


def _line(r: HostResult) -> str:
    colour = {OK: "green", NO_CHANGE: "green", ROLLED_BACK: "yellow", DEGRADED: "bold red", REFUSED: "red",
              SKIPPED: "dim", HELD: "yellow"}.get(r.result, "white")
    return f"[{colour}]{r.result:<11}[/] {r.host:<10} {r.seconds:6.1f}s  {r.release or '-'}  {output.escape(r.cause)}"


def _run_wave(wave: Sequence[str], index: int, by_name: Mapping[str, Target], checked: Mapping[str, Checked],
              connect: Connect, opts: Options, intr: Interrupts) -> list[HostResult]:
    """Every host of the wave at once, each on its own thread; the main thread only waits, so it
    can take Ctrl-C / SIGTERM at any moment."""
    results: dict[str, HostResult] = {}
    threads = []
    for name in wave:
        intr.running.add(name)

        def work(n: str = name) -> None:
            try:
                results[n] = _deploy_one(by_name[n], checked[n], index, connect, opts, intr)
            finally:
                intr.running.discard(n)

        th = threading.Thread(target=work, name=f"deploy-{name}", daemon=True)
        th.start()
        threads.append(th)
    watch_wave(threads, list(wave))
    return [results[n] for n in wave]


def watch_wave(threads: Sequence[threading.Thread], hosts: list[str], every_s: float = 10.0) -> None:
    """Wait for the wave, never silently: on a terminal a live line per host (its phase and the
    seconds of its deadline), off one a progress line every `every_s`. The main thread only waits,
    so Ctrl-C and SIGTERM still reach the fleet's handler at once."""
    def running() -> list[str]:
        return [h for h, th in zip(hosts, threads) if th.is_alive()]

    def lines() -> list[str]:
        return [f"  {h:<12} {s}" for h, s in output.statuses(running()).items()]

    if output.err().is_terminal:
        from rich.live import Live  # rich's live display: only for a fleet on a terminal
        from rich.text import Text

        with Live(Text(""), console=output.err(), refresh_per_second=4, transient=True) as live:
            while running():
                live.update(Text("\n".join(lines())))
                for th in threads:
                    th.join(0.05)
        return
    last = time.monotonic()
    while running():
        for th in threads:
            th.join(0.2)
        if running() and time.monotonic() - last >= every_s:
            last = time.monotonic()
            output.say("  ... " + "; ".join(f"{h}: {s}" for h, s in output.statuses(running()).items()),
                       style="dim")


def _deploy_one(t: Target, c: Checked, wave: int, connect: Connect, opts: Options, intr: Interrupts) -> HostResult:
    p = t.profile
    if wave == 0 and opts.rollout.canary_stay_s is not None:
        p = p.model_copy(update={"gate": p.gate.model_copy(update={"stay_healthy_s": opts.rollout.canary_stay_s})})
    t0 = time.monotonic()
    res = HostResult(t.name, wave, REFUSED, "", target_release=t.release_id, known_good=c.known_good,
                     release=c.current)
    with output.captured(t.name, echo=opts.verbose) as log:
        try:
            with connect(p) as h:
                if opts.run is not None:
                    o = opts.run(h, p, stop=lambda: intr.stop, abort=lambda: intr.abort)
                else:
                    o = transaction.deploy(h, p, opts.mode, assume_yes=True, force_restart=opts.force_restart,
                                           lock_wait_s=opts.lock_wait_s, stop=lambda: intr.stop,
                                           abort=lambda: intr.abort)
            res.outcome = o
            res.result, res.reason = o.result, o.reason
            if o.result == REFUSED and o.reason == STOPPED:
                res.result = SKIPPED
            res.known_good = o.known_good or c.known_good
            res.release = {OK: t.release_id, NO_CHANGE: t.release_id, ROLLED_BACK: res.known_good}.get(
                o.result, None if o.result == DEGRADED else c.current)
            rc = (o.diagnosis or {}).get("root_cause")
            res.root_cause = rc
            res.cause = _cause(o, rc)
        except OpsError as exc:  # the lock is held, the host is out of reach, an earlier change is stuck
            res.result = DEGRADED if exc.exit_code == DeployExit.DEGRADED else REFUSED
            res.reason = str(exc)
            res.cause = shorten(str(exc).removeprefix(f"{t.name}: "))
            res.release = None if res.result == DEGRADED else c.current
        except Exception as exc:  # noqa: BLE001 - a bug must not hide the other hosts' outcomes
            res.result, res.release = DEGRADED, None
            res.reason = f"internal error: {type(exc).__name__}: {exc} (the pending record on the host, if any, " \
                         f"lets `ddtree-ops rollback {t.name}` repair it)"
            res.cause = shorten(res.reason)
    res.log = log
    res.seconds = time.monotonic() - t0
    return res


def _cause(o: Outcome, rc: Mapping[str, Any] | None) -> str:
    if o.result in SERVING_NEW:
        return ""
    if o.result == REFUSED:
        return shorten(o.reason)
    head = rc.get("label") if rc else shorten(o.reason.split(";")[0].removeprefix("gate failed: "))
    tail = "rolled back" if o.result == ROLLED_BACK else "ROLLBACK FAILED"
    return f"{head}; {tail}"


def shorten(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def causes(hosts: Sequence[HostResult]) -> list[tuple[str, list[str], str]]:
    """Failed hosts grouped by root cause: (cause, hosts, remedy)."""
    groups: dict[str, tuple[list[str], str]] = {}
    for h in hosts:
        if h.result not in FAILED:
            continue
        rc = h.root_cause or {}
        key = rc.get("label") or h.cause.split(";")[0]
        groups.setdefault(key, ([], rc.get("remedy") or ""))[0].append(h.host)
    return [(k, v[0], v[1]) for k, v in groups.items()]
