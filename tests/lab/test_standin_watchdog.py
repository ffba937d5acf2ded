"""The stand-in's subprocess watchdog against a stop: the stop's SIGTERM reaches the launcher and its
scheduler together, and the launcher's "SIGTERM received" line must come before the watchdog's
"Subprocess scheduler_0 ... crashed with exit code -15", as in every real 0.5.17 log of a stop
(tests/data/real-sglang/0.5.17/6_tax_*.log). A log with the crash first is a crash with no stop
before it, and `diagnose` calls it a failure: a CI run of 2026-12-05 on a loaded box got that."""

from __future__ import annotations

import asyncio
import os
import signal
from types import SimpleNamespace

import pytest

from ddtree_ops.lab.standin import lines, scheduler


class ChildStoppedAsTheWatchdogLooks:
    """The worst moment: the group's SIGTERM lands between the watchdog's wake and its poll."""

    pid = 4242

    def poll(self) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # this process's C-level handler runs before kill returns
        return -signal.SIGTERM


def test_the_stop_is_logged_before_the_scheduler_it_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    logged: list[str] = []
    monkeypatch.setattr(scheduler.sglog, "error", lambda msg, *a, **k: logged.append(msg))
    s = SimpleNamespace(watching=True, child=ChildStoppedAsTheWatchdogLooks(), rank_children=[], child_crashed=False)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGQUIT)}

    async def stop() -> None:
        loop = asyncio.get_running_loop()
        quit_sent = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, lambda: logged.append(lines.SIGTERM_RECEIVED))  # serving.sigterm
        loop.add_signal_handler(signal.SIGQUIT, quit_sent.set)
        await asyncio.wait_for(scheduler.Scheduler.watch_children(s), 10)  # type: ignore[arg-type]
        await asyncio.wait_for(quit_sent.wait(), 10)

    try:
        asyncio.run(stop())
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert logged[0] == lines.SIGTERM_RECEIVED
    assert logged[1].startswith("Subprocess scheduler_0 (pid=4242) crashed with exit code -15.")
    assert s.child_crashed and not s.watching
