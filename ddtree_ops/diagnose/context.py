"""What a log says about the start being read, and the resolvers that name a cause from it.

`LaunchContext` is filled as lines arrive (speculative algorithm, load format, tensor-parallel size
and the model paths from SGLang's `server_args`, the visible cards, whether DFlash-family hidden
capture was configured, whether a stop was requested).

A resolver reads the context, the matched line and the frames that raised it, and either picks
one of the rule's *variants* (named in `catalogue.yaml`, where every remedy's text lives) with the
facts its text is filled with (`{need}`, `{where}`, ...), or DECLINEs: the log's own context does
not support the rule's cause, and the line goes to the next rule. A generic message (`This should
not happen`, a `TypeError` about `NoneType`) is only given a specific cause this way, and the
finding then carries the context that named it (`Resolution.context`). Resolvers hold no prose.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops.diagnose import journal

# SGLang's built-in speculative algorithms (srt/speculative/spec_info.py, 0.5.17 and 0.5.23, and
# the NEXTN/MTP spellings server_args turns into EAGLE); any other name is a plugin's CustomSpecAlgo
BUILTIN_ALGORITHMS = frozenset({"DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM",
                                "NONE", "NEXTN", "MTP"})


@dataclass
class LaunchContext:
    """Facts about the start being read, from the lines seen so far."""

    algorithm: str | None = None  # --speculative-algorithm
    load_format: str | None = None  # --load-format (dummy = random weights)
    tp_size: int | None = None  # --tp-size
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES, where the log says it
    gpu_id: int | None = None  # the card a failing rank asked for, where the log says it
    launch_line: int | None = None  # the server_args line these came from
    capture: bool | None = None  # DFlash-family hidden capture configured (True), said not to be (False)
    plugin_seen: bool = False  # the ddtree plugin's worker printed its settings
    stop_line: int | None = None  # a stop was requested here (systemd's stop, SIGTERM); None after a new start

    @property
    def plugin_algorithm(self) -> bool:
        """The speculative algorithm is not one SGLang ships: a plugin registered it."""
        return bool(self.algorithm) and (self.algorithm or "").upper() not in BUILTIN_ALGORITHMS

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.algorithm:
            out["speculative_algorithm"] = self.algorithm
        if self.load_format:
            out["load_format"] = self.load_format
        if self.tp_size is not None:
            out["tp_size"] = self.tp_size
        if self.visible_devices is not None:
            out["cuda_visible_devices"] = self.visible_devices
        if self.capture is not None:
            out["hidden_capture_configured"] = self.capture
        if self.stop_line is not None:
            out["stop_requested_line"] = self.stop_line
        return out


_ALGO_RX = (re.compile(r"speculative_algorithm='([A-Za-z0-9_]+)'"), re.compile(r"--speculative-algorithm[= ]+([A-Za-z0-9_]+)"))
_LOADFMT_RX = (re.compile(r"load_format='([A-Za-z0-9_]+)'"), re.compile(r"--load-format[= ]+([A-Za-z0-9_]+)"))
_TP_RX = (re.compile(r"[(, ]tp_size=([0-9]+)"), re.compile(r"--(?:tp-size|tensor-parallel-size|tp)[= ]+([0-9]+)"))
VISIBLE_RX = re.compile(r"CUDA_VISIBLE_DEVICES[=:'\"() ]{1,6}([0-9][0-9, ]{0,60}|'')")
_RANK_RX = re.compile(r"ps\.gpu_id=([0-9]+).{0,120}?ps\.tp_size=([0-9]+)")  # model_runner's Context warning


def note_launch(ctx: LaunchContext, text: str, lineno: int) -> None:
    """SGLang's `server_args=ServerArgs(...)` (or a command line): what this start runs with."""
    for rx in _ALGO_RX:
        m = rx.search(text)
        if m:
            ctx.algorithm = m.group(1) if m.group(1) != "None" else None
            break
    for rx in _LOADFMT_RX:
        m = rx.search(text)
        if m:
            ctx.load_format = m.group(1)
            break
    for rx in _TP_RX:
        m = rx.search(text)
        if m:
            ctx.tp_size = int(m.group(1))
            break
    note_visible(ctx, text)
    ctx.launch_line = lineno
    ctx.stop_line = None


