"""A lab host's starting point: the state the real hosts were in before the experiment, with the
NEXTN service installed, enabled and healthy, and no ddtree-ops state yet (as on a host that was
set up by hand). The first `ddtree-ops deploy` adopts that running unit as the known-good
baseline release, exactly as it would on a real host."""

from __future__ import annotations

import posixpath
import time
from typing import Any

from ddtree_ops.host import Host, HttpUnavailable
from ddtree_ops.lab._sys import LabError
from ddtree_ops.render import render


def seed_nextn(host: Host, profile: Any, *, timeout: float = 120.0) -> Any:
    """Install `render(profile, "nextn")` exactly as a deploy would write it, enable and start it, and
    wait until /health_generate answers 200. Returns the Rendered release."""
    r = render(profile, "nextn")
    host.run(["mkdir", "-p", posixpath.dirname(r.env_path), posixpath.dirname(r.unit_path)]).check("mkdir")
    host.put(r.env_path, r.env_text.encode(), mode=0o600)
    host.put(r.unit_path, r.unit_text.encode(), mode=0o644)
    host.run(["systemctl", "daemon-reload"], timeout=60).check("daemon-reload")
    # a stop just before (a restore) can end "failed": SGLang's scheduler dying of the SIGTERM first makes
    # the parent SIGKILL itself, as real SGLang does. Until the queued start begins, is-active would say
    # "failed" for that stop, and the poll below would take it for this start's failure.
    host.run(["systemctl", "reset-failed", r.unit_name], timeout=30)
    # --no-block: the unit stays "activating" until its readiness probe passes; we poll instead
    host.run(["systemctl", "enable", "--now", "--no-block", r.unit_name], timeout=60).check("enable --now")
    wait_healthy(host, profile, timeout=timeout)
    return r


def wait_healthy(host: Host, profile: Any, *, timeout: float) -> None:
    port = profile.service.port
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        state = host.run(["systemctl", "is-active", profile.service.unit], timeout=30).stdout.strip()
        if state == "failed":
            tail = host.run(["journalctl", "-u", profile.service.unit, "-n", "15", "--no-pager", "-o", "cat"],
                            timeout=30).stdout
            raise LabError(f"{host.name}: {profile.service.unit} failed while seeding the NEXTN service:\n{tail}")
        # the rendered unit is "active" only once its own readiness probe passed: ask HTTP only then
        # (a refused port-forward makes paramiko log a line per attempt)
        if state == "active":
            try:
                resp = host.http("GET", port, "/health_generate", timeout=5)
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
            except HttpUnavailable as exc:
                last = str(exc)
        else:
            last = f"unit {state}"
        time.sleep(0.3)
    raise LabError(f"{host.name}: the NEXTN service was not healthy after {timeout:g}s ({last})")


def unseed(host: Host, profile: Any) -> None:
    """A fresh host: the service stopped, disabled and its unit and environment files gone, as on a
    machine where nobody set SGLang up as a service yet (its venv and models stay)."""
    r = render(profile, "nextn")
    unit = r.unit_name
    host.run(["systemctl", "disable", "--now", unit], timeout=120)
    host.run(["rm", "-f", "--", r.unit_path, r.env_path]).check("removing the seeded unit")
    host.run(["systemctl", "daemon-reload"], timeout=60).check("daemon-reload")
    host.run(["systemctl", "reset-failed", unit], timeout=30)
    if host.run(["systemctl", "cat", unit], timeout=30).rc == 0:
        raise LabError(f"{host.name}: {unit} is still known to systemd after removing its file")
