"""Profile fuzz: mutated profile files and `--set` values go through the loader the CLI uses.

Every case ends in a Profile or a refusal (ProfileError, exit 64) whose every problem names the
file and line (or the --set) it blames; no other exception, so no traceback. YAML tags that would
build Python objects are refused, never constructed: the payloads below would write a sentinel
file if they ever ran. Each case has a bound on its time, because a profile is operator input and
alias bombs or runaway nesting must be refused, not expanded.

The bulk (10,000 cases) is a seeded mutator over the shipped profiles: ~2 ms a case, and a failure
names the case number that reproduces it. Hypothesis drives the CLI-level cases, where it can shrink
a failure to the smallest edit that causes it.
"""

from __future__ import annotations

import io
import random
import re
import shutil
import time
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree_ops.errors import ProfileError
from ddtree_ops.profile import Profile, load_profile

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("ct129", "ct200")
BASE = {name: (REPO / "profiles" / f"{name}.yaml").read_text() for name in ("defaults", *HOSTS)}
# generous: a case takes ~2 ms of CPU; this only catches expansion and hangs, it is not a speed target.
# CPU time of this process, not wall time: on a loaded machine a case can wait seconds for a CPU
# (`make test` on 2 CPUs: 2.75 s of wall for one case, CI of stop 36)
BOUND_S = 2.0

SENTINEL = Path("/tmp/ddtree-ops-profile-fuzz-ran")   # written only if a YAML payload executes
UNSAFE = (
    f'!!python/object/apply:builtins.exec ["open({str(SENTINEL)!r}, \'w\').write(\'exec\')"]',
    f'!!python/object/apply:os.system ["touch {SENTINEL}"]',
    f'!!python/object/new:subprocess.Popen [["touch", "{SENTINEL}"]]',
    "!!python/object:os.system 49140",
    "!!python/name:os.system",
    "!!python/module:os",
    f'!!python/object/apply:pathlib.Path.touch [!!python/object/apply:pathlib.Path ["{SENTINEL}"]]',
)
VALUES = (
    "", "~", "null", "true", "no", "on", "0", "-1", "65536", "1e400", "-1e400", ".nan", "-.inf", "0x1F", "0o17",
    "0b101", "1_000", "12:30:45", "2024-01-01", "2024-01-01T10:00:00Z", "'quoted'", '"esc\\x00ape"', '"\\ud800"',
    "[1, 2", "{a: 1}", "[]", "{}", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "&a x", "*a",
    "*undefined", "&r [*r]", "&m {k: *m}", "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [{a: 1}]", "!!pairs [[a, 1]]",
    "!!int abc", "!!float x", "!!bool maybe", "!!timestamp nope", "!!null x", "!!str 1", "!!map [1]", "!!seq {a: 1}",
    "!custom x", "!<tag:example.com,2000:x> y", "|\n  block\n  text", ">-\n  folded", "9" * 5000, "a" * 20000,
    "[/]", "[bold]x[/bold]", "[/x]", "%TAG ! tag:x,2000:", "? complex\n: key", "- item", "@at", "`tick", "\x00",
    "\x07bell", "\x1b[31mred", "\u202eevil", "\ufeffbom", "😀", "\udcff", "\t", "a: b: c", "- - -", "key: [a, {b: c}]",
    "/models/Qwen 3 (8B)/%v", "$HOME", "%n", "sm_86", "sm_٨٦", "flashinfer", "fa3", "env:HF_TOKEN", "file:relative",
    *UNSAFE,
)
# one alias bomb: nine levels of nine references expand to 9**9 values if walked naively
BOMB = "lol: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
JUNK_CHARS = list(":{}[]&*!|>'\"#%@,-? \t\n\r\\\x01\x00é😀") + ["\udcff"]


def _keys(text: str) -> list[str]:
    return re.findall(r"(?m)^\s*([A-Za-z_][\w-]*):", text)


KEYS = sorted({k for t in BASE.values() for k in _keys(t)})
def _paths(node: Any, at: tuple[str, ...] = ()) -> list[str]:
    if not isinstance(node, dict):
        return [".".join(at)]
    return [p for k, v in node.items() for p in _paths(v, at + (k,))] + ([".".join(at)] if at else [])


