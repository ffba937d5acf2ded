"""Rendering that several commands share: a host's deploy or rollback outcome, the plan printed
before a change, the preflight checks and the per-card table.

stderr carries people (through `output`), stdout carries data. Journal lines and reasons quoting them
are text, never rich markup (a log's "[/...]" would crash it). Imports only the tool's light
modules: `output` loads rich itself, on the first line it prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddtree_ops import output

if TYPE_CHECKING:
    from ddtree_ops.preflight import Preflight
    from ddtree_ops.deploy import Outcome

# the result word of a deploy or rollback, host or service alike
RESULT_COLOUR = {"ok": "green", "no-change": "green", "dry-run": "cyan", "rolled-back": "yellow",
                 "degraded": "bold red", "refused": "red"}
MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


def card_lines(pf: "Preflight", node: str = "") -> list[str]:
    """One row per card the service owns: what preflight found, and what SGLang will have there."""
    if len(pf.cards) < 2 and not node:
        return []
    rows = [("CARD", "RANK", "GPU", "TOTAL MiB", "FREE MiB", "SERVICE", "OTHERS", "FOR IT")]
    for c in pf.cards:
        rows.append((str(c.index), c.rank, c.name[:34], f"{c.total_mib:,}", f"{c.free_mib:,}", f"{c.ours_mib:,}",
                     f"{c.others_mib:,}", f"{c.free_for_service:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    head = f"  {node} " if node else "  "
    out = [head + "  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    if pf.memory is not None and pf.memory.cards > 1:
        m = pf.memory
        out.append(f"  per rank: {m.weights_gib + m.draft_weights_gib:.1f} GiB weights, KV pool {m.tokens:,} tokens "
                   f"from the least free card ({m.free_before_load_gib:.1f} GiB)")
    return out


def show_checks(pf: "Preflight", node: str = "") -> None:
    for c in pf.checks:
        output.say(f"  {MARKS[c.status]} {c.name:<13} {output.escape(c.detail)}")
    for line in card_lines(pf, node):
        output.err().print(line, markup=False, highlight=False)


def show_plan(out: "Outcome") -> None:
    """The plan a person reads before saying yes: its first line says "would change" or "no
    change" and the mode (bold when --mode overrides the profile's, or when it changes the host's);
    then the steps (what is adopted, installed, restarted, how it is gated, where a failure goes),
    the preflight, and the diff: the launch line one flag per line, the rest as a unified diff."""
    pf, plan = out.preflight, out.plan
    if plan is not None:
        head = output.escape(plan.headline())
        loud = plan.mode_source == "--mode" or (plan.current_mode not in (None, plan.mode))
        output.say(f"[bold]{head}[/]" if loud else head, style=None)
        for step in plan.steps():
            output.say(f"  {output.escape(step)}", style="dim")
    if pf is not None:
        output.say(f"[bold]{out.host}[/] preflight for {out.release_id}:")
        show_checks(pf)
        if not pf.ok:
            return
    if plan is None or plan.changes:
        show_diff(plan.launch if plan else [], out.diff)


def show_diff(launch: list[str], unified: str) -> None:
    """The launch line's flags that change, red and green on a terminal, then the rest of the
    unit and env file as a unified diff (its ExecStart= lines are the flags above)."""
    if launch:
        output.say("[bold]launch line:[/]")
        for line in launch:
            colour = "red" if line.startswith("-") else "green"
            output.say(f"  [{colour}]{output.escape(line)}[/]")
    rest = [ln for ln in unified.splitlines(keepends=True)
            if not (ln[:1] in "+-" and ln[1:].startswith("ExecStart="))]
    if any(ln[:1] in "+-" and not ln.startswith(("+++", "---")) for ln in rest):
        output.say("[bold]files:[/]")
        for ln in rest:
            colour = ("red" if ln.startswith("-") and not ln.startswith("---") else
                      "green" if ln.startswith("+") and not ln.startswith("+++") else None)
            output.err().print(ln.rstrip("\n"), markup=False, highlight=False, style=colour)


def show_outcome(out: "Outcome") -> None:
    """A host's outcome for people, after the plan and the gate's progress."""
    escape = output.escape
    for e in out.events:
        output.say(f"  {escape(e)}")
    if out.diagnosis:
        rc = out.diagnosis.get("root_cause")
        if rc:
            output.say(f"[bold red]root cause:[/] {rc.get('label')} (line {rc.get('line')}): "
                       f"{escape(str(rc.get('evidence')))}")
            if rc.get("remedy"):
                output.say(f"[bold]remedy:[/] {escape(rc['remedy'])}")
        if out.evidence:
            output.say("[bold]journal of this start (last lines):[/]")
            for line in out.evidence[-12:]:
                output.err().print("  " + line, markup=False, highlight=False)
    colour = RESULT_COLOUR.get(out.result, "white")
    output.say(f"[{colour}]{out.result.upper()}[/] {out.host} {out.mode}: {escape(out.reason)}")
    if out.result == "degraded":
        output.say(f"[bold red]{out.host} IS DEGRADED:[/] it is not serving a verified release. "
                   f"Inspect with `ddtree-ops diagnose {out.host}`; `ddtree-ops history {out.host}` lists releases.")
