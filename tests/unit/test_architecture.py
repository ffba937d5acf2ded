"""The house rules of docs/architecture.md, read from the code with `ast` (nothing is imported):

- no import circles, counting top-level, function-local and `if TYPE_CHECKING:` imports alike;
- imports run down the floors (the CLI on top, settings and pure pieces at the bottom);
- no module over 1,000 lines;
- no `from X import _name`, and no `module._name`, across modules;
- a function-local import of the package's own modules says why, in a comment on its line or just
  above its block (start-up time: torch, sglang, paramiko, pydantic);
- the CLI's start (`--help`) loads none of the heavy libraries the commands import when they run;
- the SGLang stand-in, which runs alone on the lab hosts, imports only its own modules;
- the layout document names every module, and names no module that does not exist.

Each rule reports every offender at once, with its file and line.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ddtree_ops"
DOC = REPO / "docs" / "architecture.md"
MAX_LINES = 1000

# The floors of docs/architecture.md: a module imports from its own floor or the floors below.
# (The first matching prefix wins; names are relative to ddtree_ops.)
FLOORS: list[tuple[str, int]] = [
    ("cli", 4), ("__main__", 4),
    ("fleet", 3), ("fleet_plan", 3), ("deploy", 3), ("promote", 3), ("service", 3), ("service_nodes", 3),
    ("service_preflight", 3), ("transaction", 3), ("lab", 3),
    ("preflight", 2), ("hostsglang", 2), ("hostfacts", 2), ("profilegen", 2), ("gate", 2), ("lock", 2), ("releases", 2), ("plan", 2), ("observe", 2), ("render", 2), ("wheel", 2),
    ("smoke", 2), ("diagnose", 2), ("schedule", 2),
    ("transport", 1), ("ssh", 1), ("local", 1), ("host", 1),
    ("profile", 0), ("config", 0), ("remote", 0), ("output", 0), ("status", 0), ("errors", 0), ("memory", 0),
    ("gpu", 0), ("draftcheck", 0), ("launchline", 0), ("engine", 0), ("", 0),
]

# ONE allow-list, for what other branches are changing while this one lands (issue 24's diagnose
# split; issues 21-23's preflight and engine files). The coordinator deletes each entry once its
# branch is merged; `test_the_allow_list_holds_nothing_stale` says when an entry is no longer needed.
PENDING: dict[tuple[str, str], str] = {}


@dataclass
class Module:
    name: str  # relative to ddtree_ops: "cli.app", "" for the package itself
    path: Path
    is_package: bool
    lines: list[str]
    tree: ast.Module
    imports: list[Import] = field(default_factory=list)


@dataclass(frozen=True)
class Import:
    target: str  # the module imported (relative to ddtree_ops)
    name: str | None  # the name taken from it (`from target import name`), None for a module
    line: int
    local: bool  # inside a function


def _modules() -> dict[str, Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        is_package = rel[-1] == "__init__"
        name = ".".join(rel[:-1] if is_package else rel)
        text = path.read_text(encoding="utf-8")
        out[name] = Module(name, path, is_package, text.splitlines(), ast.parse(text, str(path)))
    for m in out.values():
        m.imports = _imports(m, out)
    return out


def _imports(m: Module, mods: dict[str, Module]) -> list[Import]:
    local_nodes = {id(n) for f in ast.walk(m.tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(m.tree):
        local = id(node) in local_nodes
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ddtree_ops" or alias.name.startswith("ddtree_ops."):
                    found.append(Import(_owner(alias.name.removeprefix("ddtree_ops").lstrip("."), mods), None,
                                        node.lineno, local))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = m.name.split(".") if m.is_package else m.name.split(".")[:-1]
                base = [p for p in base[: len(base) - (node.level - 1)] if p]
                source = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "ddtree_ops" or node.module.startswith("ddtree_ops.")):
                source = node.module.removeprefix("ddtree_ops").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}".lstrip(".")
                if sub in mods:  # `from package import module`
                    found.append(Import(sub, None, node.lineno, local))
                else:
                    found.append(Import(_owner(source, mods), alias.name, node.lineno, local))
    return [i for i in found if i.target != m.name]


def _owner(name: str, mods: dict[str, Module]) -> str:
    while name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in mods else ""


@functools.cache
def modules() -> dict[str, Module]:
    """Parsed once, by the first test that asks (not at collection, which every xdist worker runs)."""
    return _modules()


def _pending(rule: str, module: str) -> bool:
    return (rule, module) in PENDING


def _show(name: str) -> str:
    return f"ddtree_ops.{name}" if name else "ddtree_ops"


# ------------------------------------------------------------------ circles


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _edges() -> dict[str, set[str]]:
    return {m.name: {i.target for i in m.imports} for m in modules().values()}


def test_no_import_circles() -> None:
    edges = _edges()
    problems = []
    for comp in _cycles(edges):
        where = [f"  {_show(a)}:{i.line} imports {_show(i.target)}{' (inside a function)' if i.local else ''}"
                 for a in comp for i in modules()[a].imports if i.target in comp]
        problems.append("circle: " + " <-> ".join(map(_show, comp)) + "\n" + "\n".join(where))
    assert not problems, "\n".join(problems)


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# ------------------------------------------------------------------ floors


def _floor(name: str) -> int:
    return next(f for prefix, f in FLOORS if name == prefix or name.startswith(prefix + ".") or prefix == "")


def test_imports_run_down_the_floors() -> None:
    problems = [f"{_show(m.name)}:{i.line} (floor {_floor(m.name)}) imports {_show(i.target)} "
                f"(floor {_floor(i.target)})"
                for m in modules().values() for i in m.imports if _floor(i.target) > _floor(m.name)]
    assert not problems, "imports that run up the floors of docs/architecture.md:\n" + "\n".join(problems)


# ------------------------------------------------------------------ size


def test_no_module_over_1000_lines() -> None:
    problems = [f"{m.path.relative_to(REPO)}: {len(m.lines)} lines" for m in modules().values()
                if len(m.lines) > MAX_LINES and not _pending("size", m.name)]
    assert not problems, f"modules over {MAX_LINES:,} lines (split them along their concerns):\n" + "\n".join(problems)


# ------------------------------------------------------------------ private names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _bound_modules(m: Module) -> dict[str, str]:
    """Local names bound to the package's own modules by the imports of `m`."""
    bound = {}
    for node in ast.walk(m.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                for i in m.imports:
                    if i.line == node.lineno and i.name is None and i.target.rsplit(".", 1)[-1] == alias.name:
                        bound[alias.asname or alias.name] = i.target
    return bound


def test_no_private_names_across_modules() -> None:
    problems = []
    for m in modules().values():
        for i in m.imports:
            if i.name is not None and _private(i.name):
                problems.append(f"{_show(m.name)}:{i.line} imports {i.name} from {_show(i.target)}")
            # a private module is its package's own: importing it from outside the package is crossing
            if i.name is None and any(_private(p) for p in i.target.split(".")):
                package = i.target.rsplit(".", 1)[0]
                if not (m.name == package or m.name.startswith(package + ".")):
                    problems.append(f"{_show(m.name)}:{i.line} imports {_show(i.target)}, private to its package")
        bound = _bound_modules(m)
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and _private(node.attr)):
                problems.append(f"{_show(m.name)}:{node.lineno} uses {node.value.id}.{node.attr} of "
                                f"{_show(bound[node.value.id])}")
    assert not problems, "private names used across modules (make them public in one place):\n" + "\n".join(problems)


