"""The plugin wheel a deploy installs into the host's SGLang venv is self-contained: every module of the
tool that its modules import, at the top or inside a function, is in it. (The plugin once imported
`ddtree_ops.treestats` without the wheel carrying it: on a host the plugin would not have imported.)"""

from __future__ import annotations

import ast
import io
import zipfile

from ddtree_ops.wheel import build


def _imports(source: str, module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:           # relative: resolve against the module's package
                base = module.rsplit(".", node.level)[0]
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == "ddtree_ops" or m.startswith("ddtree_ops.")}


def test_every_module_the_plugin_imports_is_in_the_wheel() -> None:
    """From the plugin's own modules (`engine/sglang_*.py`: what SGLang loads, at the top or inside a
    function), every module of the tool they reach is in the wheel. (The engine's command-line side,
    engine/dflash.py and the like, imports the tool's errors: it never runs inside SGLang.)"""
    with zipfile.ZipFile(io.BytesIO(build().data)) as z:
        sources = {n.removesuffix(".py").removesuffix("/__init__").replace("/", "."): z.read(n).decode()
                   for n in z.namelist() if n.endswith(".py")}
    todo = [m for m in sources if m.startswith("ddtree_ops.engine.sglang_")]
    assert "ddtree_ops.engine.sglang_plugin" in todo and "ddtree_ops.engine.sglang_tree" in todo
    seen: set[str] = set()
    missing: dict[str, str] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for imp in _imports(sources[module], module):
            target = imp if imp in sources else imp.rsplit(".", 1)[0]   # `from module import name`
            if target in sources:
                todo.append(target)
            else:
                missing[imp] = module
    assert not missing, f"the plugin imports modules its wheel does not carry: {missing}"
    assert "ddtree_ops.treestats" in seen
