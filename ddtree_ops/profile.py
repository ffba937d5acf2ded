"""A host's profile: the public face of `ddtree_ops.config`.

A profile is `profiles/defaults.yaml`, the host's groups, its own entry and `profiles/<host>.yaml`
layered in that order, then any `--set key.path=value` overrides (`config/inventory.py`). Validation
is pydantic (strict types, unknown keys forbidden; `config/model.py`); its error locations are
mapped back to the YAML line they came from, so a typo reads
`profiles/ct129.yaml:14 memory.mem_fraction_static: 1.4 is not in (0, 1)` (`config/validate.py`).

The rest of the tool imports the models and the loaders from here.
"""

from __future__ import annotations

from pathlib import Path

from ddtree_ops.config.inventory import Inventory
from ddtree_ops.config.model import (
    MODES,
    Card,
    DDTreeMode,
    DDTreeShadowMode,
    DflashMode,
    GateSection,
    GpuCard,
    GpuSection,
    HostSection,
    MemorySection,
    Mode,
    ModeConfig,
    ModesSection,
    MultinodeSection,
    NextnMode,
    ParallelSection,
    Profile,
    ReleasesSection,
    ServiceSection,
    ShadowSettings,
    SmokeSection,
    TreeServingSettings,
)
from ddtree_ops.config.paths import profiles_dir, shipped_dir
from ddtree_ops.config.source import Loc, Sourced, parse_override
from ddtree_ops.config.validate import validate

__all__ = ["MODES", "Card", "DDTreeMode", "DDTreeShadowMode", "TreeServingSettings", "DflashMode", "GateSection", "GpuCard", "GpuSection", "HostSection",
           "Loc", "MemorySection", "Mode", "ModeConfig", "ModesSection", "MultinodeSection", "NextnMode",
           "ParallelSection", "Profile", "ReleasesSection", "ServiceSection", "ShadowSettings", "SmokeSection",
           "Sourced", "available_hosts", "load_profile", "parse_override", "profiles_dir", "shipped_dir", "validate"]


def available_hosts(directory: Path | None = None) -> list[str]:
    """Every host: those with a profile file, then the members of groups."""
    return Inventory.load(directory or profiles_dir()).hosts()


def load_profile(host: str, *, overrides: list[str] | None = None, directory: Path | None = None) -> Profile:
    """defaults.yaml, the host's groups, its own entry and file, then --set."""
    return Inventory.load(directory or profiles_dir()).profile(host, overrides or [])
