"""Exit codes: the contract in DESIGN.md, one place.

Each command family has its own meaning for 1-3 (deploy outcomes, diagnose verdicts,
Nagios states); usage errors are 64 (EX_USAGE) so they never collide with any of them.
"""

from __future__ import annotations

from enum import IntEnum


class DeployExit(IntEnum):
    OK = 0  # serving the new release, healthy
    ROLLED_BACK = 1  # failed, rolled back, host healthy on known-good
    DEGRADED = 2  # failed and the rollback failed too
    REFUSED = 3  # refused before any change (unreachable, lock held, preflight)


# the result word of a deploy or rollback, host or service alike (its JSON document's "result")
OK, NO_CHANGE, DRY_RUN, ROLLED_BACK, DEGRADED, REFUSED = "ok", "no-change", "dry-run", "rolled-back", "degraded", "refused"


class DiagnoseExit(IntEnum):
    HEALTHY = 0
    WARNINGS = 1
    FAILURE = 2
    UNREADABLE = 3


class NagiosExit(IntEnum):
    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


USAGE = 64  # sysexits.h EX_USAGE
INTERRUPTED = 130