def _has(doc: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return False
        doc = doc[part]
    return True


def _value_at(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc[part]
    return doc


# every dotted key path of the resolved shipped profiles, and ct200's value there
PATHS = sorted({p for host in HOSTS for p in _paths(load_profile(host, directory=REPO / "profiles").resolved())})
_CT200 = load_profile("ct200", directory=REPO / "profiles").resolved()
RESOLVED = {p: _value_at(_CT200, p) for p in PATHS if p.split(".")[0] in _CT200 and _has(_CT200, p)}


def _payload(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.55:
        return rng.choice(VALUES)
    if roll < 0.65:
        return rng.choice(UNSAFE)
    if roll < 0.85:
        return "".join(rng.choice(JUNK_CHARS) for _ in range(rng.randint(1, 12)))
    if roll < 0.93:
        return str(rng.randint(-2**70, 2**70))
    return repr(rng.uniform(-1e6, 1e6))


def mutate(rng: random.Random) -> tuple[str, str, str]:
    """(file mutated, its text, host to load) from 1-4 line or character edits of a shipped profile."""
    host = rng.choice(HOSTS)
    target = rng.choice(("defaults", host, host))
    lines = BASE[target].split("\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        line = lines[i]
        kind = rng.choice(("value", "value", "value", "value", "key", "delete", "duplicate", "swap", "indent",
                           "insert", "chars", "truncate"))
        if kind == "value" and ":" in line:
            lines[i] = line.split(":", 1)[0] + ": " + _payload(rng)
        elif kind == "key" and ":" in line:
            indent = line[: len(line) - len(line.lstrip())]
            lines[i] = indent + (rng.choice(KEYS) if rng.random() < 0.5 else _payload(rng)) + ":" + line.split(":", 1)[1]
        elif kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, line)
        elif kind == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], line
        elif kind == "indent":
            lines[i] = rng.choice(("", " ", "  ", "    ", "\t", "      ")) + line.lstrip()
        elif kind == "insert":
            lines.insert(i, rng.choice(("", "  ", "    ")) + rng.choice(KEYS) + ": " + _payload(rng))
        elif kind == "chars":
            at = rng.randint(0, len(line))
            lines[i] = line[:at] + _payload(rng) + line[at:]
        elif kind == "truncate":
            lines = lines[: i + 1]
            lines[i] = line[: rng.randint(0, len(line))]
        lines = lines or [""]
    return target, "\n".join(lines), host


def set_spec(rng: random.Random) -> str:
    path = rng.choice(PATHS)
    if rng.random() < 0.25 and path in RESOLVED:  # a value the key already holds, written as an operator would: usually valid
        return f"{path}={yaml.safe_dump(RESOLVED[path], default_flow_style=True).removesuffix(chr(10) + '...' + chr(10)).strip()}"
    key = rng.choice((path, path, path, path + ".x", path.replace("_", "-", 1), path.rsplit(".", 1)[0],
                      "".join(rng.choice("abcz._-09") for _ in range(rng.randint(0, 12))), _payload(rng)))
    return key + rng.choice(("=", "=", "=", "=", "", "==", " = ")) + _payload(rng)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz") / "profiles"
    shutil.copytree(REPO / "profiles", d)
    SENTINEL.unlink(missing_ok=True)
    return d


def _write(d: Path, name: str, text: str) -> None:
    # lone surrogates stand for bytes that are not UTF-8 (as in argv): they reach the file as such bytes
    (d / f"{name}.yaml").write_bytes(text.encode("utf-8", "surrogateescape" if "\udcff" in text else "surrogatepass"))


def _restore(d: Path) -> None:
    for name, text in BASE.items():
        _write(d, name, text)


LOCATED = re.compile(r"(?:\S*(?:defaults|ct129|ct200)\.yaml(?::(\d+))?|--set .*?) \S", re.DOTALL)


def _load(d: Path, host: str, overrides: list[str]) -> tuple[Profile | None, list[str]]:
    t0 = time.process_time()
    try:
        p: Profile | None = load_profile(host, overrides=overrides, directory=d)
        problems: list[str] = []
    except ProfileError as exc:
        p, problems = None, exc.problems
    took = time.process_time() - t0
    assert not SENTINEL.exists(), "a YAML tag ran code"
    assert took < BOUND_S, f"{took:.2f} CPU-s for one profile"
    return p, problems


def _unlocated(problems: list[str], texts: dict[str, str]) -> list[str]:
    """Problems that do not name a file with a line inside it, or the --set they blame."""
    bad = [] if problems else ["(a refusal without a reason)"]
    for problem in problems:
        m = LOCATED.match(problem)
        if not m:
            bad.append(problem)
        elif m.group(1):
            name = next(n for n in texts if f"{n}.yaml" in problem.split(" ", 1)[0])
            if not 1 <= int(m.group(1)) <= texts[name].count("\n") + 1:
                bad.append(problem)
    return bad


def _fuzz(cases: int, seed: int, one: Any) -> dict[str, int]:
    """Run `one(rng)` for each case with its own seeded generator, so a failure names the case that
    reproduces it: random.Random(seed * 1_000_003 + i)."""
    tally = {"loaded": 0, "refused": 0}
    failures: list[str] = []
    for i in range(cases):
        try:
            tally[one(random.Random(seed * 1_000_003 + i))] += 1
        except AssertionError as exc:  # collect a few, then report them together
            failures.append(f"case {i}: {exc}")
        except Exception as exc:  # anything else is what an operator would see as a traceback
            failures.append(f"case {i}: {type(exc).__name__}: {exc}")
        if len(failures) >= 5:
            break
    assert not failures, "\n".join(failures)
    return tally


@pytest.mark.slow  # ~30 s
def test_mutated_profile_files_load_or_are_refused_with_file_and_line(fuzz_dir: Path) -> None:
    def one(rng: random.Random) -> str:
        target, text, host = mutate(rng)
        _write(fuzz_dir, target, text)
        try:
            p, problems = _load(fuzz_dir, host, [])
        finally:
            _write(fuzz_dir, target, BASE[target])
        if p is not None:
            assert p.name == host and p.mode("nextn").algorithm == "NEXTN"
            return "loaded"
        bad = _unlocated(problems, {**BASE, target: text})
        assert not bad, f"unlocated {bad!r} for {target}.yaml:\n{text}"
        return "refused"

    tally = _fuzz(6000, 1, one)
    # both outcomes are exercised: some edits keep a valid profile (comments, harmless values)
    assert tally["loaded"] > 300 and tally["refused"] > 3000, tally


@pytest.mark.slow  # ~10 s
def test_set_values_apply_or_are_refused_naming_the_set(fuzz_dir: Path) -> None:
    def one(rng: random.Random) -> str:
        host, specs = rng.choice(HOSTS), [set_spec(rng) for _ in range(rng.randint(1, 3))]
        p, problems = _load(fuzz_dir, host, specs)
        if p is not None:
            return "loaded"
        bad = _unlocated(problems, BASE)
        assert not bad, f"unlocated {bad!r} for --set {specs!r}"
        return "refused"

    tally = _fuzz(4000, 2, one)
    assert tally["loaded"] > 200 and tally["refused"] > 2000, tally


SPECS = st.builds(lambda k, sep, v: f"{k}{sep}{v}", st.sampled_from(PATHS), st.sampled_from(("=", "")),
                  st.one_of(st.sampled_from(VALUES), st.text(max_size=20)))


@pytest.mark.slow  # ~10 s
@settings(derandomize=True, deadline=None, database=None, max_examples=300,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), specs=st.lists(SPECS, max_size=2))
def test_cli_refuses_with_exit_64_and_never_a_traceback(fuzz_dir: Path, seed: int, specs: list[str]) -> None:
    from ddtree_ops.cli.app import main

    target, text, host = mutate(random.Random(seed))
    _write(fuzz_dir, target, text)
    err = io.StringIO()
    try:
        with redirect_stderr(err), pytest.raises(SystemExit) as exc:
            main(["profile", "show", host, "--profiles", str(fuzz_dir), *[f"--set={s}" for s in specs]])
    finally:
        _write(fuzz_dir, target, BASE[target])
    assert not SENTINEL.exists()
    assert exc.value.code in (0, 64), err.getvalue()
    assert "Traceback" not in err.getvalue()
    if exc.value.code == 64:
        assert err.getvalue().startswith("error:"), err.getvalue()


# ---------------------------------------------------------------- the cases the fuzz first found


def test_python_tag_is_a_refusal_with_file_line_and_key(fuzz_dir: Path) -> None:
    text = BASE["ct129"].replace("memory_mib: 49140", "memory_mib: !!python/object:os.system 49140")
    _write(fuzz_dir, "ct129", text)
    try:
        _, problems = _load(fuzz_dir, "ct129", [])
        line = text.split("\n").index("  memory_mib: !!python/object:os.system 49140") + 1
        assert problems == [f"{fuzz_dir / 'ct129.yaml'}:{line} gpu.memory_mib: the YAML tag "
                            "!!python/object:os.system is not allowed (a profile holds plain values)"]
    finally:
        _restore(fuzz_dir)


def test_the_cli_exits_64_on_a_python_tag(fuzz_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddtree_ops.cli.app import main

    _write(fuzz_dir, "ct129", BASE["ct129"].replace("memory_mib: 49140", "memory_mib: !!python/object:os.system 49140"))
    try:
        with pytest.raises(SystemExit) as exc:
            main(["render", "ct129", "--profiles", str(fuzz_dir)])
    finally:
        _restore(fuzz_dir)
    err = capsys.readouterr().err
    assert exc.value.code == 64 and "Traceback" not in err
    assert re.search(r"ct129\.yaml:9 gpu\.memory_mib: the YAML tag !!python/object:os\.system is not allowed", err)


@pytest.mark.parametrize("payload", UNSAFE)
def test_unsafe_tags_never_run_in_files_or_set(fuzz_dir: Path, payload: str) -> None:
    _write(fuzz_dir, "ct200", BASE["ct200"].replace("  ssh_host: ct200", f"  ssh_host: {payload}"))
    try:
        _, problems = _load(fuzz_dir, "ct200", [])
        assert any("host.ssh_host: the YAML tag !!python/" in m for m in problems), problems
    finally:
        _restore(fuzz_dir)
    _, problems = _load(fuzz_dir, "ct200", [f"service.served_model_name={payload}"])
    assert problems and all(m.startswith("--set service.served_model_name=") for m in problems), problems


@pytest.mark.parametrize("text,needle", [
    (BOMB, "expands to more than 10000 values"),
    ("loop: &r [*r]\n", "a YAML alias refers to a mapping or list that contains it"),
    ("deep: " + "[" * 40 + "]" * 40 + "\n", "nested deeper than"),
    ("served: 2024-01-01\n", "'2024-01-01' reads as a YAML date; quote it"),
    ("n: !!int abc\n", "cannot read 'abc' as !!int"),
    ("n: " + "9" * 5000 + "\n", "cannot read '9999"),
    ("s: !!set {a, b}\n", "the YAML tag !!set is not allowed"),
])
def test_hostile_yaml_is_refused_at_once(fuzz_dir: Path, text: str, needle: str) -> None:
    _write(fuzz_dir, "defaults", text + BASE["defaults"])
    try:
        _, problems = _load(fuzz_dir, "ct129", [])
    finally:
        _restore(fuzz_dir)
    assert any(needle in m and "defaults.yaml:" in m for m in problems), problems


def test_bytes_that_are_not_utf8_name_the_line(fuzz_dir: Path) -> None:
    (fuzz_dir / "ct129.yaml").write_bytes(BASE["ct129"].encode().replace(b"NVIDIA RTX", b"NVIDIA \xff RTX"))
    try:
        _, problems = _load(fuzz_dir, "ct129", [])
    finally:
        _restore(fuzz_dir)
    assert problems == [f"{fuzz_dir / 'ct129.yaml'}:8 not valid UTF-8 (byte 0xff)"]


def test_markup_in_a_value_prints_as_typed(fuzz_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ddtree_ops.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["render", "ct129", "--profiles", str(fuzz_dir), "--set", 'gpu.memory_mib="[/x]"'])
    err = capsys.readouterr().err
    assert exc.value.code == 64 and "got str '[/x]'" in err and "Traceback" not in err
