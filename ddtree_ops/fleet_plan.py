"""A fleet's plan, pure: how many hosts a size means, the canary and the waves, the failure budget
and the exit code of a whole rollout.

Sizes are Ansible's: a count or a share of all the targets (rounded down, at least one host per
wave), and a ramp `1,5,25%` whose last step repeats. The run that follows the plan is `fleet.py`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ddtree_ops.errors import UsageError
from ddtree_ops.status import DEGRADED, DRY_RUN, NO_CHANGE, OK, REFUSED, ROLLED_BACK, DeployExit

# a host a fleet never started (the rollout stopped before its turn); the other results are a deploy's
SKIPPED = "skipped"
# a promotion's host whose shadow does not (yet) justify the tree: reported, never a failure
HELD = "held"
FAILED = (ROLLED_BACK, DEGRADED)
SERVING_NEW = (OK, NO_CHANGE)
__all__ = ["OK", "NO_CHANGE", "DRY_RUN", "ROLLED_BACK", "DEGRADED", "REFUSED", "SKIPPED", "HELD", "FAILED",
           "SERVING_NEW",
           "Size", "Rollout", "parse_size", "parse_batch", "parse_budget", "plan_waves", "exit_code"]


@dataclass(frozen=True)
class Size:
    """A number of hosts, or a share of all the targets."""

    count: int = 0
    percent: float | None = None

    def of(self, total: int, *, at_least: int = 1) -> int:
        n = self.count if self.percent is None else math.floor(total * self.percent / 100 + 1e-9)
        return max(at_least, n)

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)


def parse_size(text: str, *, option: str, zero: bool = False) -> Size:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)(%?)\s*", text)
    if m is None or (not m.group(2) and "." in m.group(1)):
        raise UsageError(f"{option} {text!r}: expected a number of hosts (3) or a share of them (25%)")
    value = float(m.group(1))
    if m.group(2):
        if value > 100 or (value == 0 and not zero):
            raise UsageError(f"{option} {text!r}: a share is {'0' if zero else 'above 0'} to 100%")
        return Size(percent=value)
    if value < (0 if zero else 1):
        raise UsageError(f"{option} {text!r}: at least {'0' if zero else '1'}")
    return Size(count=int(value))


def parse_batch(spec: str) -> tuple[Size, ...]:
    """`3`, `25%`, or a ramp `1,5,25%` (the last step repeats until every host has had its turn)."""
    parts = [p for p in spec.split(",")]
    if not spec.strip() or any(not p.strip() for p in parts):
        raise UsageError(f"--batch {spec!r}: expected N, P% or a ramp such as 1,5,25%")
    return tuple(parse_size(p, option="--batch") for p in parts)


def parse_budget(spec: str) -> Size:
    return parse_size(spec, option="--max-fail", zero=True)


@dataclass(frozen=True)
class Rollout:
    canary: int = 1
    batch: tuple[Size, ...] = (Size(percent=25.0),)
    max_fail: Size = Size(0)
    canary_stay_s: float | None = None  # the canary's own stay-healthy window (None: the profile's)
    skip_refused: bool = False

    def allowed_failures(self, total: int) -> int:
        return self.max_fail.of(total, at_least=0)

    def describe(self, total: int) -> str:
        allowed = self.allowed_failures(total)
        return (f"--canary {self.canary} --batch {','.join(map(str, self.batch))} --max-fail {self.max_fail} "
                f"({allowed} failure{'s' if allowed != 1 else ''} allowed of {total})")


def plan_waves(hosts: Sequence[str], rollout: Rollout, classes: Mapping[str, str] | None = None) -> list[list[str]]:
    """Wave 0 is the canary (empty with --canary 0); the rest follow in the given order.

    Canaries are taken across GPU classes in turn (`classes`: host -> class), so a canary of 2 over
    A6000 and Blackwell hosts tries one of each: a release that breaks one class shows on its canary."""
    hosts = list(dict.fromkeys(hosts))
    total = len(hosts)
    by_class: dict[str, list[str]] = {}
    for h in hosts:
        by_class.setdefault((classes or {}).get(h, ""), []).append(h)
    canary: list[str] = []
    queues = [list(v) for v in by_class.values()]
    while len(canary) < min(rollout.canary, total):
        for q in queues:
            if q and len(canary) < rollout.canary:
                canary.append(q.pop(0))
    rest = [h for h in hosts if h not in canary]
    waves = [canary]
    step = 0
    while rest:
        size = rollout.batch[min(step, len(rollout.batch) - 1)].of(total)
        waves.append(rest[:size])
        rest = rest[size:]
        step += 1
    return waves


def exit_code(results: Sequence[str]) -> int:
    """0 every host serves the new release (a promotion: every host whose shadow justified the tree
    serves it, the others held); 2 any host degraded; 3 nothing was changed anywhere (refused or held
    before any change); 1 otherwise: not every host got the new release (rolled back, refused or not
    started) and every host serves a known-good release."""
    if any(r == DEGRADED for r in results):
        return int(DeployExit.DEGRADED)
    if results and all(r in (REFUSED, SKIPPED, HELD) for r in results):
        return int(DeployExit.REFUSED)
    if all(r in SERVING_NEW or r in (DRY_RUN, HELD) for r in results):
        return int(DeployExit.OK)
    return int(DeployExit.ROLLED_BACK)
