"""The readiness gate: one loop, one deadline, and a verdict that explains itself.

Pure part: `GateState.step(observation)` decides WAIT / PASS / FAIL from what one poll saw.
Loop part: `run_gate` takes one observation per poll interval (unit state and this start's new
journal lines in a single SSH round trip, then HTTP through the same connection) and feeds it in.

FAIL at once when the unit fails or restarts (NRestarts, MainPID or InvocationID change), when
a fatal signature appears in this start's journal, or when the smoke request fails; PASS only
after /health_generate is 200, the smoke request succeeded, and the service stayed that way for
the stay-healthy window. An "active" unit whose server is dead therefore fails within a poll or
two of its crash line, not at the deadline.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from ddtree_ops import remote
from ddtree_ops.diagnose.classify import Scanner
from ddtree_ops.host import Host, HostUnreachable, HttpUnavailable, RemoteTimeout
from ddtree_ops.observe import JournalLine, UnitState, parse_journal_json, parse_systemctl_show
from ddtree_ops.profile import Profile
from ddtree_ops.smoke.parse import parse_generate

SEP = "\x1e"
RESTART_PENDING_S = 60.0  # from `systemctl start` to a new InvocationID: seconds, never minutes


class Phase(str, Enum):
    STARTING = "starting"  # waiting for /health_generate
    SMOKE = "smoke"  # health is 200; one real request
    STAY = "stay"  # smoke passed; must stay healthy for the window
    DONE = "done"


class Status(str, Enum):
    WAIT = "wait"
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    reason: str
    latency_s: float = 0.0
    text: str = ""
    verify_ct: int | None = None
    accept_len: float | None = None


@dataclass(frozen=True)
class Observation:
    t: float  # seconds since the restart
    unit: UnitState
    lines: list[JournalLine]
    health: int | None = None  # HTTP status of /health_generate; None: not asked or nothing answered
    health_error: str = ""
    smoke: SmokeResult | None = None


@dataclass(frozen=True)
class GateConfig:
    deadline_s: float
    stay_s: float
    poll_s: float
    http_timeout_s: float
    speculative: bool


@dataclass
class GateState:
    cfg: GateConfig
    scanner: Any  # ddtree_ops.diagnose.classify.Scanner: incremental journal classification
    previous_invocation: str = ""  # the start before our restart: its state is not ours to judge
    phase: Phase = Phase.STARTING
    first_unit: UnitState | None = None
    ready_at: float | None = None
    stay_from: float | None = None
    status: Status = Status.WAIT
    reason: str = ""
    fatal: Any = None  # the Finding that failed the gate, if a journal line did
    fatal_line: JournalLine | None = None
    lines: list[JournalLine] = field(default_factory=list)
    smoke: SmokeResult | None = None
    # False for the nodes of a multi-node service other than rank 0: SGLang serves HTTP on rank 0
    # only, so such a node is judged by its unit and journal alone (it never passes by itself)
    serves_http: bool = True
    failed_at: float | None = None  # seconds into the gate when this node failed
    last_unit: UnitState | None = None

    def waiting_for(self) -> str:
        return {Phase.STARTING: "/health_generate to answer 200", Phase.SMOKE: "the smoke request",
                Phase.STAY: f"the service to stay healthy for {self.cfg.stay_s:g}s",
                Phase.DONE: "nothing"}[self.phase]

    def _fail(self, reason: str, t: float | None = None) -> Status:
        self.status, self.reason, self.phase = Status.FAIL, reason, Phase.DONE
        self.failed_at = t
        return self.status

    def step(self, obs: Observation) -> Status:
        if self.status is not Status.WAIT:
            return self.status
        if self.previous_invocation and obs.unit.invocation == self.previous_invocation:
            # the start is queued but systemd has not begun the new invocation yet
            limit = min(self.cfg.deadline_s, RESTART_PENDING_S)
            if obs.t >= limit:
                return self._fail(f"systemd did not start a new invocation of the unit within {limit:g}s "
                                  f"({obs.unit.describe()})")
            return self.status
        self.last_unit = obs.unit
        self.lines.extend(obs.lines)
        # the journal first: its first fatal line names the cause better than the unit state does
        for finding in self.scanner.feed([ln.message for ln in obs.lines]):
            if finding.severity == "fatal" and self.fatal is None:
                self.fatal = finding
                self.fatal_line = _line_for(obs.lines, finding)
        if self.fatal is not None:
            return self._fail(f"fatal log line ({self.fatal.label}): {self.fatal.text.strip()[:200]}")
        u, first = obs.unit, self.first_unit
        if first is None and u.invocation:
            self.first_unit = first = u
        if not u.exists:
            return self._fail("the unit is not loaded (LoadState=not-found)")
        if u.failed:
            return self._fail(f"the unit failed ({u.describe()})")
        if u.active in ("inactive", "deactivating") and first is not None:
            return self._fail(f"the unit stopped ({u.describe()})")
        if first is not None:
            if u.restarts > first.restarts:
                return self._fail(f"systemd restarted the service (NRestarts {first.restarts} -> {u.restarts})")
            if u.invocation and u.invocation != first.invocation:
                return self._fail("the service was started again (new invocation) during the gate")
            if first.main_pid and u.main_pid != first.main_pid:
                if not u.main_pid:
                    return self._fail(f"the main process {first.main_pid} exited ({u.describe()})")
                return self._fail(f"the main process changed ({first.main_pid} -> {u.main_pid})")
        if not self.serves_http:
            return self.status
        if self.phase is Phase.STARTING:
            if obs.health == 200:
                self.phase, self.ready_at = Phase.SMOKE, obs.t
            elif obs.t >= self.cfg.deadline_s:
                why = f"last answer: {obs.health}" if obs.health else (obs.health_error or "no answer")
                return self._fail(f"not ready after {self.cfg.deadline_s:g}s ({why}; unit {u.describe()})")
        if self.phase is Phase.SMOKE and obs.smoke is not None:
            self.smoke = obs.smoke
            if not obs.smoke.ok:
                return self._fail(f"smoke request failed: {obs.smoke.reason}")
            self.phase, self.stay_from = Phase.STAY, obs.t
        elif self.phase is Phase.STAY:
            if obs.health is not None and obs.health != 200:
                return self._fail(f"/health_generate went from 200 to {obs.health} inside the stay window")
            if obs.health is None and obs.health_error:
                return self._fail(f"/health_generate stopped answering inside the stay window ({obs.health_error})")
            if self.stay_from is not None and obs.t - self.stay_from >= self.cfg.stay_s:
                self.status, self.phase = Status.PASS, Phase.DONE
                self.reason = (f"ready after {self.ready_at:.1f}s, smoke ok ({self.smoke.reason if self.smoke else ''}), "
                               f"stayed healthy for {self.cfg.stay_s:g}s")
        return self.status


def _line_for(lines: list[JournalLine], finding: Any) -> JournalLine | None:
    needle = (getattr(finding, "evidence", "") or "").strip()
    for ln in lines:
        if needle and needle in ln.message:
            return ln
    return lines[-1] if lines else None


# ------------------------------------------------------------------ probes


def smoke_request(host: Host, p: Profile, *, speculative: bool, timeout: float) -> SmokeResult:
    """The profile's smoke request; for speculative modes, proof that drafts are being accepted."""
    body = {"text": p.smoke.prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": p.smoke.max_new_tokens}}
    try:
        resp = host.http("POST", p.service.port, "/generate", body=body, timeout=timeout)
    except HttpUnavailable as exc:
        return SmokeResult(False, str(exc))
    if resp.status != 200:
        return SmokeResult(False, f"/generate answered {resp.status}: {resp.text[:200]}", resp.elapsed_s)
    gen = parse_generate(resp.body)
    result = (gen.text, gen.verify_ct, gen.accept_len)
    if gen.problem:
        return SmokeResult(False, f"/generate {gen.problem}", resp.elapsed_s, *result)
    if not gen.text.strip():
        return SmokeResult(False, "/generate returned empty text", resp.elapsed_s, *result)
    if speculative:
        if not gen.verify_ct:
            return SmokeResult(False, "no speculative verify steps (spec_verify_ct is 0 or missing): "
                               "the server is not running speculative decoding", resp.elapsed_s, *result)
        if gen.accept_len is None or gen.accept_len <= 1.0:
            return SmokeResult(False, f"acceptance length {gen.accept_len} is not above 1.00: the draft path "
                               "is broken", resp.elapsed_s, *result)
    detail = f"{resp.elapsed_s:.2f}s" + (f", accept length {gen.accept_len:.2f}" if gen.accept_len else "")
    return SmokeResult(True, detail, resp.elapsed_s, *result)


# ------------------------------------------------------------------ the loop


@dataclass
class GateResult:
    passed: bool
    reason: str
    elapsed_s: float
    state: GateState
    verdict_wall: float  # time.time() of the verdict, to measure detection latency

    @property
    def report(self) -> Any:
        return self.state.scanner.report()


def is_speculative(p: Profile, mode: str) -> bool:
    return p.mode(mode).algorithm != "NONE"


# One remote loop per gate instead of one SSH session per poll: each frame is the unit's state and
# the journal lines since the last frame (journalctl keeps its place in a cursor file), then the
# loop sleeps one poll interval. HTTP probes travel as direct-tcpip channels, which open no
# session at all, so a whole gate costs the host one login (one PAM session, one auth.log line).
WATCH = r'''
u=$1; iv=$2; f=$(mktemp) || exit 1; trap 'rm -f "$f"' EXIT; printf '%s' "$3" > "$f"
while :; do
  systemctl show --property "$4" -- "$u" || exit 1
  printf '\036\n'
  if [ -s "$f" ]; then n=""; else n="--lines=2000"; fi
  journalctl --unit "$u" --output json --no-pager --quiet --cursor-file "$f" $n --output-fields "$5"
  printf '\035\n'
  sleep "$iv"
done
'''


def watch_argv(unit: str, cursor: str | None, poll_s: float) -> list[str]:
    return ["sh", "-c", WATCH, "sh", unit, f"{poll_s:g}", cursor or "", ",".join(remote.UNIT_PROPS),
            remote.JOURNAL_FIELDS]


def read_frame(watch: Any, timeout: float) -> tuple[UnitState, list[JournalLine]]:
    show: list[str] = []
    journal: list[str] = []
    part = show
    while True:
        line = watch.readline(timeout)
        if line is None:
            raise HostUnreachable("the gate's watcher on the host stopped")
        if line == SEP:
            part = journal
        elif line == "\x1d":
            return parse_systemctl_show("\n".join(show)), parse_journal_json("\n".join(journal))
        else:
            part.append(line)


def run_gate(host: Host, p: Profile, mode: str, *, cursor: str | None, previous_invocation: str = "",
             on_progress: Callable[[GateState, Observation], None] | None = None,
             clock: Callable[[], float] = time.monotonic, deadline_s: float | None = None) -> GateResult:
    cfg = GateConfig(deadline_s=deadline_s or p.gate.startup_deadline_s, stay_s=p.gate.stay_healthy_s,
                     poll_s=p.gate.poll_interval_s, http_timeout_s=p.gate.http_timeout_s,
                     speculative=is_speculative(p, mode))
    state = GateState(cfg, Scanner(), previous_invocation)
    t0 = clock()
    invocation = ""

    def ours(lines: list[JournalLine]) -> list[JournalLine]:
        return [ln for ln in lines if (not ln.invocation or not invocation or ln.invocation == invocation)
                and not (previous_invocation and ln.invocation == previous_invocation)]

    try:
        with host.stream(watch_argv(p.service.unit, cursor, cfg.poll_s)) as watch:
            while True:
                u, lines = read_frame(watch, timeout=30 + cfg.poll_s)
                if u.invocation != previous_invocation:
                    invocation = invocation or u.invocation
                health, health_err, smoke = None, "", None
                if u.active in ("active", "activating") and not u.failed:
                    try:
                        health = host.http("GET", p.service.port, "/health_generate",
                                           timeout=min(cfg.http_timeout_s, 5.0)).status
                    except HttpUnavailable as exc:
                        health_err = str(exc)
                    if state.phase is Phase.SMOKE or (state.phase is Phase.STARTING and health == 200):
                        smoke = smoke_request(host, p, speculative=cfg.speculative, timeout=cfg.http_timeout_s)
                obs = Observation(clock() - t0, u, ours(lines), health, health_err, smoke)
                status = state.step(obs)
                if on_progress:
                    on_progress(state, obs)
                if status is not Status.WAIT:
                    break
            verdict_wall, elapsed = time.time(), clock() - t0
            if state.status is Status.FAIL:
                # the lines right after the first fatal one often name the real cause: read one more
                # frame for the diagnosis (the verdict and its timing are already fixed)
                try:
                    more = ours(read_frame(watch, timeout=5 + cfg.poll_s)[1])
                    state.lines.extend(more)
                    state.scanner.feed([ln.message for ln in more])
                except (HostUnreachable, RemoteTimeout):
                    pass
    except (HostUnreachable, RemoteTimeout) as exc:
        if state.status is Status.WAIT:
            state._fail(f"lost the connection to the host during the gate ({exc})")
        verdict_wall, elapsed = time.time(), clock() - t0
    return GateResult(state.status is Status.PASS, state.reason, elapsed, state, verdict_wall)


# ------------------------------------------------------------------ a service over several nodes


@dataclass(frozen=True)
class NodeStart:
    """One node of a multi-node service as its gate needs it: where it is, and the start to judge."""

    host: Host
    profile: Profile
    cursor: str | None
    previous_invocation: str = ""

    @property
    def rank(self) -> int:
        return self.profile.multinode.node_rank if self.profile.multinode else 0


@dataclass
class ServiceGateResult:
    passed: bool
    reason: str
    elapsed_s: float
    states: list[GateState]  # one per node, in rank order
    verdict_wall: float
    failed_rank: int | None = None  # the node that failed the gate (the first whose journal or unit did)
    names: list[str] = field(default_factory=list)

    @property
    def state(self) -> GateState:
        """Rank 0's: the one that went through readiness, smoke and the stay window."""
        return self.states[0]

    @property
    def report(self) -> Any:
        i = self.failed_rank if self.failed_rank is not None else 0
        return self.states[i].scanner.report()


def service_verdict(states: list[GateState], names: list[str]) -> tuple[Status, str, int | None]:
    """Pure: the whole service's verdict from its nodes' states. Any node that failed fails the
    service (the first to fail names it); it passes when rank 0 passed its gate and every other
    node's unit runs."""
    failed = [(st.failed_at if st.failed_at is not None else float("inf"), i) for i, st in enumerate(states)
              if st.status is Status.FAIL]
    if failed:
        _, i = min(failed)
        return Status.FAIL, f"{names[i]} (node rank {i}): {states[i].reason}", i
    if states[0].status is Status.PASS:
        return Status.PASS, states[0].reason + f"; {len(states) - 1} other node(s) running", None
    return Status.WAIT, "", None


def run_service_gate(nodes: list[NodeStart], mode: str, *,
                     on_progress: Callable[[GateState, Observation], None] | None = None,
                     clock: Callable[[], float] = time.monotonic, deadline_s: float | None = None) -> ServiceGateResult:
    """The gate of one multi-node service: every node's unit state and this start's journal in one
    loop (one watcher per node), rank 0's HTTP readiness, smoke request and stay window. A fatal
    line or a failed unit on any node fails the whole service at once."""
    p0 = nodes[0].profile
    cfg = GateConfig(deadline_s=deadline_s or p0.gate.startup_deadline_s, stay_s=p0.gate.stay_healthy_s,
                     poll_s=p0.gate.poll_interval_s, http_timeout_s=p0.gate.http_timeout_s,
                     speculative=is_speculative(p0, mode))
    states = [GateState(cfg, Scanner(), n.previous_invocation, serves_http=(i == 0)) for i, n in enumerate(nodes)]
    names = [n.profile.name for n in nodes]
    invocations = [""] * len(nodes)
    t0 = clock()
    status, reason, failed_rank = Status.WAIT, "", None

    def ours(i: int, lines: list[JournalLine]) -> list[JournalLine]:
        inv, prev = invocations[i], nodes[i].previous_invocation
        return [ln for ln in lines if (not ln.invocation or not inv or ln.invocation == inv)
                and not (prev and ln.invocation == prev)]

    # one reader per node: the loop below waits on rank 0's HTTP probes, and a node's frames must
    # not queue up behind them (the gate would judge a node by what it was seconds ago)
    frames: list[queue.Queue[Any]] = [queue.Queue() for _ in nodes]

    def pump(i: int, watch: Any) -> None:
        try:
            while True:
                frames[i].put(read_frame(watch, timeout=30 + cfg.poll_s))
        except Exception as exc:  # noqa: BLE001 - handed to the loop, which decides
            frames[i].put(exc)

    def latest(i: int, wait_s: float) -> tuple[UnitState, list[JournalLine]]:
        """Every frame the node's reader has, merged: the newest unit state, all journal lines."""
        try:
            got = [frames[i].get(timeout=wait_s)]
        except queue.Empty:
            raise RemoteTimeout(f"{names[i]}: no output from the watcher for {wait_s:g}s") from None
        while True:
            try:
                got.append(frames[i].get_nowait())
            except queue.Empty:
                break
        lines: list[JournalLine] = []
        unit = None
        for item in got:
            if isinstance(item, Exception):
                raise item
            unit, more = item
            lines += more
        assert unit is not None
        return unit, lines

    def observe(i: int, watch: Any) -> Observation:
        u, lines = latest(i, 30 + cfg.poll_s)
        if u.invocation != nodes[i].previous_invocation:
            invocations[i] = invocations[i] or u.invocation
        health, health_err, smoke = None, "", None
        host, p = nodes[i].host, nodes[i].profile
        if i == 0 and u.active in ("active", "activating") and not u.failed:
            try:
                health = host.http("GET", p.service.port, "/health_generate",
                                   timeout=min(cfg.http_timeout_s, 5.0)).status
            except HttpUnavailable as exc:
                health_err = str(exc)
            st = states[0]
            if st.phase is Phase.SMOKE or (st.phase is Phase.STARTING and health == 200):
                smoke = smoke_request(host, p, speculative=cfg.speculative, timeout=cfg.http_timeout_s)
        return Observation(clock() - t0, u, ours(i, lines), health, health_err, smoke)

    try:
        with ExitStack() as stack:
            watches = [stack.enter_context(n.host.stream(watch_argv(n.profile.service.unit, n.cursor, cfg.poll_s)))
                       for n in nodes]
            for i, watch in enumerate(watches):
                threading.Thread(target=pump, args=(i, watch), daemon=True, name=f"gate-{names[i]}").start()
            while status is Status.WAIT:
                for i, watch in enumerate(watches):
                    try:
                        obs = observe(i, watch)
                    except (HostUnreachable, RemoteTimeout) as exc:
                        if states[i].status is Status.WAIT:
                            states[i]._fail(f"lost the connection to the node during the gate ({exc})", clock() - t0)
                        continue
                    before = states[i].status
                    states[i].step(obs)
                    if before is Status.WAIT and states[i].status is Status.FAIL:
                        states[i].failed_at = obs.t
                    if i == 0 and on_progress:
                        on_progress(states[0], obs)
                if states[0].status is Status.PASS:
                    for st in states[1:]:
                        if st.status is Status.WAIT and not _running(st):
                            what = st.last_unit.describe() if st.last_unit else "unknown"
                            st._fail(f"its unit is {what} although rank 0 passed", clock() - t0)
                status, reason, failed_rank = service_verdict(states, names)
            verdict_wall, elapsed = time.time(), clock() - t0
            if status is Status.FAIL:
                # the lines right after a fatal one often name the real cause: one more frame per node
                for i, watch in enumerate(watches):
                    try:
                        more = ours(i, latest(i, 5 + cfg.poll_s)[1])
                        states[i].lines.extend(more)
                        states[i].scanner.feed([ln.message for ln in more])
                    except (HostUnreachable, RemoteTimeout):
                        pass
    except (HostUnreachable, RemoteTimeout) as exc:
        if status is Status.WAIT:
            status, reason, failed_rank = Status.FAIL, f"lost the connection to a node during the gate ({exc})", None
        verdict_wall, elapsed = time.time(), clock() - t0
    return ServiceGateResult(status is Status.PASS, reason, elapsed, states, verdict_wall, failed_rank, names)


def _running(st: GateState) -> bool:
    return st.last_unit is not None and st.last_unit.running
