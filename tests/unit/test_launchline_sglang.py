"""A running launch line to profile keys, held to SGLang 0.5.23's real parser (installed --no-deps by
`make install`): every flag it accepts maps to a profile key or is passed through in
service.extra_args, and the line `render` writes from the resulting profile parses to what the
original did. A flag the profile cannot reproduce is never dropped in silence: the mapping says so
(a note naming it, or a refusal naming it or the key).

The flags come from the very script `profile init` runs on the host (hostfacts.SPEC), here with this
interpreter; both argvs go through the parser's parse_args in one subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from needs import SGLANG

from ddtree_ops.config.layers import merge
from ddtree_ops.config.rules import RENDERED_FLAGS
from ddtree_ops.config.source import Sourced, read_file
from ddtree_ops.config.validate import validate
from ddtree_ops.errors import ProfileError
from ddtree_ops.hostfacts import SPEC
from ddtree_ops.launchline import KNOWN, MAPPED_DESTS, FlagSpec, Mapped, split_launch, to_profile
from ddtree_ops.profile import load_profile
from ddtree_ops.render import launch_argv

pytestmark = SGLANG
REPO = Path(__file__).resolve().parents[2]

# argparse alone (no ServerArgs post-init, which checks combinations the lone flags do not make)
PARSE = r'''
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = []
for argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        out.append({"ok": True, "ns": json.loads(json.dumps(vars(ns), default=repr))})
    except SystemExit:
        out.append({"ok": False, "error": (err.getvalue().strip().splitlines() or ["?"])[-1]})
    except Exception as exc:  # an action of SGLang's own that checks its value (LoRAPathAction)
        out.append({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)})
print(json.dumps(out))
'''
CANDIDATES = ("7", "0.5", "x", '{"a": 1}', "a=b", "/tmp/x", '{"decode": {}}')
# values the profile accepts for the flags it maps (the generic ones above would break its bounds)
MAPPED_VALUES: dict[str, tuple[str, ...]] = {
    "model_path": ("/models/Other",), "host": ("0.0.0.0",), "port": ("31000",), "served_model_name": ("m",),
    "mem_fraction_static": ("0.7",), "context_length": ("16384",), "max_running_requests": ("8",),
    "page_size": ("16",), "chunked_prefill_size": ("4096",), "cuda_graph_max_bs_decode": ("16",),
    "speculative_algorithm": ("NEXTN", "EAGLE", "DFLASH", "DDTREE", "EAGLE3", "NGRAM"),
    "speculative_draft_model_path": ("/models/Other-Draft",), "speculative_num_draft_tokens": ("6",),
    "speculative_num_steps": ("5",), "speculative_eagle_topk": ("2",),
    "tp_size": ("1",), "dp_size": ("1",), "pp_size": ("1",), "ep_size": ("1",),
    "nnodes": ("2",), "node_rank": ("1",), "dist_init_addr": ("10.0.0.1:20000",), "dist_timeout": ("600",),
    "base_gpu_id": ("1",), "gpu_id_step": ("1",),
}


def parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    res = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def spec() -> list[FlagSpec]:
    res = subprocess.run([sys.executable, "-c", SPEC], capture_output=True, text=True, timeout=300)
    doc = json.loads(res.stdout.rpartition("\x1d")[2])
    assert doc["sglang"] == "0.5.23"
    return [FlagSpec(tuple(f["options"]), f["dest"], f["nargs"], tuple(f["choices"] or ())) for f in doc["flags"]]


@pytest.fixture(scope="module")
def base_argv() -> list[str]:
    """A real launch line: what ct129's NEXTN unit runs (the lab seeds exactly this one)."""
    return list(launch_argv(load_profile("ct129", directory=REPO / "profiles"), "nextn"))


def profile_of(mapped: Mapped, arch: str = "sm_90") -> Any:
    """The profile the mapping describes, over the shipped defaults (as `profile init` layers it)."""
    data: dict[str, Any] = {"name": "h", "host": {"ssh_host": "h"},
                            "gpu": {"model": "g", "memory_mib": 81559, "arch": arch},
                            "service": {"python": mapped.python, "env": mapped.env, "extra_args": mapped.extra_args},
                            "mode": mapped.mode or "nextn",
                            "modes": {m: {"draft_model_path": "/models/D"} for m in ("dflash", "ddtree-shadow")}}
    for loc, value in mapped.values.items():
        cur = data
        for part in loc[:-1]:
            cur = cur.setdefault(part, {})
        cur[loc[-1]] = value
    defaults = read_file(REPO / "profiles" / "defaults.yaml", "defaults.yaml")
    return validate(merge(defaults, Sourced(data, {})), fallback="init")


def test_the_mapped_flags_are_sglangs_own(spec: list[FlagSpec]) -> None:
    """Every spelling this module maps is one SGLang 0.5.23 gives that dest (or one it does not
    know at all), every spelling SGLang has for a mapped dest is mapped, and every flag render
    writes from a key (rules.RENDERED_FLAGS) is one of them."""
    by_option = {o: s for s in spec for o in s.options}
    for s in KNOWN:
        for o in s.options:
            if o in by_option:
                assert by_option[o].dest == s.dest, (o, by_option[o].dest, s.dest)
                assert by_option[o].nargs == s.nargs, (o, by_option[o].nargs, s.nargs)
    known = {o for s in KNOWN for o in s.options}
    for s in spec:
        if s.dest in MAPPED_DESTS:
            assert set(s.options) <= known, f"{s.options} of {s.dest} are not all mapped"
    unmapped = [f for f in RENDERED_FLAGS if f not in known and f in by_option]
    assert not unmapped, f"render writes {unmapped} from keys, but the launch line mapping does not read them"
    assert {"--enable-metrics"} <= known