# ------------------------------------------------------------------ function-local imports


def _has_reason(m: Module, line: int) -> bool:
    """A comment on the import's line, or on a line of the block of imports (blank lines between
    them allowed) and comments just above it."""
    i = line - 1
    if "#" in m.lines[i]:
        return True
    j = i - 1
    while j >= 0:
        s = m.lines[j].strip()
        if s.startswith("#"):
            return True
        if s and not s.startswith(("from ", "import ")):
            return False
        j -= 1
    return False


def _unexplained_local_imports() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in modules().values():
        lines = sorted({i.line for i in m.imports if i.local and not _has_reason(m, i.line)})
        if lines:
            out[m.name] = [f"{m.path.relative_to(REPO)}:{n}: {m.lines[n - 1].strip()}" for n in lines]
    return out


def test_function_local_imports_of_the_package_say_why() -> None:
    problems = [p for name, found in _unexplained_local_imports().items() if not _pending("local-import", name)
                for p in found]
    assert not problems, ("function-local imports of the package's own modules without a reason (a comment on the "
                          "line or just above: which start-up cost they keep from --help), or move them to the "
                          "top:\n" + "\n".join(problems))


def test_the_cli_starts_without_the_heavy_libraries() -> None:
    """What the function-local imports are for: `ddtree-ops --help` and every command's --help load
    the command modules, and none of them may pull in what only a running command needs."""
    heavy = ("pydantic", "yaml", "paramiko", "rich", "psutil", "prometheus_client", "torch", "sglang")
    code = f"import sys, ddtree_ops.cli.app; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing the CLI loads {out.stdout.strip()}"


