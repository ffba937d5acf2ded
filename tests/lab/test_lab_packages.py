"""The lab's Debian packages: what is missing, the apt-get steps as data, one line of output.

`make demo`, `make test` and `lab up` call `ensure_packages`; here the machine's state and the
executor are fakes, so the tests read the decisions (what to install, whether to refuse) as data.
The real install (apt-get on this machine) is the Makefile's `packages` step.
"""

from __future__ import annotations

from typing import Any

import pytest

from ddtree_ops.lab import _sys


def _machine(missing: set[str]) -> Any:
    return lambda cmd: cmd not in missing


def test_missing_commands_map_to_their_packages_once() -> None:
    found = _machine({"mmdebstrap", "systemd-nspawn", "ssh-keygen", "sshd"})
    assert _sys.missing_packages(found) == ["mmdebstrap", "systemd-container", "openssh-client", "openssh-server"]
    assert _sys.missing_packages(_machine(set())) == []
    assert _sys.missing_packages(_machine({"systemd-analyze"})) == ["systemd"]


def test_install_steps_are_data() -> None:
    assert _sys.install_argv(["mmdebstrap", "systemd-container"]) == [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "mmdebstrap", "systemd-container"],
    ]
    assert _sys.APT_ENV == {"DEBIAN_FRONTEND": "noninteractive"}   # never a debconf prompt


def test_root_installs_what_is_missing_saying_so_in_one_line() -> None:
    missing = {"mmdebstrap", "systemd-nspawn"}
    ran: list[list[str]] = []
    said: list[str] = []

    def execute(argv: list[str], **kw: Any) -> None:
        assert kw["env"]["DEBIAN_FRONTEND"] == "noninteractive"
        ran.append(argv)
        if argv[1] == "install":
            missing.clear()                                          # what apt-get does

    got = _sys.ensure_packages(log=said.append, found=lambda c: c not in missing, is_root=lambda: True,
                               execute=execute)
    assert got == ["mmdebstrap", "systemd-container"]
    assert said == ["installing Debian packages for the lab: mmdebstrap systemd-container"]
    assert ran == _sys.install_argv(["mmdebstrap", "systemd-container"])
    # the second run finds everything and does nothing, silently
    said.clear(), ran.clear()
    assert _sys.ensure_packages(log=said.append, found=lambda c: c not in missing, is_root=lambda: True,
                                execute=execute) == []
    assert said == [] and ran == []


def test_not_root_names_the_command_and_installs_nothing() -> None:
    def execute(argv: list[str], **kw: Any) -> None:
        raise AssertionError(f"ran {argv}")

    with pytest.raises(_sys.LabError) as err:
        _sys.ensure_packages(log=lambda m: None, found=_machine({"mmdebstrap"}), is_root=lambda: False,
                             execute=execute)
    assert str(err.value) == ("the lab needs Debian packages that are not installed (mmdebstrap); "
                              "as root, run: apt-get install -y mmdebstrap")
    assert "\n" not in str(err.value) and err.value.hint is None


def test_a_package_apt_could_not_provide_is_an_error() -> None:
    with pytest.raises(_sys.LabError, match="apt-get finished, but mmdebstrap is still missing"):
        _sys.ensure_packages(log=lambda m: None, found=_machine({"mmdebstrap"}), is_root=lambda: True,
                             execute=lambda argv, **kw: None)


def test_the_makefile_step(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(_sys, "missing_packages", lambda found=None: [])
    assert _sys.main(["packages"]) == 0 and capsys.readouterr().err == ""        # nothing to do: silent
    monkeypatch.setattr(_sys, "missing_packages", lambda found=None: ["mmdebstrap"])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _sys.main(["packages"]) == 1                                          # make stops here
    assert capsys.readouterr().err == ("error: the lab needs Debian packages that are not installed "
                                       "(mmdebstrap); as root, run: apt-get install -y mmdebstrap\n")
    assert _sys.main([]) == 64
