"""Render a diagnosis for people (rich, on stderr) and decide the exit code.

The human report is short on purpose: the cause, the line that proves it (with its line number),
the remedy with the direction and the profile key to change, then the other findings. The JSON
form is `Report.to_json()` (plus the live sections for `diagnose HOST`); the CLI adds
schema_version when it prints it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddtree_ops import output
from ddtree_ops.status import DiagnoseExit

if TYPE_CHECKING:
    from rich.console import Console

    from ddtree_ops.diagnose.classify import Finding, Report
    from ddtree_ops.diagnose.live import LiveDiagnosis

MAX_OTHER = 12  # other findings shown to people (the JSON has all of them)

_VERDICT_STYLE = {"healthy": "bold green", "degraded": "bold yellow", "failed": "bold red",
                  "inconclusive": "bold magenta"}
_DIRECTION = {"raise": "RAISE", "lower": "LOWER"}


def previous_start(report: Report) -> Finding | None:
    """The failed start before this one, noted where this start has no cause of its own (a host
    healthy again after a rolled-back deploy); LiveDiagnosis.combined adds it."""
    return next((f for f in report.findings if f.rule_id == "previous_start_failed"), None)


def exit_code(verdict: str) -> DiagnoseExit:
    """DESIGN.md's diagnose codes. `inconclusive` (no failure found and no sign of serving) is 3,
    the code for "no verdict could be read", as Nagios's 3 is UNKNOWN: never 0 (nothing showed it
    serves), not 1 (that says "serving, with warnings"), not 2 (nothing failed was found, and a
    fragment of a healthy log must not roll a service back in a script)."""
    return {"healthy": DiagnoseExit.HEALTHY, "degraded": DiagnoseExit.WARNINGS,
            "failed": DiagnoseExit.FAILURE}.get(verdict, DiagnoseExit.UNREADABLE)


def service_verdict(nodes: list[str | None]) -> str:
    """A multi-node service's verdict from its nodes' (rank 0 first; None: nothing read). Any failure
    fails it; a node that read nothing leaves it unreadable; otherwise rank 0's verdict says whether
    it serves (rank 0 serves HTTP and prints the serving lines, the other nodes' journals have none:
    their own inconclusive is not the service's), degraded if any node warned."""
    if "failed" in nodes:
        return "failed"
    if None in nodes or "unreadable" in nodes or not nodes:
        return "unreadable"  # a node read nothing: no healthy from nothing
    head = nodes[0]
    if head != "healthy":
        return head  # type: ignore[return-value]
    return "degraded" if "degraded" in nodes else "healthy"


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def remedy_head(f: Finding) -> str:
    """'RAISE memory.mem_fraction_static', 'change service.env', or '' without a profile key."""
    key = f.profile_key
    if key and f.direction:
        return f"{_DIRECTION[f.direction]} {key}"
    return f"change {key}" if key else ""


def _finding_line(f: Finding) -> str:
    colour = {"fatal": "red", "warning": "yellow", "benign": "dim"}.get(f.severity, "white")
    hw = " [bold magenta](hardware)[/]" if f.hardware else ""
    return (f"  [{colour}]{f.severity:<7}[/] line {f.line:>6}  [bold]{f.label}[/]{hw}  "
            f"{_esc(f.text.strip()[:140])}")


def render(report: Report, *, source: str, console: Console | None = None,
           live: LiveDiagnosis | None = None) -> None:
    con = console or output.err()
    style = _VERDICT_STYLE.get(report.verdict, "bold")
    con.print(f"[{style}]{report.verdict.upper()}[/]  {_esc(source)}  ({report.lines} lines read)")
    if live is not None:
        _render_live_head(con, live)
    root = report.root_cause
    last = previous_start(report)
    if root is not None:
        _render_cause(con, root)
    elif last is not None:
        con.print(f"\n[{style}]{report.verdict.upper()}[/]: the previous start failed: {last.label} "
                  f"({_esc(last.text.strip()[:200])})")
        _render_serving(con, report, live)
        _render_cause(con, last)
    elif report.verdict in ("healthy", "degraded"):
        _render_serving(con, report, live)
    elif live is not None and live.unreadable:
        con.print(f"\n[bold]could not read[/] {_esc(live.unreadable)}: no verdict from nothing.")
    if report.verdict == "inconclusive":
        con.print(f"\n[{style}]not a healthy verdict[/]: {_esc(report.not_found())}. Read more of the log "
                  "(the whole start), or ask the host: `diagnose HOST` also asks the health endpoint.")
    others = [f for f in report.findings if f is not root and f is not last and f.severity in ("fatal", "warning")]
    benign = [f for f in report.findings if f.severity == "benign"]
    if others:
        con.print(f"\n[bold]other findings[/] ({len(others)}: context and consequences of the cause)")
        for f in others[:MAX_OTHER]:
            con.print(_finding_line(f))
        if len(others) > MAX_OTHER:
            con.print(f"  ... {len(others) - MAX_OTHER} more (see --json)")
    if benign:
        labels = sorted({f.rule_id for f in benign})
        con.print(f"\n[dim]{len(benign)} scary-looking but harmless line(s) ignored: {', '.join(labels)}[/]")
    if report.memory.any():
        m = report.memory
        parts = []
        if m.kv_tokens is not None:
            parts.append(f"KV pool {m.kv_tokens} tokens" + (f" ({m.kv_gb:.2f} GB)" if m.kv_gb is not None else ""))
        if m.available_gpu_mem_gb is not None:
            parts.append(f"available after start {m.available_gpu_mem_gb:.2f} GB")
        if m.weights_gb is not None:
            parts.append(f"weights {m.weights_gb:.2f} GB")
        if parts:
            con.print(f"\n[bold]memory[/]    {'; '.join(parts)}")
    if report.accept.recent:
        vals = ", ".join(f"{v:.2f}" for v in report.accept.recent[-6:])
        con.print(f"[bold]accept len[/] last reports: {vals}")
    if live is not None:
        _render_live_tail(con, live)


def _render_serving(con: Console, report: Report, live: LiveDiagnosis | None) -> None:
    if report.serving is None:
        return
    line, what = report.serving
    where = f"line {line}: {what}" if line else (live.health[1] if live is not None and live.health else what)
    fine = "nothing to fix" if report.verdict == "healthy" else "see the warnings"
    con.print(f"\n[bold]serving[/]   {_esc(where)}; {fine}.")


def _render_cause(con: Console, root: Finding) -> None:
    con.print(f"\n[bold]cause[/]     {root.label}" + ("  [bold magenta]hardware: do not roll back the software[/]"
                                                    if root.hardware else ""))
    con.print(f"[bold]evidence[/]  line {root.line}: {_esc(root.text.strip()[:300])}")
    # show the match only where it is not obvious from the start of the line
    if root.evidence and root.text.find(root.evidence[:40]) > 40:
        con.print(f"          matched: [italic]{_esc(root.evidence[:200])}[/]")
    if root.meaning:
        con.print(f"[bold]meaning[/]   {_esc(root.meaning)}")
    d = root.description
    if d is not None:
        # a failure no rule names, described well enough to act on (fingerprint.py)
        how = f"named by {d.named_by}" if d.component.id != "unknown" else d.named_by.replace("no ", "nothing names it: no ", 1)
        con.print(f"[bold]component[/] {_esc(d.component.name)} ({_esc(how)})")
        if d.exception:
            con.print(f"[bold]exception[/] {_esc(d.exception)}: {_esc(d.message[:240])}")
    if root.context:
        con.print(f"[bold]context[/]   {_esc(root.context)}")
    if root.frames:
        con.print(f"[bold]raised in[/] {_esc(root.frames[0])}")
        for fr in root.frames[1:]:
            con.print(f"          {_esc(fr)}")
    if root.signature:
        con.print(f"[bold]search[/]    {_esc(root.signature)}")
    head = remedy_head(root)
    if head:
        con.print(f"[bold]remedy[/]    [bold]{_esc(head)}[/]")
        con.print(f"          {_esc(root.remedy)}")
    else:
        con.print(f"[bold]remedy[/]    {_esc(root.remedy)}")


def _render_live_head(con: Console, live: LiveDiagnosis) -> None:
    u = live.unit
    con.print(f"unit {_esc(live.unit_name)}: {u.active}/{u.sub}, Result={u.result}, ExecMainStatus={u.main_status}, "
              f"NRestarts={u.restarts}, MainPID={u.main_pid}" + (f", mode {live.mode}" if live.mode else ""))


def _render_live_tail(con: Console, live: LiveDiagnosis) -> None:
    if live.previous:
        con.print("\n[bold]previous starts[/]")
        for inv in live.previous:
            rc = inv.report.root_cause
            what = f"{rc.label} (line {rc.line}: {_esc(rc.text.strip()[:100])})" if rc else inv.report.verdict
            con.print(f"  {inv.invocation[:12]}  {inv.report.lines:>6} lines  {what}")
    if live.gpus or live.gpu_apps:
        con.print("\n[bold]GPU[/]")
        for g in live.gpus:
            con.print(f"  {g.index}: {_esc(g.name)}  {g.memory_used_mib}/{g.memory_total_mib} MiB used")
        for a in live.gpu_apps:
            mark = "" if a.pid == live.unit.main_pid or a.pid in live.service_pids else "  [yellow](not this service)[/]"
            con.print(f"  pid {a.pid} {_esc(a.name)} {a.used_mib} MiB{mark}")
    if live.checks:
        con.print("\n[bold]checks[/]")
        for c in live.checks:
            colour = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "dim"}.get(c.status, "white")
            con.print(f"  [{colour}]{c.status:<4}[/] {c.name}: {_esc(c.detail)}")


def to_json(report: Report, live: LiveDiagnosis | None = None) -> dict[str, Any]:
    doc = report.to_json()
    if live is not None:
        doc.update(live.to_json())
    return doc