def note_visible(ctx: LaunchContext, text: str) -> None:
    """CUDA_VISIBLE_DEVICES where a line says it (SGLang 0.5.17's model_runner warns with it, and
    the rank's gpu_id and tp_size, before it re-raises a failed set_device)."""
    m = VISIBLE_RX.search(text)
    if m:
        ctx.visible_devices = m.group(1).strip().strip("'\"") or "(empty)"
    r = _RANK_RX.search(text)
    if r:
        ctx.gpu_id, ctx.tp_size = int(r.group(1)), int(r.group(2))


# ------------------------------------------------------------------ resolvers


@dataclass(frozen=True)
class Clues:
    """What a resolver may read: the context, the matched line, the frames of its traceback part,
    whether the lines just before it mention a speculative setting (computed only when asked), and
    the profile key a launch flag comes from (the catalogue's `flag_keys`)."""

    ctx: LaunchContext
    text: str
    frames: list[journal.Frame] = field(default_factory=list)
    in_traceback: bool = False
    spec_setting_before: Callable[[], bool] = lambda: False
    key_of: Callable[[str], str | None] = lambda flag: None


@dataclass(frozen=True)
class Resolution:
    variant: str  # a variant of the rule, defined in catalogue.yaml
    facts: dict[str, str] = field(default_factory=dict)  # fills the variant's {placeholders}
    context: str = ""  # the lines of the log that named this cause (shown with the evidence)


DECLINE = Resolution("")  # the context does not support this rule's cause: the next rule gets the line


def _launch(ctx: LaunchContext) -> str:
    where = f"server_args (line {ctx.launch_line})" if ctx.launch_line else "the launch line"
    return f"{where}: speculative_algorithm={ctx.algorithm!r}"


_SHAPE_RX = re.compile(r"Expected shape \[N, ([0-9]+)\] \(num_context_features=([0-9]+), hidden_size=([0-9]+)\), "
                       r"but got shape=\(([0-9]+), ([0-9]+)\)")


def resolve_feature_dim(c: Clues) -> Resolution:
    """DFlash's `target_hidden feature dim mismatch` has two causes that print the same message.

    Capture configured (built-in DFLASH, or the plugin said it registered DDTREE as DFlash-family,
    or its worker ran) but a requested layer never captured: the draft's target_layer_ids. A
    plugin algorithm with no sign of DFlash-family capture (or a line saying it is not): the
    capture was never set up. The shape tells them apart when fewer than all, but more than one,
    of the requested layers arrived.
    """
    m = _SHAPE_RX.search(c.text)
    partial = False
    if m:
        want, hidden, got = int(m.group(2)), int(m.group(3)), int(m.group(5))
        partial = hidden > 0 and got % hidden == 0 and 1 < got // hidden < want
    ctx = c.ctx
    if not partial and ctx.capture is False:
        return Resolution("capture_missing", {"why": "a line of this start says the algorithm was registered "
                                                     "without DFlash-family capture"})
    if not partial and ctx.plugin_algorithm and not ctx.capture and not ctx.plugin_seen:
        algo = (ctx.algorithm or "").upper()
        return Resolution("capture_missing", {"why": f"{algo} is a plugin algorithm and nothing in this start "
                                                     "shows DFlash-family capture configured"}, _launch(ctx))
    return Resolution("layer_ids")


_SPEC_WORDS = ("speculative", "spec_decode", "eagle", "nextn", "mtp", "dflash", "dspark", "medusa", "draft", "ngram")


def _spec_frame(frames: list[journal.Frame]) -> journal.Frame | None:
    return next((f for f in reversed(frames) if any(k in (f.path + " " + f.func).lower() for k in _SPEC_WORDS)), None)


def speculative_facts(c: Clues) -> dict[str, str]:
    """Where in speculative code it was raised, and which algorithm this start used."""
    where = _spec_frame(c.frames)
    return {"where": f" ({where.short()})" if where is not None else "", "algorithm": (c.ctx.algorithm or "").upper()}


def resolve_speculative_frame(c: Clues) -> Resolution:
    """A generic exception raised in speculative code: say where, and which settings to check."""
    return Resolution("speculative", speculative_facts(c))


