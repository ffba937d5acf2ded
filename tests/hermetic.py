"""What the suite pins about the machine and the day (issue 29): the environment every machine gives
it, and the control host's name. tests/conftest.py applies them before any test module is imported;
tests/unit/test_hermetic.py holds them.

Imported as `hermetic` (tests/ is on sys.path, as for labkit).
"""

from __future__ import annotations

from typing import Mapping, MutableMapping

# the lab's own controls pass through: where its hosts live, whether to keep them, its Debian mirror
KEEP = {"DDTREE_LAB_HOME", "DDTREE_LAB_KEEP", "DDTREE_LAB_MIRROR", "DDTREE_OPS_CACHE"}
# rich and click read these for width and colour; pinned below
TERMINAL = ("FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES",
            "JUPYTER_COLUMNS", "JUPYTER_LINES", "TERM", "NO_COLOR")
LOCALE = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_NUMERIC", "LC_TIME", "LOCPATH")
XDG = ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR")
# the CPU count: torch (OpenMP) starts one thread per CPU in every process. Four workers on two CPUs, each
# with a torch child or two, then ran every parallel op as a gang that waits for its descheduled members:
# three processes of a small Llama took 35 s each instead of 3.7 s with one thread (2-CPU box, 2026-12-05).
# One thread everywhere, which also gives every machine the same reduction order.
PINNED = {"TZ": "UTC", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "NO_COLOR": "1", "COLUMNS": "80", "LINES": "25",
          "TERM": "dumb", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CONTROL_HOST = "control.ddtree-tests.invalid"  # .invalid: no machine is called this (RFC 2606)


def operator_setting(name: str) -> bool:
    """A variable of the operator's own that the tool, its plugin or the stand-in reads."""
    return (name.startswith(("DDTREE_", "SGLANG_")) and name not in KEEP) or name == "PROMETHEUS_MULTIPROC_DIR"


def pin_environment(environ: MutableMapping[str, str], home: str, carried: Mapping[str, str]) -> None:
    """Make `environ` the one every machine gives the suite: the operator's settings, the terminal, the
    locale and the XDG directories out; PINNED in; `carried` (paths found from the real HOME) kept by
    name; HOME a directory of the session's own."""
    for name in [n for n in environ if operator_setting(n) or n in TERMINAL + LOCALE + XDG]:
        del environ[name]
    environ.update(carried)
    environ.update(PINNED)
    environ["HOME"] = home