def test_the_standin_imports_only_its_own_modules() -> None:
    """It runs on the lab hosts from the files `lab up` copies; only the ddtree plugin, where it is
    installed, may be reached, from inside a function that copes with its absence."""
    problems = [f"{_show(m.name)}:{i.line} imports {_show(i.target)}" for m in modules().values()
                if m.name.startswith("lab.standin") for i in m.imports
                if not i.target.startswith("lab.standin") and not (i.local and i.target.startswith("engine."))]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ the allow-list and the document


def test_the_allow_list_holds_nothing_stale() -> None:
    failing = {("size", m.name) for m in modules().values() if len(m.lines) > MAX_LINES}
    failing |= {("local-import", name) for name in _unexplained_local_imports()}
    stale = [f"{rule} {_show(name)} ({why})" for (rule, name), why in PENDING.items() if (rule, name) not in failing]
    assert not stale, "delete these entries of PENDING, the rule holds for them now:\n" + "\n".join(stale)


def _named_in_doc() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    return {m.removesuffix(".py").rstrip("/") for m in re.findall(r"`([a-z_][a-z0-9_/]*(?:\.py)?/?)`", text)}


def test_the_layout_document_names_every_module() -> None:
    named = _named_in_doc()
    missing = []
    for m in modules().values():
        path = m.name.replace(".", "/")
        if m.is_package and path in named:
            continue
        parents = [path.rsplit("/", k)[0] for k in range(1, path.count("/") + 1)]
        if path and path not in named and not any(p in named for p in parents):
            missing.append(f"{m.path.relative_to(REPO)}")
    assert not missing, "modules docs/architecture.md does not place in a room:\n" + "\n".join(missing)


def test_the_layout_document_names_no_module_that_is_gone() -> None:
    """Every path the document names (`cli/_show.py`, `config/`, `transaction.py`) exists."""
    paths = {m.name.replace(".", "/") for m in modules().values()}
    text = DOC.read_text(encoding="utf-8")
    named = {m.removesuffix(".py").rstrip("/") for m in re.findall(r"`([a-z_][a-z0-9_/]*(?:\.py|/))`", text)}
    named |= set(re.findall(r"`([a-z_][a-z0-9_]*/[a-z0-9_/]*[a-z0-9_])`", text))
    ours = {p.split("/")[0] for p in paths}  # a path that starts in the package is meant as a module
    gone = sorted(n for n in named if n.split("/")[0] in ours and n not in paths)
    assert not gone, "docs/architecture.md names modules that do not exist:\n" + "\n".join(gone)
