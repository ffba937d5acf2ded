"""Preflight's reading of the host's SGLang check: the launch flags, the plugin, the release table."""

from __future__ import annotations

from typing import Any

import pytest

from ddtree_ops.preflight import FAIL, OK, Preflight, check_sglang
from ddtree_ops.profile import load_profile

PLUGIN = "0.1.0"


def report(sglang: str, *, installed: str | None = PLUGIN, family: bool = True) -> dict[str, Any]:
    return {"sglang": sglang, "ddtree-ops": installed, "parse": "ok",
            "algorithm": {"resolved": "DDTREE", "dflash": family, "dflash_family": family}}


def run(doc: dict[str, Any], mode: str = "ddtree-shadow") -> Preflight:
    pf = Preflight()
    check_sglang(pf, load_profile("ct200"), mode, (doc, ""), PLUGIN)
    return pf


def by_name(pf: Preflight, name: str) -> Any:
    return next(c for c in pf.checks if c.name == name)


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_supported_release_with_the_plugin_passes(version: str) -> None:
    pf = run(report(version))
    assert pf.ok and by_name(pf, "plugin").status == OK


def test_unsupported_release_is_refused_naming_the_releases_that_work() -> None:
    pf = run(report("0.5.24"))
    check = by_name(pf, "plugin")
    assert check.status == FAIL and not pf.ok
    assert "sglang 0.5.24 is not supported (supported: 0.5.17, 0.5.23)" in check.detail


def test_unsupported_release_does_not_matter_without_ddtree() -> None:
    pf = run(report("0.5.24"), mode="dflash")
    assert pf.ok and not [c for c in pf.checks if c.name == "plugin"]


def test_plugin_that_is_not_dflash_family_is_refused() -> None:
    check = by_name(run(report("0.5.17", family=False)), "plugin")
    assert check.status == FAIL and "not DFlash-family" in check.detail
