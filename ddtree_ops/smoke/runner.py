"""One smoke run end to end: the targets, each host checked on its own thread with its own SSH
connection, then the state file, the textfile and the pings."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ddtree_ops.config.inventory import Inventory
from ddtree_ops.config.paths import profiles_dir
from ddtree_ops.errors import OpsError, ProfileError, UsageError
from ddtree_ops.host import HostError
from ddtree_ops.profile import Profile, SmokeSection
from ddtree_ops.smoke.judge import HostResult, judge, worst
from ddtree_ops.smoke.nagios import PLUGIN, detail_lines, status_line, to_json
from ddtree_ops.smoke.observe import Observation, observe_host
from ddtree_ops.smoke.ping import Pinger
from ddtree_ops.smoke.state import RunLock, StateStore
from ddtree_ops.smoke.textfile import write_prom

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


def load_targets(names: Sequence[str], *, all_hosts: bool, overrides: Sequence[str] = (),
                 profiles: str | None = None, inventory: str | None = None) -> list[Target]:
    """Profiles for the named hosts and groups (or every host). A name that is neither is a usage
    error (exit 64, nothing checked); a profile that does not validate makes its host UNKNOWN."""
    inv = Inventory.load(profiles_dir(profiles), inventory)
    known = inv.hosts()
    if all_hosts and names:
        raise UsageError("give host or group names or --all, not both")
    if not all_hosts and not names:
        raise UsageError("name at least one host or group, or --all" + ("" if known else " (no profiles found)"))
    chosen = list(known) if all_hosts else inv.resolve(names)
    targets = []
    for name in chosen:
        try:
            targets.append(Target(name, inv.profile(name, list(overrides))))
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
