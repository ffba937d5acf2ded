"""The stand-in's fault file (/var/lib/ddtree-lab/faults, written by `lab.fault`): which entries a start
uses up, and the length a timed fault is given (`slow-start=6`), without booting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_ops.lab.standin import faults


@pytest.fixture
def fault_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "faults"
    monkeypatch.setattr(faults, "FAULTS_FILE", path)
    monkeypatch.setattr(faults, "_SECONDS", {})  # one start's lengths: a fresh process each start
    return path


def test_a_timed_fault_takes_the_length_its_entry_gives(fault_file: Path) -> None:
    fault_file.write_text("slow-start=6\ncrash-after-ready=2.5@every-start\nhang\n")
    assert faults.read_faults() == {"slow-start", "crash-after-ready", "hang"}
    assert (faults.seconds("slow-start"), faults.seconds("crash-after-ready")) == (6.0, 2.5)
    # the plain entries are used up by this start; the every-start one stays, length and all
    assert fault_file.read_text() == "crash-after-ready=2.5@every-start\n"


def test_without_a_length_the_stand_ins_own(fault_file: Path) -> None:
    fault_file.write_text("slow-start\ncrash-after-ready=soon\n")  # a hand-edited typo keeps the default
    assert faults.read_faults() == {"slow-start", "crash-after-ready"}
    assert (faults.seconds("slow-start"), faults.seconds("crash-after-ready")) == (16.0, 8.0)