def resolve_speculative_abort(c: Clues) -> Resolution | None:
    """A native abort (outside a traceback) right after the server logged a speculative setting:
    that setting is the suspect. Otherwise the rule's own text stands."""
    if c.in_traceback or not c.ctx.algorithm or not c.spec_setting_before():
        return None
    return Resolution("after_speculative_setting", speculative_facts(c))


def resolve_plugin_capture(c: Clues) -> Resolution:
    """SGLang's graph runners refuse an algorithm they cannot size or verify (a generic message:
    `This should not happen`, `NoneType` arithmetic). That names the missing DFlash-family setup
    only when this start ran a plugin algorithm and no line says it registered as DFlash-family."""
    ctx = c.ctx
    if not ctx.plugin_algorithm or ctx.capture is True:
        return DECLINE
    where = next((f.short() for f in reversed(c.frames) if "cuda_graph_runner" in f.path), "")
    said = ("a line of this start says it was registered without DFlash-family capture" if ctx.capture is False
            else "no line of this start says it registered as DFlash-family")
    return Resolution("capture_missing", {"algorithm": (ctx.algorithm or "").upper()},
                      f"{_launch(ctx)} is a plugin algorithm; {said}" + (f"; raised in {where}" if where else ""))


_CLASS_RX = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)' object has no attribute|Model ([A-Za-z_][A-Za-z0-9_]*) implements")


def resolve_capture_unsupported(c: Clues) -> Resolution:
    """The target never set up the hidden-state capture its draft reads (a capture method or
    attribute missing). For a plugin algorithm that is the plugin's setup; for SGLang's own
    algorithms it is the target model class, which this SGLang cannot capture from."""
    m = _CLASS_RX.search(c.text)
    cls = next((g for g in (m.groups() if m else ()) if g), "the target model class")
    algo = (c.ctx.algorithm or "").upper()
    facts = {"cls": cls, "algorithm": algo or "the speculative algorithm"}
    if c.ctx.plugin_algorithm:
        return Resolution("plugin", facts, _launch(c.ctx))
    return Resolution("model_class", facts, _launch(c.ctx) if c.ctx.algorithm else "")


_DRAFT_WEIGHT = re.compile(r"midlayer|(^|\.)fc(\.|$)|eagle|mtp|dflash|draft|(^|\.)(enorm|hnorm|eh_proj)\b", re.I)
_KEY_RX = re.compile(r"KeyError: '([^']{1,200})'")
# vLLM's AutoWeightsLoader names the checkpoint weight and the class that cannot place it
# (vllm/model_executor/models/utils.py), and its loader the model's weights the checkpoint lacked
# (vllm/model_executor/model_loader/default_loader.py): the class is in the message, not in a frame
_UNMAPPED_RX = re.compile(r"There is no module or parameter named '([^']{1,200})' in ([A-Za-z_][A-Za-z0-9_]*)"
                          r"|weights were not initialized from checkpoint: *[{\[]?'([^']{1,200})'")
# the words draft model classes and their files are named by
_DRAFT_WORDS = r"eagle|medusa|mtp|nextn|dflash|dspark|draft"
_DRAFT_CLASS = re.compile(_DRAFT_WORDS, re.I)
_DRAFT_MODEL_FILE = re.compile(rf"/models/[a-z0-9_]*({_DRAFT_WORDS})[a-z0-9_]*\.py$")


def _loader(frames: list[journal.Frame]) -> journal.Frame | None:
    return next((f for f in reversed(frames) if f.func in ("load_weights", "weight_loader", "load_state_dict")), None)


