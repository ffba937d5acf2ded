"""A log whose last records are a process's death is never healthy; one that goes on is (issue 20).

Every line list here is made up for the test from the formats that print it (CPython's
traceback and logging, libstdc++, the shell, docker compose, systemd, SGLang's record prefix);
none was captured from a server. The real log that needs the principle is logcorpus 913 (frames,
then logging's 'Message:' line about a child's sigquit, and nothing after).
"""

from __future__ import annotations

import pytest

from ddtree_ops.diagnose.classify import classify
from ddtree_ops.diagnose.ending import death_at_end

REC = "[2026-01-10 09:00:31 TP0] "
SERVING = [REC + "Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=31.84 GB, mem usage=15.36 GB."]
FRAMES = ['  File "/opt/sglang/python/sglang/srt/managers/scheduler.py", line 312, in __init__',
          "    self.tp_worker = TpModelWorker("]

# (what the log ends in, its last lines, the line that is cited)
ENDINGS = [
    ("frames cut before the exception line", SERVING + FRAMES, FRAMES[0]),
    ("an exception no rule pattern reads (Ray's Cls(Inner) form)",
     SERVING + FRAMES + ["ray.exceptions.RayTaskError(KeyError): ray::SGLangEngine.generate() (pid=12)"],
     "ray.exceptions.RayTaskError(KeyError): ray::SGLangEngine.generate() (pid=12)"),
    ("an exception and its message lines", SERVING + ["SomeFault: the engine stopped", "while serving rid=7"],
     "SomeFault: the engine stopped"),
    ("a non-zero exit as docker compose reports it", SERVING + ["sglang-1 exited with code 3"], "sglang-1 exited with code 3"),
    ("a launcher's child exit code", SERVING + ["ERROR: server process exitcode: 1"], "ERROR: server process exitcode: 1"),
    ("the shell's report of a fatal signal", SERVING + ["./serve.sh: line 4:  4242 Bus error (core dumped) python3 -m sglang.launch_server"],
     "./serve.sh: line 4:  4242 Bus error (core dumped) python3 -m sglang.launch_server"),
    ("a child's sigquit", SERVING + FRAMES + ["Message: 'Received sigquit from a child proces. It usually means the child failed.'"],
     "Message: 'Received sigquit from a child proces. It usually means the child failed.'"),
]

# the log went on, or stopped on purpose
NOT_ENDINGS = [
    ("a record after the traceback", SERVING + FRAMES + ["ValueError: bad sampling params",
                                                          REC + "Decode batch, #running-req: 1, #token: 310"]),
    ("many unprefixed lines after it", ["SomeFault: the engine stopped"] + [f"slot {i} | task {i} | done" for i in range(8)]),
    ("an operator's Ctrl-C", SERVING + FRAMES + ["KeyboardInterrupt"]),
    ("sys.exit(0)", SERVING + FRAMES + ["SystemExit: 0"]),
    ("a task cancelled at shutdown", SERVING + FRAMES + ["asyncio.exceptions.CancelledError"]),
    ("an exit code of 0", SERVING + ["sglang-1 exited with code 0"]),
    ("serving lines only", SERVING * 3),
]


@pytest.mark.parametrize("what, lines, cited", ENDINGS, ids=[e[0] for e in ENDINGS])
def test_a_death_in_the_last_records_is_found_and_cited(what: str, lines: list[str], cited: str) -> None:
    hit = death_at_end(lines)
    assert hit is not None and lines[hit[0]] == cited, (what, hit)


@pytest.mark.parametrize("what, lines", NOT_ENDINGS, ids=[e[0] for e in NOT_ENDINGS])
def test_a_log_that_goes_on_or_stops_on_purpose_has_no_death_at_its_end(what: str, lines: list[str]) -> None:
    assert death_at_end(lines) is None, what


def test_the_classifier_calls_an_ending_death_a_crash_and_only_when_nothing_else_is_fatal() -> None:
    lines = SERVING + FRAMES
    rep = classify(lines)
    assert rep.verdict == "failed" and rep.root_cause is not None
    assert (rep.root_cause.label, rep.root_cause.rule_id, rep.root_cause.line) == ("unclassified_crash", "process_died_at_end", 2)
    # a named cause earlier keeps its name: the ending only speaks when nothing else does
    named = classify(["RuntimeError: CUDA error: out of memory"] + lines)
    assert named.root_cause is not None and named.root_cause.label == "cuda_oom"
    assert all(f.rule_id != "process_died_at_end" for f in named.findings)


def test_an_ending_after_a_requested_stop_is_the_stop() -> None:
    stop = ["Jan 10 09:05:00 ct129 systemd[1]: Stopping sglang-ddtree.service - SGLang server..."]
    rep = classify(SERVING + stop + ["sglang-1 exited with code 1"])
    assert rep.root_cause is None, rep.root_cause


def test_the_ending_is_found_when_the_input_comes_in_pieces() -> None:
    from ddtree_ops.diagnose.scanner import Scanner

    sc = Scanner()
    for ln in SERVING * 500 + FRAMES:
        sc.feed([ln])
    rep = sc.report()
    assert rep.root_cause is not None and rep.root_cause.rule_id == "process_died_at_end" and rep.root_cause.line == 501


# a chained traceback as CPython prints it: the earlier part, a blank, the chain line, a blank, the
# later part (an exception class that does not end in "Error" included)
CHAINED = (["Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/pynvml.py", line 979, in _nvmlCheckReturn',
            "    raise NVMLError(ret)",
            "pynvml.NVMLError_NotSupported: Not Supported",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):"]
           + FRAMES + ["RuntimeError: P2P query failed"])


def test_a_chained_traceback_at_the_end_is_one_event_from_its_first_part() -> None:
    hit = death_at_end(SERVING + CHAINED)
    assert hit is not None
    assert hit == (len(SERVING) + len(CHAINED) - 1, len(SERVING))   # cites the last exception, starts at the first header


def test_a_chained_traceback_that_a_harmless_record_attached_is_not_a_death() -> None:
    """SGLang logs a failed NVLink query with logger.exception under a line that says it is
    normal; the traceback it attaches may be chained. The log read so far (a start in progress)
    ends in it, and is not a crash; without the record the same ending is one."""
    record = REC + "NVLink detection failed. This is normal if your machine has no NVLink equipped."
    covered = classify(SERVING + [record] + CHAINED)
    # not a crash; a start in progress has not served yet either: inconclusive
    assert covered.verdict == "inconclusive" and covered.root_cause is None, covered.root_cause
    bare = classify(SERVING + CHAINED)
    assert bare.verdict == "failed" and bare.root_cause is not None
