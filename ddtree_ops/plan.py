"""The plan of a change, decided before anything changes: what a person reads before saying yes.

    first line   "would change" or "no change", the host, the release, and the mode (with where
                 the mode came from, and the host's mode now when it differs)
    then         the rollback target and why, an interrupted run to resolve, a baseline to adopt,
                 the plugin install, the restart, the gate's deadline and stay window
    the diff     the launch line one flag per line (so NEXTN -> DDTREE is the line you see), the
                 environment's changed lines (secrets redacted), the rest of the unit as a unified diff

Pure: built from what the preflight and the state read found; `--dry-run` prints it and stops,
`--json` carries it whole (`Plan.to_json`, the unified diff included).
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass, field
from typing import Any, Sequence

from ddtree_ops.attempts import Target


@dataclass
class Plan:
    host: str
    action: str  # deploy | rollback | promote
    release_id: str
    mode: str
    mode_source: str  # "profile" | "--mode" | "rollback target" | ...
    changes: bool
    current: str | None = None
    current_mode: str | None = None
    rollback_target: Target | None = None
    resolve: str | None = None  # an interrupted run the change resolves first
    adopt: str | None = None  # the running unit becomes this baseline release
    plugin: str | None = None  # the ddtree plugin version installed first
    restart: bool = False
    deadline_s: float = 0.0
    stay_healthy_s: float = 0.0
    diff: str = ""  # the unified diff of the unit and env file (secrets redacted)
    launch: list[str] = field(default_factory=list)  # "- --flag value" / "+ --flag value"
    notes: list[str] = field(default_factory=list)

    def headline(self) -> str:
        verb = "would change" if self.changes else "no change"
        moving = (f", mode {self.current_mode} -> {self.mode}" if self.current_mode and self.current_mode != self.mode
                  else f", mode {self.mode}")
        source = f" ({self.mode_source})" if self.mode_source else ""
        now = f" (installed: {self.current})" if self.current and self.current != self.release_id else ""
        return f"{self.host}: {verb}: {self.action} {self.release_id}{now}{moving}{source}"

    def steps(self) -> list[str]:
        out = []
        if self.resolve:
            out.append(f"first: {self.resolve}")
        if self.adopt:
            out.append(f"adopt the running unit as the baseline release {self.adopt}")
        if self.plugin:
            out.append(f"install the ddtree plugin {self.plugin} into the host's SGLang")
        if self.restart:
            out.append(f"install {self.release_id}, restart, gate: ready within {self.deadline_s:g}s, then healthy "
                       f"for {self.stay_healthy_s:g}s")
        t = self.rollback_target
        out.append(f"on failure: roll back to {t.release_id} ({t.mode}): {t.why}" if t is not None else
                   "on failure: NO release to roll back to (none has passed on this host)")
        return out + self.notes

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "action": self.action, "changes": self.changes,
                "summary": self.headline(), "release_id": self.release_id, "mode": self.mode,
                "mode_source": self.mode_source, "current": self.current, "current_mode": self.current_mode,
                "rollback_target": None if self.rollback_target is None else self.rollback_target.to_json(),
                "resolve": self.resolve, "adopt": self.adopt, "plugin": self.plugin, "restart": self.restart,
                "gate": {"deadline_s": self.deadline_s, "stay_healthy_s": self.stay_healthy_s},
                "launch_diff": self.launch, "diff": self.diff, "steps": self.steps()}


# ------------------------------------------------------------------ the launch line, one flag a line


def exec_start(unit_text: str | None) -> list[str]:
    """The argv of a unit's ExecStart= (systemd's quoting is the shell's for what render writes;
    a line that cannot be split is one token, so it still shows in the diff)."""
    for line in (unit_text or "").splitlines():
        if line.startswith("ExecStart="):
            cmd = line.removeprefix("ExecStart=").lstrip("-@:+!")
            try:
                return shlex.split(cmd)
            except ValueError:
                return [cmd]
    return []


def flag_lines(argv: Sequence[str]) -> list[str]:
    """`python -m sglang.launch_server` on the first line, then each flag with its values."""
    out: list[str] = []
    for tok in argv:
        if tok.startswith("--") or not out:
            out.append(tok)
        else:
            out[-1] += " " + shlex.quote(tok) if out[-1].startswith("--") else " " + tok
    return out


def launch_diff(old_argv: Sequence[str], new_argv: Sequence[str]) -> list[str]:
    """The flags that change, removed ("- ") before added ("+ "), in launch-line order."""
    a, b = flag_lines(old_argv), flag_lines(new_argv)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            out += [f"- {x}" for x in a[i1:i2]] + [f"+ {x}" for x in b[j1:j2]]
    return out


def unified(label: str, old: str | None, new: str, *, skip_exec: bool = False) -> str:
    """A unified diff of one file; with `skip_exec` the ExecStart= line is left to `launch_diff`."""
    def lines(text: str | None) -> list[str]:
        kept = (text or "").splitlines(keepends=True)
        return [x for x in kept if not (skip_exec and x.startswith("ExecStart="))]

    return "".join(difflib.unified_diff(lines(old), lines(new), f"{label} (installed)" if old is not None
                                        else "/dev/null", f"{label} (new)"))
