"""The monitoring-plugin output: one status line with perfdata after `|`, the long output (one
block per host), and the same results as one JSON document."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

from ddtree_ops.smoke.judge import HostResult, worst
from ddtree_ops.status import NagiosExit


PLUGIN = "DDTREE-SMOKE"
# past this many hosts the OK ones are folded: the status line names only the others and counts the
# OK ones, and the long output gives an OK host one line (the JSON keeps every check of every host)
FOLD = 5


def status_line(results: Sequence[HostResult]) -> str:
    """The one Nagios line: state, per-host summary, then all perfdata after `|`."""
    overall = worst([r.state for r in results])
    fold = len(results) > FOLD
    parts = [f"{r.host}: " + ("OK" if r.state is NagiosExit.OK else ", ".join(r.reasons) or r.state.name)
             for r in results if not (fold and r.state is NagiosExit.OK)]
    n_ok = sum(r.state is NagiosExit.OK for r in results)
    if fold and n_ok:
        parts.append(f"{n_ok} of {len(results)} hosts OK")
    perf = " ".join(p.render() for r in results for p in r.perfdata)
    line = f"{PLUGIN} {overall.name} - " + ("; ".join(parts) or "no hosts")
    # '|' would start the perfdata early; Nagios has no escape for it
    line = line.replace("|", "/")
    return f"{line} | {perf}" if perf else line


def detail_lines(results: Sequence[HostResult]) -> list[str]:
    """Nagios long output: one block per host, one line per check (an OK host: one line, when
    there are more than FOLD hosts)."""
    out = []
    fold = len(results) > FOLD
    for r in results:
        mode = f" [{r.mode}]" if r.mode else ""
        head = f"{r.host}{mode}: {r.state.name} ({r.observation.duration_s:.2f}s)"
        if fold and r.state is NagiosExit.OK:
            accept, latency = r.value("accept_len"), r.value("latency")
            out.append(head + (f" accept_len {accept:.2f}" if accept is not None else "")
                       + (f" latency {latency:.2f}s" if latency is not None else ""))
            continue
        out.append(head)
        for c in r.checks:
            out.append(f"  {c.name}: {c.status.upper()} {c.detail}".replace("|", "/"))
    return out


def to_json(results: Sequence[HostResult], *, started_at: str, finished_at: str) -> dict[str, Any]:
    overall = worst([r.state for r in results])
    return {
        "command": "smoke", "result": overall.name.lower(), "exit_code": int(overall),
        "summary": status_line(results).split(" | ")[0], "started_at": started_at, "finished_at": finished_at,
        "hosts": [{
            "host": r.host, "mode": r.mode, "release": r.observation.release, "result": r.state.name.lower(),
            "exit_code": int(r.state), "reasons": r.reasons, "duration_ms": round(r.observation.duration_s * 1000),
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in r.checks],
            "metrics": {p.label.removeprefix(f"{r.host}_"): p.value for p in r.perfdata},
            "unit": asdict(r.observation.unit) if r.observation.unit else None,
        } for r in results],
    }
