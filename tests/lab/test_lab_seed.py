"""Seeding a lab host's NEXTN service after a stop that ended "failed".

Real SGLang (and the stand-in, which follows it) can end a stop as "failed": when systemd's SIGTERM
reaches the scheduler before the parent handles it, the parent logs the scheduler as crashed with
exit code -15 and SIGKILLs itself, so systemd records result 'signal'. `lab restore` stops the service
and seeds it again; the CI run of 2026-12-05 read that stop's "failed" as the new start's failure,
because a start queued with --no-block has not begun when the first poll asks `is-active`. The host
here is systemd as seed sees it, in memory: the unit stays "failed" until reset-failed or until the
queued start begins, and that start begins only after the first poll."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddtree_ops.host import HttpResponse, HttpUnavailable, Result
from ddtree_ops.lab.seed import seed_nextn
from ddtree_ops.profile import load_profile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


class StoppedFailedHost:
    """A unit whose last stop ended "failed", and whose queued start begins one poll late."""

    name = "ct129"

    def __init__(self) -> None:
        self.state = "failed"
        self.start_queued = False
        self.polls_since_queued = 0
        self.commands: list[list[str]] = []

    def run(self, argv: Any, *, stdin: bytes | None = None, timeout: float = 60.0, sudo: bool = False) -> Result:
        argv = [str(a) for a in argv]
        self.commands.append(argv)
        out = ""
        if argv[:2] == ["systemctl", "reset-failed"] and self.state == "failed":
            self.state = "inactive"
        elif argv[:2] == ["systemctl", "enable"]:
            self.start_queued = True
        elif argv[:2] == ["systemctl", "is-active"]:
            if self.start_queued:
                self.polls_since_queued += 1
                if self.polls_since_queued > 1:         # the queued job has begun: the start is up
                    self.state = "active"
            out = self.state + "\n"
        elif argv[:2] == ["journalctl", "-u"]:
            out = "Stopped sglang.service\n"
        return Result(tuple(argv), 0, out, "")

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        pass

    def http(self, method: str, port: int, path: str, **kw: Any) -> HttpResponse:
        if self.state != "active":
            raise HttpUnavailable("connection refused")
        return HttpResponse(200, b"", 0.01)


def test_seed_after_a_stop_that_ended_failed_waits_for_the_new_start() -> None:
    host = StoppedFailedHost()
    profile = load_profile("ct129", directory=PROFILES)
    seed_nextn(host, profile, timeout=10)              # without the reset-failed: LabError "failed while seeding"
    assert host.state == "active"
    verbs = [" ".join(c[:2]) for c in host.commands]
    assert verbs.index("systemctl reset-failed") < verbs.index("systemctl enable")
