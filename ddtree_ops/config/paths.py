"""Where profiles and unit templates are found: the checkout, the operator's directories, or the
copy an installed wheel carries."""

from __future__ import annotations

import os
import sys
from pathlib import Path

def shipped_dir(name: str) -> Path:
    """`units` or `profiles` of the checkout, else the copy a wheel installs under
    <prefix>/share/ddtree-ops (pyproject's data-files), so an installed tool works without one."""
    checkout = Path(__file__).resolve().parents[2] / name
    if checkout.is_dir():
        return checkout
    return Path(sys.prefix) / "share" / "ddtree-ops" / name


def profiles_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--profiles, then $DDTREE_OPS_PROFILES, then ./profiles, then /etc/ddtree-ops/profiles, then
    the profiles shipped with the tool (the lab's ct129 and ct200)."""
    for candidate in (explicit, os.environ.get("DDTREE_OPS_PROFILES"), "profiles", "/etc/ddtree-ops/profiles"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return shipped_dir("profiles")
