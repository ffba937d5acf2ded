"""Each lab test whose waits issue 29 cut still fails without the code it guards.

The cuts (a 2 s stay window instead of 30, shorter faults, polling instead of sleeping, a fixture that
deploys only when the host is off its known-good release) could have left a test passing whatever the
code does: a crash that now comes after a window ends, a lock that is no longer held when the second
deploy looks. So each guard is broken once, in place, and the lab tests that hold it are run against
the broken code; the same tests run first on the code as it is (the control: they must pass).

    python bench/lab_mutations.py --out bench/results/lab_mutations.json   # needs the lab (root, ~10 min)
    python bench/lab_mutations.py --table bench/results/lab_mutations.json

A mutation is one exact text replacement in one file (it must occur once); the file is restored
afterwards, also on Ctrl-C. A test "fails" when pytest reports it failed or errored (a fixture's
check after the test counts: the known-good fixture is itself a guard).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CRASH_IN_WINDOW = "tests/deploy/test_deploy_lab.py::test_crash_after_ready_inside_the_stay_window"
NODE_DIES = ("tests/lab/test_multigpu_lab.py::"
             "test_a_node_that_dies_after_ready_fails_the_service_and_every_node_rolls_back")
ROLLBACK_FAILS = "tests/deploy/test_deploy_lab.py::test_rollback_whose_own_gate_fails_exits_2_and_says_so"
TWO_DEPLOYS = "tests/deploy/test_deploy_lab.py::test_two_deploys_at_once_one_is_refused"
KILLED = "tests/deploy/test_deploy_lab.py::test_control_process_killed_mid_gate_is_resolved_by_the_next_rollback"
CTRL_C = "tests/fleet/test_fleet_lab.py::test_ctrl_c_in_a_wave_lets_its_hosts_finish_and_starts_no_other"
ABANDON = "tests/fleet/test_fleet_lab.py::test_a_third_interrupt_abandons_and_rollback_finds_the_pending_hosts"


@dataclass(frozen=True)
class Mutation:
    name: str
    cut: str  # the shortened wait whose test must still see this guard
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation("stay window skipped: PASS as soon as the smoke request passes",
             "stay_healthy_s 30 -> 2 in the lab; crash-after-ready 4 s in a 10 s window (was 8 s in 25 s), "
             "the pair's node dies 5 s in a 10 s window (was 20 s)",
             "ddtree_ops/gate.py",
             "if self.stay_from is not None and obs.t - self.stay_from >= self.cfg.stay_s:",
             "if self.stay_from is not None:",
             (CRASH_IN_WINDOW, NODE_DIES)),
    Mutation("rollback's no-op trusts the files: an installed target counts as healthy without asking",
             "the ct129 fixture runs `rollback` (a no-op on a healthy known-good host) instead of a full deploy "
             "before and after each test",
             "ddtree_ops/deploy.py",
             "            ok, detail = healthy_now(host, p)\n            if ok:\n                plan.changes",
             "            ok, detail = True, 'mutated'\n            if ok:\n                plan.changes",
             (ROLLBACK_FAILS,)),
    Mutation("the deploy lock is never refused: a held lock counts as taken",
             "polling for the first deploy's lock instead of sleep(3)",
             "ddtree_ops/lock.py",
             "        if res.rc == 0:\n            return\n        if res.rc != 1:",
             "        if res.rc in (0, 1):\n            return\n        if res.rc != 1:",
             (TWO_DEPLOYS,)),
    Mutation("a pending record is not a reason to roll back",
             "polling for the gated start instead of sleep(6); the killed deploy's slow start 4 s (was 16 s); "
             "the fleet's slow starts 8 s (was 16 s)",
             "ddtree_ops/deploy.py",
             "    if state.pending:\n        return True, f\"an unfinished",
             "    if False and state.pending:\n        return True, f\"an unfinished",
             (KILLED, ABANDON)),
    Mutation("a host-less rollback finds no host to repair",
             "polling for the gated start instead of sleep(6); the killed deploy's slow start 4 s (was 16 s)",
             "ddtree_ops/deploy.py",
             "    state = releases.read_state(host, _layout(p))\n    if state.pending:\n        return True, f\"an unfinished",
             "    return False, 'mutated'\n    state = releases.read_state(host, _layout(p))\n    if state.pending:\n"
             "        return True, f\"an unfinished",
             (KILLED,)),
    Mutation("the first Ctrl-C does not stop new waves",
             "the fleet's slow starts 8 s (was 16 s): the interrupt must still land inside the wave",
             "ddtree_ops/fleet.py",
             "        return self.count >= 1\n",
             "        return False\n",
             (CTRL_C,)),
)


def outcomes(junit: Path) -> dict[str, str]:
    """Test id (file::name) -> passed | failed | skipped, from pytest's JUnit XML; a test whose
    setup or teardown errored counts as failed."""
    got: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        test_id = f"{path}::{case.get('name', '').split('[')[0]}"  # a parametrised test: its worst case
        kinds = {child.tag for child in case}
        state = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        if got.get(test_id) != "failed":  # a teardown error is a second testcase entry
            got[test_id] = state
    return got


def run_tests(tests: tuple[str, ...], junit: Path) -> tuple[dict[str, str], float]:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "lab",
                    f"--junitxml={junit}", *tests], cwd=REPO, check=False)
    found = outcomes(junit) if junit.exists() else {}
    return {t: found.get(t, "not run") for t in tests}, time.monotonic() - t0


def mutated(m: Mutation) -> tuple[Path, str]:
    path = REPO / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"{m.path}: the text of mutation {m.name!r} occurs {text.count(m.old)} times, not once")
    path.write_text(text.replace(m.old, m.new))
    return path, text


def measure(scratch: Path) -> dict:
    tests = tuple(dict.fromkeys(t for m in MUTATIONS for t in m.tests))
    control, control_s = run_tests(tests, scratch / "control.xml")
    rows = []
    for i, m in enumerate(MUTATIONS):
        path, original = mutated(m)
        try:
            got, seconds = run_tests(m.tests, scratch / f"m{i}.xml")
        finally:
            path.write_text(original)
        rows.append({"mutation": m.name, "cut": m.cut, "file": m.path, "tests": got, "seconds": round(seconds, 1),
                     "caught": all(v == "failed" for v in got.values())})
    return {"control": {"tests": control, "seconds": round(control_s, 1)}, "mutations": rows}


def table(doc: dict) -> str:
    short = lambda t: t.split("::")[-1]  # noqa: E731 (a label)
    lines = ["| mutation (file) | the cut it guards | test: control / mutated |", "|---|---|---|"]
    for row in doc["mutations"]:
        cells = "<br>".join(f"`{short(t)}`: {doc['control']['tests'].get(t, '?')} / {v}" for t, v in row["tests"].items())
        lines.append(f"| {row['mutation']} (`{row['file']}`) | {row['cut']} | {cells} |")
    caught = sum(r["caught"] for r in doc["mutations"])
    lines.append(f"\n{caught} of {len(doc['mutations'])} mutations fail every test that guards them; the control "
                 f"run passed {sum(v == 'passed' for v in doc['control']['tests'].values())} of "
                 f"{len(doc['control']['tests'])}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the raw results here (JSON)")
    ap.add_argument("--table", type=Path, help="print the table of a file written before, and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    if not args.out:
        ap.error("--out or --table")
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        doc = measure(Path(scratch))
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