def resolve_draft_weights(c: Clues) -> Resolution:
    """A checkpoint whose weight names do not fit the class that loads it. It is the draft's when
    the name is one only drafts have (EAGLE3's `midlayer`, EAGLE's `fc`, MTP's `eh_proj`), when
    the class loading it is a draft model, or when the speculative worker is loading it."""
    m = _KEY_RX.search(c.text)
    u = _UNMAPPED_RX.search(c.text)
    weight = m.group(1) if m else (u.group(1) or u.group(3)) if u else ""
    named_cls = u.group(2) if u and u.group(2) else ""
    loader = _loader(c.frames)
    draft_named = bool(weight) and _DRAFT_WEIGHT.search(weight) is not None
    draft_class = ((loader is not None and _DRAFT_MODEL_FILE.search(loader.path) is not None)
                   or _DRAFT_CLASS.search(named_cls) is not None)
    spec = any("/speculative/" in f.path for f in c.frames)
    if not (draft_named or draft_class or spec):
        return DECLINE
    where = loader.short() if loader is not None else named_cls or "load_weights"
    facts = {"weight": weight or "a weight", "loader": where, "algorithm": (c.ctx.algorithm or "").upper()}
    if draft_named and not draft_class:
        return Resolution("draft_format", facts, f"{weight!r} is a draft-only weight, loaded by {where}")
    return Resolution("draft_checkpoint", facts, f"raised in {where}" + (" under the speculative worker" if spec else ""))


_MATMUL_RX = re.compile(r"mat1 and mat2 shapes cannot be multiplied \(([0-9]+)x([0-9]+) and ([0-9]+)x([0-9]+)\)")
_SIZE_RX = re.compile(r"size of tensor a \(([0-9]+)\) must match the size of tensor b \(([0-9]+)\)")


def resolve_draft_shape(c: Clues) -> Resolution:
    """A shape mismatch while the draft model ran (its innermost model frame is a draft model's
    file): the draft does not fit this target. Elsewhere the generic backstop names it."""
    model = next((f for f in reversed(c.frames) if "/models/" in f.path), None)
    if model is None or _DRAFT_MODEL_FILE.search(model.path) is None:
        return DECLINE
    m = _MATMUL_RX.search(c.text)
    if m:
        got, want = m.group(2), m.group(3)
    else:
        m2 = _SIZE_RX.search(c.text)
        got, want = (m2.group(1), m2.group(2)) if m2 else ("?", "?")
    return Resolution("draft_shape", {"got": got, "want": want, "where": model.short()}, f"raised while the draft ran "
                      f"({model.short()})")


_CONTEXT_RX = re.compile(r"(User-specified|Target model's) context_length \(([0-9]+)\) is greater than the derived "
                         r"context_length \(([0-9]+)\)")


def resolve_context_limit(c: Clues) -> Resolution | None:
    """SGLang's refusal of a context longer than the model's own maximum names both numbers; for a
    draft it is the target's context that the draft cannot hold."""
    m = _CONTEXT_RX.search(c.text)
    if not m:
        return None
    facts = {"want": m.group(2), "limit": m.group(3)}
    return Resolution("draft" if m.group(1).startswith("Target") else "target", facts)


