"""A running SGLang launch line to profile keys, and the difference between two launch lines. Pure.

`profile init` reads the argv of a unit that already serves and maps it onto the profile: every
flag `render.launch_argv` writes from a key (`config.rules.RENDERED_FLAGS`) becomes that key, and
every other flag is kept, as written and in its order, in `service.extra_args`, which `render`
emits as given. Nothing is dropped without a reason the operator sees.

How many values a flag takes, its aliases and its abbreviations are SGLang's own argparse rules:
the host's parser is asked for its flags (`FlagSpec`, one list from `hostfacts`), and without it
the flags this module maps are known here and any other flag takes the words up to the next one.
The unit tests hold the mapping to SGLang 0.5.23's real parser: every flag it accepts maps to a
key or is passed through, and the rendered line parses to what the original did.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, get_args

from ddtree_ops.config.model import AttentionBackend, MemorySection
from ddtree_ops.config.rules import RENDERED_FLAGS

Loc = tuple[str, ...]

# what argparse takes for a value: an option-looking word is not one, unless it is a negative number
# or holds a space (argparse's _parse_optional and _negative_number_matcher)
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class FlagSpec:
    """One option of SGLang's parser: its spellings, where it lands, how many values it takes
    (argparse's nargs: None one, 0 none, '?', '*', '+', or a count)."""

    options: tuple[str, ...]
    dest: str
    nargs: int | str | None = None
    choices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The spelling a message uses: the first long option."""
        return next((o for o in self.options if o.startswith("--")), self.options[0])


# The flags render writes from profile keys, by SGLang's dest, with every spelling SGLang 0.5.23
# accepts for them (the unit tests check each against its parser). Used when the host's parser
# could not be asked; its answer wins otherwise.
KNOWN: tuple[FlagSpec, ...] = (
    FlagSpec(("--model-path", "--model"), "model_path"),
    FlagSpec(("--host",), "host"),
    FlagSpec(("--port",), "port"),
    FlagSpec(("--served-model-name",), "served_model_name"),
    FlagSpec(("--mem-fraction-static",), "mem_fraction_static"),
    FlagSpec(("--context-length",), "context_length"),
    FlagSpec(("--max-running-requests",), "max_running_requests"),
    FlagSpec(("--attention-backend",), "attention_backend"),
    FlagSpec(("--enable-metrics",), "enable_metrics", 0),
    FlagSpec(("--dtype",), "dtype"),
    FlagSpec(("--kv-cache-dtype",), "kv_cache_dtype"),
    FlagSpec(("--page-size",), "page_size"),
    FlagSpec(("--quantization",), "quantization"),
    FlagSpec(("--chunked-prefill-size",), "chunked_prefill_size"),
    FlagSpec(("--disable-cuda-graph",), "disable_cuda_graph", 0),
    FlagSpec(("--cuda-graph-max-bs-decode",), "cuda_graph_max_bs_decode"),
    FlagSpec(("--speculative-algorithm",), "speculative_algorithm"),
    FlagSpec(("--speculative-draft-model-path", "--speculative-draft-model"), "speculative_draft_model_path"),
    FlagSpec(("--speculative-num-draft-tokens",), "speculative_num_draft_tokens"),
    FlagSpec(("--speculative-num-steps",), "speculative_num_steps"),
    FlagSpec(("--speculative-eagle-topk",), "speculative_eagle_topk"),
    FlagSpec(("--speculative-draft-attention-backend",), "speculative_draft_attention_backend"),
    FlagSpec(("--tp-size", "--tensor-parallel-size", "--tp"), "tp_size"),
    FlagSpec(("--dp-size", "--data-parallel-size", "--dp"), "dp_size"),
    FlagSpec(("--pp-size", "--pipeline-parallel-size"), "pp_size"),
    FlagSpec(("--ep-size", "--expert-parallel-size", "--ep"), "ep_size"),
    FlagSpec(("--nnodes",), "nnodes"),
    FlagSpec(("--node-rank",), "node_rank"),
    FlagSpec(("--dist-init-addr", "--nccl-init-addr"), "dist_init_addr"),
    FlagSpec(("--dist-timeout",), "dist_timeout"),
    FlagSpec(("--base-gpu-id",), "base_gpu_id"),
    FlagSpec(("--gpu-id-step",), "gpu_id_step"),
)
MAPPED_DESTS = frozenset(s.dest for s in KNOWN)

# dest -> (profile key, type) for the flags that are one key each
_SCALARS: dict[str, tuple[Loc, type]] = {
    "model_path": (("service", "model_path"), str),
    "host": (("service", "listen_host"), str),
    "port": (("service", "port"), int),
    "served_model_name": (("service", "served_model_name"), str),
    "mem_fraction_static": (("memory", "mem_fraction_static"), float),
    "context_length": (("memory", "context_length"), int),
    "max_running_requests": (("memory", "max_running_requests"), int),
    "attention_backend": (("memory", "attention_backend"), str),
    "dtype": (("memory", "dtype"), str),
    "kv_cache_dtype": (("memory", "kv_cache_dtype"), str),
    "page_size": (("memory", "page_size"), int),
    "quantization": (("memory", "quantization"), str),
    "chunked_prefill_size": (("memory", "chunked_prefill_size"), int),
    "cuda_graph_max_bs_decode": (("memory", "cuda_graph_max_bs"), int),
    "tp_size": (("parallel", "tp_size"), int),
    "dp_size": (("parallel", "dp_size"), int),
    "pp_size": (("parallel", "pp_size"), int),
    "ep_size": (("parallel", "ep_size"), int),
}
_SPECULATIVE = ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_draft_tokens",
                "speculative_num_steps", "speculative_eagle_topk", "speculative_draft_attention_backend")
_MULTINODE = ("nnodes", "node_rank", "dist_init_addr", "dist_timeout")
# SGLang's own spellings of one value, as the profile writes them (the same to SGLang)
_SAME = {("dtype", "half"): "float16", ("kv_cache_dtype", "bfloat16"): "bf16"}
# speculative algorithm -> the profile's mode (NEXTN is SGLang's alias of EAGLE; DDTREE is the plugin's)
ALGORITHM_MODE = {"NEXTN": "nextn", "EAGLE": "nextn", "DFLASH": "dflash", "DDTREE": "ddtree-shadow"}
# the ddtree plugin's settings, which render writes from modes.ddtree-shadow (render.mode_env)
_DDTREE_ENV = {"DDTREE_BUDGET": (("budget",), int), "DDTREE_SHADOW_SHARE": (("shadow", "share"), float),
               "DDTREE_SHADOW_REPORT_EVERY": (("shadow", "report_every"), int)}
# names whose values are credentials: the profile keeps a reference, never the value
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|CREDENTIAL|PRIVATE_?KEY", re.I)
LAUNCH_MODULE = "sglang.launch_server"


def choices(literal: Any) -> tuple[str, ...]:
    """The values a profile's Literal field takes (None dropped)."""
    return tuple(a for a in get_args(literal) if isinstance(a, str))


_ALLOWED: dict[str, tuple[str, ...]] = {
    "attention_backend": choices(AttentionBackend),
    "speculative_draft_attention_backend": choices(AttentionBackend),
    "dtype": choices(MemorySection.model_fields["dtype"].annotation),
    "kv_cache_dtype": choices(MemorySection.model_fields["kv_cache_dtype"].annotation),
}


# ------------------------------------------------------------------ splitting a launch line


@dataclass(frozen=True)
class Flag:
    written: tuple[str, ...]  # the words as written ("--port=1" or "--port", "1")
    option: str  # SGLang's name for it (its first long option), or as written when unknown
    dest: str | None  # where SGLang's parser puts it (None: the parser does not know it)
    values: tuple[str, ...]


@dataclass(frozen=True)
class Launch:
    """A launch line split SGLang's way: the interpreter, the launcher, then its flags in order."""

    argv: tuple[str, ...]
    python: str | None  # the interpreter that runs the server (None: not a path this module can name)
    launcher: str  # "python -m sglang.launch_server", "sglang serve", or what else ran
    flags: tuple[Flag, ...]
    positional: tuple[str, ...] = ()  # words that are no flag's value (argparse refuses them)
    problems: tuple[str, ...] = ()

    def last(self, dest: str) -> Flag | None:
        """The flag SGLang uses for `dest` (argparse: the last one given wins)."""
        return next((f for f in reversed(self.flags) if f.dest == dest), None)


class Parser:
    """The flags of one SGLang parser: exact spellings, then unique prefixes, as argparse reads them."""

    def __init__(self, spec: Sequence[FlagSpec] | None) -> None:
        self.known = spec is not None
        self.by_option: dict[str, FlagSpec] = {}
        for s in (*KNOWN, *(spec or ())):  # the host's parser overrides what this module knows
            for o in s.options:
                self.by_option[o] = s

    def find(self, option: str) -> FlagSpec | None:
        if option in self.by_option:
            return self.by_option[option]
        if not self.known or not option.startswith("--"):
            return None
        hits = {id(s): s for o, s in self.by_option.items() if o.startswith(option)}
        return next(iter(hits.values())) if len(hits) == 1 else None


def _option_like(word: str) -> bool:
    return word.startswith("-") and word != "-" and not _NEGATIVE.match(word) and " " not in word


def split_launch(argv: Sequence[str], spec: Sequence[FlagSpec] | None = None) -> Launch:
    """The interpreter, the launcher and the flags of a launch line (as a process's cmdline or a
    unit's ExecStart has it). Python's own options before `-m` are the interpreter's."""
    argv = tuple(argv)
    python, launcher, start, problems = _launcher(argv)
    parser = Parser(spec)
    flags: list[Flag] = []
    positional: list[str] = []
    i = start
    while i < len(argv):
        word = argv[i]
        if word == "--":
            positional += argv[i + 1:]
            break
        if not _option_like(word):
            positional.append(word)
            i += 1
            continue
        name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        s = parser.find(name)
        nargs = s.nargs if s is not None else "*"
        if eq:
            values: tuple[str, ...] = (inline,)
            used = 1
        else:
            used = 1
            taken: list[str] = []
            while i + used < len(argv) and not _option_like(argv[i + used]) and argv[i + used] != "--":
                if nargs == 0 or (nargs in (None, "?") and taken) or (isinstance(nargs, int) and len(taken) >= nargs):
                    break
                taken.append(argv[i + used])
                used += 1
            values = tuple(taken)
        flags.append(Flag(argv[i:i + used], s.name if s else name, s.dest if s else None, values))
        i += used
    if positional:
        problems.append(f"words that are no flag's value: {' '.join(positional)} (SGLang's parser refuses them)")
    return Launch(argv, python, launcher, tuple(flags), tuple(positional), tuple(problems))


def _launcher(argv: tuple[str, ...]) -> tuple[str | None, str, int, list[str]]:
    """(interpreter, launcher, index of the first flag, problems)."""
    if not argv:
        return None, "", 0, ["an empty launch line"]
    words = list(argv)
    first = 0
    if os.path.basename(words[0]) == "env":  # /usr/bin/env [VAR=value ...] python3 -m ...
        first = 1
        while first < len(words) and ("=" in words[first] or words[first].startswith("-")):
            first += 1
    exe = words[first] if first < len(words) else ""
    base = os.path.basename(exe)
    absolute = exe if exe.startswith("/") else None
    if base == "sglang" and first + 1 < len(words) and words[first + 1] == "serve":
        # the console script of the venv: its interpreter sits beside it
        return (os.path.join(os.path.dirname(absolute), "python") if absolute else None), "sglang serve", first + 2, []
    if base.startswith("python"):
        i = first + 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-m":
            i += 2 if words[i] in ("-X", "-W") else 1
        if i + 1 < len(words) and words[i] == "-m" and words[i + 1] == LAUNCH_MODULE:
            return absolute, f"python -m {LAUNCH_MODULE}", i + 2, []
        if i < len(words) and words[i].endswith("launch_server.py"):
            return absolute, f"python {words[i]}", i + 1, []
    return None, exe, len(words), [f"{exe} does not start SGLang's server the ways this tool knows "
                                   f"(python -m {LAUNCH_MODULE}, sglang serve)"]


def is_launch_line(argv: Sequence[str]) -> bool:
    """Whether argv starts SGLang's server (a process's cmdline or a unit's ExecStart)."""
    return not _launcher(tuple(argv))[3]


# ------------------------------------------------------------------ a launch line to profile keys


@dataclass(frozen=True)
class Note:
    """What became of a flag or variable that the profile does not keep as written."""

    what: str  # the flag or variable as written
    reason: str


@dataclass
class Mapped:
    """A launch line and its environment as profile keys."""

    values: dict[Loc, Any] = field(default_factory=dict)  # profile key -> value
    extra_args: list[str] = field(default_factory=list)  # service.extra_args, as written, in order
    env: dict[str, str] = field(default_factory=dict)  # service.env
    secrets: dict[str, str] = field(default_factory=dict)  # service.secrets (references, never values)
    mode: str | None = None  # the profile mode the line runs (None: none the profile models)
    algorithm: str | None = None
    python: str | None = None
    notes: list[Note] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what the profile cannot say: init refuses


def to_profile(launch: Launch, env: dict[str, str] | None = None) -> Mapped:
    """The profile keys a launch line and its environment set. Every flag ends as a key, in
    `extra_args`, or in `notes` with why; a value the profile cannot hold is a problem."""
    out = Mapped(python=launch.python, problems=list(launch.problems))
    seen: dict[str, Flag] = {}
    for f in launch.flags:
        if f.dest in MAPPED_DESTS:
            if f.dest in seen:
                out.notes.append(Note(" ".join(seen[f.dest].written), f"given again later as {' '.join(f.written)}; "
                                                                       "SGLang uses the last"))
            seen[f.dest] = f
        elif f.option in RENDERED_FLAGS:  # a spelling this host's SGLang does not know: never twice
            out.problems.append(f"{' '.join(f.written)}: render writes {f.option} from {RENDERED_FLAGS[f.option]}, "
                                "and this host's SGLang parser does not know the flag")
        else:
            out.extra_args += f.written
    for dest, f in seen.items():
        _map_flag(out, dest, f)
    _map_speculative(out, seen)
    env = dict(env or {})
    _map_env(out, env)
    _map_cards(out, seen, env.get("CUDA_VISIBLE_DEVICES"))
    return out


def _convert(out: Mapped, f: Flag, kind: type) -> Any:
    if len(f.values) != 1:
        out.problems.append(f"{' '.join(f.written)}: expected one value")
        return None
    raw = f.values[0]
    try:
        return kind(raw)
    except ValueError:
        out.problems.append(f"{' '.join(f.written)}: {raw!r} is not {'an integer' if kind is int else 'a number'}")
        return None


def _map_flag(out: Mapped, dest: str, f: Flag) -> None:
    if dest in _SCALARS:
        key, kind = _SCALARS[dest]
        value = _convert(out, f, kind)
        if value is None:
            return
        if (dest, value) in _SAME:
            out.notes.append(Note(" ".join(f.written), f"written {f.option} {_SAME[(dest, value)]} (the same to SGLang)"))
            value = _SAME[(dest, value)]
        allowed = _ALLOWED.get(dest)
        if allowed and value not in allowed:
            out.problems.append(f"{' '.join(f.written)}: {'.'.join(key)} takes {', '.join(allowed)}")
            return
        out.values[key] = value
    elif dest == "disable_cuda_graph":
        out.values[("memory", "cuda_graph")] = False
        out.notes.append(Note(" ".join(f.written), "memory.cuda_graph false: render then writes no "
                                                   "--cuda-graph-max-bs-decode (no graphs to size)"))
    elif dest == "enable_metrics":
        pass  # render writes it always
    elif dest in _MULTINODE:
        out.problems.append(f"{' '.join(f.written)}: this unit is one node of a multi-node service; describe it in "
                            "profiles/services/<name>.yaml (multinode.nodes), not in one host's profile")


def _map_speculative(out: Mapped, seen: dict[str, Flag]) -> None:
    algo_flag = seen.get("speculative_algorithm")
    algo = algo_flag.values[0].upper() if algo_flag and algo_flag.values else None
    out.algorithm = algo
    spec = {d: seen[d] for d in _SPECULATIVE if d in seen and d != "speculative_algorithm"}
    mode = ALGORITHM_MODE.get(algo or "")
    if mode is None:
        why = (f"--speculative-algorithm {algo}: the profile's modes are NEXTN, DFLASH and DDTREE; the running "
               "unit stays the known-good baseline that the first deploy adopts, and this flag is not in the profile"
               if algo else "")
        if algo_flag is not None:
            out.notes.append(Note(" ".join(algo_flag.written), why))
        for f in spec.values():
            out.notes.append(Note(" ".join(f.written), f"belongs to --speculative-algorithm {algo or '(none)'}, which "
                                                       "no profile mode runs"))
        return
    out.mode = mode
    if algo == "EAGLE":
        out.notes.append(Note(" ".join(algo_flag.written) if algo_flag else "EAGLE",
                              "written --speculative-algorithm NEXTN (SGLang's alias of EAGLE)"))
    loc: Loc = ("modes", mode)
    nextn = mode == "nextn"
    keys = {"speculative_draft_model_path": ("draft_model_path", str),
            "speculative_num_draft_tokens": ("num_draft_tokens" if nextn else "block_size", int),
            "speculative_draft_attention_backend": ("draft_attention_backend", str)}
    if nextn:
        keys.update(speculative_num_steps=("num_steps", int), speculative_eagle_topk=("eagle_topk", int))
    for dest, f in spec.items():
        if dest not in keys:
            out.notes.append(Note(" ".join(f.written), f"{mode} does not use it (SGLang runs {algo} with 1)"))
            continue
        if nextn and dest == "speculative_draft_attention_backend":
            out.notes.append(Note(" ".join(f.written), "the profile's nextn mode does not set a draft backend"))
            continue
        name, kind = keys[dest]
        value = _convert(out, f, kind)
        if value is None:
            continue
        allowed = _ALLOWED.get(dest)
        if allowed and value not in allowed:
            out.problems.append(f"{' '.join(f.written)}: modes.{mode}.{name} takes {', '.join(allowed)}")
            continue
        out.values[loc + (name,)] = value


def _map_env(out: Mapped, env: dict[str, str]) -> None:
    ddtree = out.mode == "ddtree-shadow"
    for name, value in env.items():
        if name == "PYTHONUNBUFFERED":
            if value != "1":
                out.notes.append(Note(f"{name}={value}", "render sets PYTHONUNBUFFERED=1 (the gate reads the journal "
                                                         "as lines are written)"))
        elif name == "SGLANG_PLUGINS" and ddtree and value == "ddtree":
            pass  # render sets it for the ddtree modes
        elif name in _DDTREE_ENV and ddtree:
            key, kind = _DDTREE_ENV[name]
            try:
                out.values[("modes", "ddtree-shadow", *key)] = kind(value)
            except ValueError:
                out.problems.append(f"{name}={value!r}: not {'an integer' if kind is int else 'a number'}")
        elif name == "CUDA_VISIBLE_DEVICES":
            pass  # _map_cards
        elif SECRET_NAME.search(name):
            out.secrets[name] = f"env:{name}"
            out.notes.append(Note(name, f"a credential: the profile says env:{name} (set {name} on the machine that "
                                        "runs ddtree-ops); its value is not written"))
        else:
            out.env[name] = value


def _map_cards(out: Mapped, seen: dict[str, Flag], visible_text: str | None) -> None:
    """The service's cards (`gpus`) from CUDA_VISIBLE_DEVICES, --base-gpu-id and --gpu-id-step:
    rank i runs on visible card base + i x step (SGLang's gpu_id)."""
    base_f, step_f = seen.get("base_gpu_id"), seen.get("gpu_id_step")
    base = _convert(out, base_f, int) if base_f else 0
    step = _convert(out, step_f, int) if step_f else 1
    if visible_text is None and base in (0, None) and step in (1, None):
        return
    z = out.values
    ranks = z.get(("parallel", "tp_size"), 1) * z.get(("parallel", "dp_size"), 1) * z.get(("parallel", "pp_size"), 1)
    if visible_text is not None:
        parts = [p.strip() for p in str(visible_text).split(",") if p.strip()]
        if not all(p.isdigit() for p in parts):
            out.problems.append(f"CUDA_VISIBLE_DEVICES={visible_text}: the profile names cards by index (gpus: [0, 1]), "
                                "not by UUID or MIG instance")
            return
        visible = [int(p) for p in parts]
    else:
        visible = list(range(64))
    picked = [(base or 0) + i * (step or 1) for i in range(ranks)]
    if any(i >= len(visible) for i in picked):
        out.problems.append(f"--base-gpu-id {base} --gpu-id-step {step} with {ranks} rank(s) runs past the "
                            f"{len(visible)} visible card(s)")
        return
    out.values[("gpus",)] = [visible[i] for i in picked]
    for f in (base_f, step_f):
        if f is not None:
            out.notes.append(Note(" ".join(f.written), "written as gpus (CUDA_VISIBLE_DEVICES), the same cards"))


# ------------------------------------------------------------------ two launch lines compared


@dataclass(frozen=True)
class Difference:
    option: str
    running: tuple[str, ...] | None  # None: not given
    rendered: tuple[str, ...] | None

    def line(self) -> str:
        def show(v: tuple[str, ...] | None) -> str:
            return "(not given)" if v is None else " ".join((self.option, *v))

        if self.running is None:
            return f"+ {show(self.rendered)}"
        if self.rendered is None:
            return f"- {show(self.running)}"
        return f"~ {show(self.running)}  ->  {show(self.rendered)}"


def _by_option(launch: Launch) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for f in launch.flags:
        out[f.option] = f.values  # argparse: the last one wins
    return out


def compare(running: Sequence[str], rendered: Sequence[str], spec: Sequence[FlagSpec] | None = None) -> list[str]:
    """How `rendered` differs from `running`, flag by flag, in SGLang's spelling ([] when they say
    the same): a changed interpreter or launcher, then flags added, removed or changed."""
    a, b = split_launch(running, spec), split_launch(rendered, spec)
    out: list[str] = []
    if (a.python, a.launcher) != (b.python, b.launcher):
        out.append(f"~ {a.python or '?'} ({a.launcher})  ->  {b.python or '?'} ({b.launcher})")
    ra, rb = _by_option(a), _by_option(b)
    for option in dict.fromkeys([*ra, *rb]):
        if ra.get(option) != rb.get(option):
            out.append(Difference(option, ra.get(option), rb.get(option)).line())
    return out


# ------------------------------------------------------------------ systemd's words


def split_words(text: str) -> list[str]:
    """systemd's command-line and Environment= word splitting (systemd.syntax(7)): whitespace
    separates, double and single quotes group, C escapes inside double quotes and bare words,
    `$$` and `%%` stand for `$` and `%`."""
    words: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(text)
    escapes = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "s": " ",
               "\\": "\\", '"': '"', "'": "'", " ": " ", "$": "$"}
    quote = ""
    while i < n:
        c = text[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"' and i + 1 < n:
                i += 1
                cur.append(escapes.get(text[i], "\\" + text[i]))
            else:
                cur.append(c)
        elif c in " \t\n":
            if have:
                words.append("".join(cur))
                cur, have = [], False
        elif c in "\"'":
            quote, have = c, True
        elif c == "\\" and i + 1 < n:
            i += 1
            cur.append(escapes.get(text[i], text[i]))
            have = True
        else:
            cur.append(c)
            have = True
        i += 1
    if have:
        words.append("".join(cur))
    return [w.replace("$$", "$").replace("%%", "%") for w in words]


def exec_start(unit_text: str, env: dict[str, str] | None = None) -> list[str] | None:
    """The ExecStart= argv of a unit's text (`systemctl cat`: the file and its drop-ins, the last
    assignment winning, an empty one resetting), `${VAR}` and `$VAR` expanded from its environment
    as systemd does. None when there is none."""
    lines = _logical_lines(unit_text)
    command: str | None = None
    section = ""
    for line in lines:
        if line.startswith("["):
            section = line.strip()
            continue
        if section != "[Service]" or not line.startswith("ExecStart="):
            continue
        value = line.split("=", 1)[1].strip()
        command = value or None
    if command is None:
        return None
    command = command.lstrip("@-:+!")
    env = env or {}
    words: list[str] = []
    for word in split_words(command):
        bare = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if bare:  # an unbraced $VAR alone is split at whitespace into words
            words += env.get(bare.group(1), "").split()
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def environment(assignments: Iterable[str], files: Iterable[str]) -> dict[str, str]:
    """A unit's environment: its Environment= words (`systemctl show -p Environment`) and then its
    EnvironmentFile= texts, in the order systemd applies them (the files win)."""
    env: dict[str, str] = {}
    for text in assignments:
        for word in split_words(text):
            name, eq, value = word.partition("=")
            if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                env[name] = value
    for text in files:
        env.update(parse_env_file(text))
    return env


def parse_env_file(text: str) -> dict[str, str]:
    """An EnvironmentFile (systemd.exec(5)): `KEY=VALUE` lines, `#` and `;` comments, single or
    double quotes (backslash escapes inside double quotes), a trailing backslash continuing a line."""
    env: dict[str, str] = {}
    for line in _logical_lines(text):
        name, eq, value = line.partition("=")
        name = name.strip().removeprefix("export ").strip()
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r'\\([\\"`$])', r"\1", value[1:-1])
        env[name] = value
    return env