def _cases(spec: list[FlagSpec]) -> list[tuple[str, FlagSpec, list[str]]]:
    """(label, flag, words) for every spelling of every flag: each choice of a flag with choices,
    the profile's values for the flags it maps, else the first value the parser takes."""
    out = []
    for s in spec:
        for option in s.options:
            if s.nargs == 0:
                out.append((option, s, [option]))
                continue
            values = MAPPED_VALUES.get(s.dest) or s.choices or CANDIDATES
            count = s.nargs if isinstance(s.nargs, int) else 2 if s.nargs in ("+", "*") else 1
            for v in values:
                out.append((f"{option} {v}", s, [option, *([v] * count)]))
    return out


@pytest.mark.slow  # ~25 s: every flag of SGLang's parser
def test_every_flag_maps_to_a_key_or_passes_through(spec: list[FlagSpec], base_argv: list[str]) -> None:
    cases = _cases(spec)
    first = parse([base_argv[3:] + words for _, _, words in cases])
    # a flag without choices tried with several generic values: the first the parser takes
    accepted: dict[str, tuple[str, FlagSpec, list[str], dict[str, Any]]] = {}
    for (label, s, words), r in zip(cases, first):
        key = label if s.dest in MAPPED_VALUES or s.choices or s.nargs == 0 else words[0]
        if r["ok"] and key not in accepted:
            accepted[key] = (label, s, words, r["ns"])
    assert len({w[0] for _, _, w, _ in accepted.values()}) == sum(len(s.options) for s in spec), \
        "some spelling took no value at all: " + str(sorted({o for s in spec for o in s.options}
                                                             - {w[0] for _, _, w, _ in accepted.values()}))
    options_of = {x.dest: x.options for x in spec}
    rendered, meta = [], []
    outcome: dict[str, list[str]] = {"same": [], "noted": [], "refused": []}
    for label, s, words, ns in accepted.values():
        launch = split_launch(base_argv + words, spec)
        mapped = to_profile(launch)
        if mapped.problems:
            assert any(o in p for p in mapped.problems for o in s.options), (label, mapped.problems)
            outcome["refused"].append(label)
            continue
        if s.dest not in MAPPED_DESTS:
            assert mapped.extra_args[-len(words):] == words, (label, mapped.extra_args)
        try:
            p = profile_of(mapped)
        except ProfileError as exc:  # a value the profile's rules refuse on this card, naming its key
            assert s.dest in MAPPED_DESTS, (label, exc.problems)
            outcome["refused"].append(label)
            continue
        rendered.append(list(launch_argv(p, p.desired_mode))[3:])
        meta.append((label, s, mapped, ns))
    for (label, s, mapped, ns), r in zip(meta, parse(rendered)):
        assert r["ok"], (label, r["error"])
        changed = {k for k in set(ns) | set(r["ns"]) if ns.get(k) != r["ns"].get(k)}
        if not changed:
            outcome["same"].append(label)
            continue
        # a mapped flag the profile writes differently: the mapping names what changed and why
        noted = " ".join(f"{n.what} {n.reason}" for n in mapped.notes)
        assert s.dest in MAPPED_DESTS, f"{label}: passed through, but the rendered line parses differently: {changed}"
        assert any(o in noted for o in s.options), f"{label}: {sorted(changed)} change without a note ({mapped.notes})"
        for dest in changed - {s.dest}:
            assert any(o in noted for o in options_of.get(dest, ())), f"{label}: {dest} changes without a note"
        outcome["noted"].append(label)
    unmapped = [label for label, s, _, _ in accepted.values() if s.dest not in MAPPED_DESTS]
    assert set(unmapped) <= set(outcome["same"])
    assert len(unmapped) > 400  # SGLang 0.5.23 has ~500 flags: all of them, not a sample
    # the flags the profile maps reproduce, but for the algorithms and multi-node flags it does not model
    assert set(outcome["refused"]) <= {label for label, s, _, _ in accepted.values()
                                       if s.dest in ("nnodes", "node_rank", "dist_init_addr", "dist_timeout",
                                                     "attention_backend", "speculative_draft_attention_backend",
                                                     "kv_cache_dtype", "dtype", "quantization")}, outcome["refused"]
    assert not [x for x in outcome["noted"] if "--speculative-algorithm NEXTN" in x or "--port" in x]


def test_an_abbreviated_flag_maps_to_its_key_as_sglang_reads_it(spec: list[FlagSpec], base_argv: list[str]) -> None:
    mapped = to_profile(split_launch([*base_argv, "--mem-fraction", "0.7", "--context-len=8192"], spec))
    assert mapped.values[("memory", "mem_fraction_static")] == 0.7
    assert mapped.values[("memory", "context_length")] == 8192
    assert mapped.extra_args == []
    (orig, rend) = parse([base_argv[3:] + ["--mem-fraction", "0.7", "--context-len=8192"],
                          launch_argv(profile_of(mapped), "nextn")[3:]])
    assert orig["ns"] == rend["ns"]


def test_value_counts_follow_the_parser(spec: list[FlagSpec], base_argv: list[str]) -> None:
    """A list flag takes every value up to the next flag, a switch none, a negative number is a value."""
    line = [*base_argv, "--lora-paths", "a", "b", "--enable-metrics", "--random-seed", "-1", "--port", "1234"]
    launch = split_launch(line, spec)
    mapped = to_profile(launch)
    assert mapped.extra_args == ["--lora-paths", "a", "b", "--random-seed", "-1"]
    assert mapped.values[("service", "port")] == 1234
    assert not launch.positional
    # a word after a switch is no value of it: SGLang's parser refuses the line, so does the mapping
    stray = split_launch([*base_argv, "--trust-remote-code", "stray"], spec)
    assert stray.positional == ("stray",) and to_profile(stray).problems