_FLAG_RX = re.compile(r"--[a-z][a-z0-9]*(?:-[a-z0-9]+)+|--[a-z]{2,}|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
_VALUE_AFTER = r"[\s:=(']{1,4}'?([A-Za-z0-9_.\-/]{1,80})"


def resolve_flag_named(c: Clues) -> Resolution | None:
    """An argument SGLang refused, named by the flag (or argument) in its message: the profile key
    that renders it. Without a flag the rule's own text stands."""
    for m in _FLAG_RX.finditer(c.text):
        key = c.key_of(m.group(0))
        if key:
            v = re.match(_VALUE_AFTER, c.text[m.end():])
            return Resolution("named", {"flag": m.group(0), "key": key, "value": v.group(1) if v else ""})
    return None


def resolve_gpu_visibility(c: Clues) -> Resolution:
    """The server found fewer GPUs than it was started for (none, or not the ordinal a rank asked
    for): the cards it was given against the ranks it runs, from what the log says."""
    ctx = c.ctx
    given = f"CUDA_VISIBLE_DEVICES={ctx.visible_devices}" if ctx.visible_devices else "the cards the unit was given"
    tp = f"tp_size {ctx.tp_size}" if ctx.tp_size else "its tensor-parallel size"
    said = []
    if ctx.tp_size:
        said.append(f"tp_size={ctx.tp_size}" + (f" (server_args, line {ctx.launch_line})" if ctx.launch_line else ""))
    if ctx.visible_devices:
        said.append(f"CUDA_VISIBLE_DEVICES={ctx.visible_devices}")
    if ctx.gpu_id is not None:
        said.append(f"a rank asked for card {ctx.gpu_id}")
    return Resolution("cards", {"given": given, "tp": tp}, "; ".join(said))


_ARCH_RX = re.compile(r"(?:compute capability|capability)[:= ]{1,3}([0-9]+\.[0-9x]+)|\b(sm_?[0-9]+[a-z]?|SM ?[0-9]+(?:\.[0-9x]+)?)|"
                      r"\b(Blackwell|Hopper|Ampere|Ada Lovelace|Turing|Volta)\b")
_BACKEND_RX = re.compile(r"'([a-z0-9_]+)' backend|([A-Za-z0-9_]+) (?:attention )?[Bb]ackend|--attention-backend[= ]([a-z0-9_]+)")


def resolve_gpu_arch(c: Clues) -> Resolution:
    """A kernel, backend or compiler refused this GPU's generation: name the generation the message
    names, and the backend when it is one (a setting), else the build (service.python)."""
    m = _ARCH_RX.search(c.text)
    arch = next((g for g in (m.groups() if m else ()) if g), "this GPU")
    b = _BACKEND_RX.search(c.text)
    backend = next((g for g in (b.groups() if b else ()) if g), "")
    facts = {"arch": arch, "backend": backend}
    return Resolution("backend" if backend else "kernel", facts)


_WEIGHTS_RX = re.compile(r"under --mem-fraction-static=([0-9.]+)\. Raise --mem-fraction-static above ([0-9.]+)")
NEED_TOO_HIGH = 0.93  # above this fraction nothing is left for activations: the model does not fit


def resolve_kv_budget(c: Clues) -> Resolution | None:
    """0.5.17+ prints the fraction it would have needed ("Raise ... above 0.131"): say that number.
    SGLang sizes the budget from the memory free at its start, so memory other processes hold on
    the card raises it too."""
    m = _WEIGHTS_RX.search(c.text)
    if not m:
        return None
    have, need = m.group(1), float(m.group(2))
    return Resolution("does_not_fit" if need > NEED_TOO_HIGH else "raise_to", {"have": have, "need": f"{need:g}"})


# name -> (function, the variants it may return, the facts their text may use)
Resolver = Callable[[Clues], "Resolution | None"]
# Where each CUDA library comes from (the words of each remedy are the catalogue's):
# - the driver's own user-mode libraries: libcuda (the CUDA driver API) and the libnvidia-* ones
#   come with the NVIDIA driver package; a container gets them from the NVIDIA Container Toolkit,
#   which mounts the host driver's libraries (NVIDIA_DRIVER_CAPABILITIES=compute for CUDA); a newer
#   libcuda for an older driver comes only from the cuda-compat-<major>-<minor> package (data-center
#   GPUs). No pip wheel ships them. (docs.nvidia.com/deploy/cuda-compatibility, "Forward
#   Compatibility"; NVIDIA container images: "the machine running the CUDA container only requires
#   the NVIDIA driver"; apptainer's nvliblist.conf lists libcuda.so and libnvidia-*.so as host libraries)
# - the CUDA toolkit's runtime libraries ship in the toolkit (/usr/local/cuda/lib64) and as PyPI
#   wheels: for CUDA 12 `nvidia-<name>-cu12`, for CUDA 13 `nvidia-<name>` (the -cu13 names are
#   deprecated stubs), except cuDNN, NCCL and cuSPARSELt, which keep `-cu12` / `-cu13`.
# - libtorch_cuda and libc10_cuda are torch's own (the torch wheel).
_DRIVER_LIBS = ("libcuda.", "libcudadebugger.", "libnvidia-")
_WHEELS = (  # soname stem -> the wheel's <name>, and whether the soname's major is the CUDA major
    ("libcudart", "cuda-runtime", True), ("libnvrtc", "cuda-nvrtc", True), ("libcublasLt", "cublas", True),
    ("libcublas", "cublas", True), ("libnvJitLink", "nvjitlink", True), ("libcupti", "cuda-cupti", True),
    ("libcusparseLt", "cusparselt", False), ("libcusparse", "cusparse", False), ("libcufft", "cufft", False),
    ("libcurand", "curand", False), ("libcusolver", "cusolver", False), ("libnvToolsExt", "nvtx", False),
    ("libcufile", "cufile", False), ("libcudnn", "cudnn", False), ("libnccl", "nccl", False),
)
_SUFFIXED = ("cudnn", "nccl", "cusparselt")  # their CUDA 13 wheels keep the -cu13 suffix
_TORCH_LIBS = ("libtorch_cuda", "libc10_cuda", "libtorch_nvshmem")
_LIB_RX = re.compile(r"(lib[A-Za-z0-9_+-]*(?:\.so)?(?:\.[0-9]+)*)(?::| cannot found)")


def wheel_for(lib: str) -> str | None:
    """The PyPI wheel that ships a CUDA toolkit library (`libnvrtc.so.12` -> nvidia-cuda-nvrtc-cu12),
    or None when no wheel does (the driver's own libraries, unknown ones)."""
    for stem, name, cuda_major in _WHEELS:
        if lib.startswith(stem + ".") or lib == stem:
            m = re.search(r"\.so\.([0-9]+)", lib)
            cu12 = f"nvidia-{name}-cu12"
            cu13 = f"nvidia-{name}-cu13" if name in _SUFFIXED else f"nvidia-{name}"
            if cuda_major and m and m.group(1) in ("12", "13"):
                return cu12 if m.group(1) == "12" else cu13
            return f"{cu12} or {cu13} (for torch's CUDA 12 or 13)"
    return None


def resolve_library_source(c: Clues) -> Resolution:
    """A CUDA library that cannot be loaded: the remedy depends on where that library comes from."""
    if "Could not find CUDA lib directory" in c.text:  # sgl-kernel's older loader looks for the runtime
        return Resolution("runtime", {"lib": "the CUDA runtime (libcudart)", "wheel": wheel_for("libcudart") or ""})
    m = _LIB_RX.search(c.text)
    lib = m.group(1) if m else "a CUDA library"
    if lib.startswith(_DRIVER_LIBS) or lib == "libcuda":
        extra = (" Triton looks libcuda.so up with `ldconfig -p`: run ldconfig after the driver is installed, or set "
                 "TRITON_LIBCUDA_PATH to its directory in service.env.") if "cannot found" in c.text else ""
        return Resolution("driver", {"lib": lib, "extra": extra})
    if lib.startswith(_TORCH_LIBS):
        return Resolution("torch", {"lib": lib})
    wheel = wheel_for(lib)
    if wheel is not None:
        return Resolution("runtime", {"lib": lib, "wheel": wheel})
    return Resolution("other", {"lib": lib})


RESOLVERS: dict[str, tuple[Resolver, tuple[str, ...], tuple[str, ...]]] = {
    "kv_budget": (resolve_kv_budget, ("raise_to", "does_not_fit"), ("have", "need")),
    "feature_dim": (resolve_feature_dim, ("layer_ids", "capture_missing"), ("why",)),
    "speculative_frame": (resolve_speculative_frame, ("speculative",), ("where", "algorithm", "algorithm_check")),
    "speculative_abort": (resolve_speculative_abort, ("after_speculative_setting",), ("where", "algorithm", "algorithm_check")),
    "plugin_capture": (resolve_plugin_capture, ("capture_missing",), ("algorithm", "algorithm_check")),
    "capture_unsupported": (resolve_capture_unsupported, ("plugin", "model_class"), ("cls", "algorithm", "algorithm_check")),
    "draft_weights": (resolve_draft_weights, ("draft_format", "draft_checkpoint"),
                      ("weight", "loader", "algorithm", "algorithm_check")),
    "draft_shape": (resolve_draft_shape, ("draft_shape",), ("got", "want", "where")),
    "context_limit": (resolve_context_limit, ("target", "draft"), ("want", "limit")),
    "flag_named": (resolve_flag_named, ("named",), ("flag", "key", "value")),
    # `host` is chosen by `diagnose HOST` (live.gpu_visibility), which knows the profile and the host's cards
    "gpu_visibility": (resolve_gpu_visibility, ("cards", "host"), ("given", "tp", "ranks", "host_cards", "fix")),
    "gpu_arch": (resolve_gpu_arch, ("backend", "kernel"), ("arch", "backend")),
    "library_source": (resolve_library_source, ("driver", "runtime", "torch", "other"), ("lib", "wheel", "extra")),
}
