"""What a log says about the start being read, and the resolvers that name a cause from it.

`LaunchContext` is filled as lines arrive (speculative algorithm and load format from SGLang's
`server_args`, whether DFlash-family hidden capture was configured, whether a stop was requested).

A resolver reads the context, the matched line and the frames that raised it, and picks one of
the rule's *variants* (named in `catalogue.yaml`, where every remedy's text lives) together with
the facts its text is filled with (`{need}`, `{where}`, ...). Resolvers hold no prose: what an
operator reads is in the catalogue, like every other remedy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops.diagnose import journal


@dataclass
class LaunchContext:
    """Facts about the start being read, from the lines seen so far."""

    algorithm: str | None = None  # --speculative-algorithm
    load_format: str | None = None  # --load-format (dummy = random weights)
    capture: bool | None = None  # DFlash-family hidden capture configured (True), said not to be (False)
    plugin_seen: bool = False  # the ddtree plugin's worker printed its settings
    stop_line: int | None = None  # a stop was requested here (systemd's stop, SIGTERM); None after a new start

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.algorithm:
            out["speculative_algorithm"] = self.algorithm
        if self.load_format:
            out["load_format"] = self.load_format
        if self.capture is not None:
            out["hidden_capture_configured"] = self.capture
        if self.stop_line is not None:
            out["stop_requested_line"] = self.stop_line
        return out


_ALGO_RX = (re.compile(r"speculative_algorithm='([A-Za-z0-9_]+)'"), re.compile(r"--speculative-algorithm[= ]+([A-Za-z0-9_]+)"))
_LOADFMT_RX = (re.compile(r"load_format='([A-Za-z0-9_]+)'"), re.compile(r"--load-format[= ]+([A-Za-z0-9_]+)"))


def note_launch(ctx: LaunchContext, text: str) -> None:
    """SGLang's `server_args=ServerArgs(...)` (or a command line): the algorithm and load format."""
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
    ctx.stop_line = None


# ------------------------------------------------------------------ resolvers


@dataclass(frozen=True)
class Clues:
    """What a resolver may read: the context, the matched line, the frames of its traceback part,
    and whether the lines just before it mention a speculative setting (only computed when asked)."""

    ctx: LaunchContext
    text: str
    frames: list[journal.Frame] = field(default_factory=list)
    in_traceback: bool = False
    spec_setting_before: Callable[[], bool] = lambda: False


@dataclass(frozen=True)
class Resolution:
    variant: str  # a variant of the rule, defined in catalogue.yaml
    facts: dict[str, str] = field(default_factory=dict)  # fills the variant's {placeholders}


# SGLang's own DFlash setup (built in); a plugin algorithm is DFlash-family only when it says so
_BUILTIN_DFLASH = ("DFLASH",)
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
    algo = (ctx.algorithm or "").upper()
    if not partial and ctx.capture is False:
        return Resolution("capture_missing", {"why": "a line of this start says the algorithm was registered "
                                                     "without DFlash-family capture"})
    if not partial and algo and algo not in _BUILTIN_DFLASH and not ctx.capture and not ctx.plugin_seen:
        return Resolution("capture_missing", {"why": f"{algo} is a plugin algorithm and nothing in this start "
                                                     "shows DFlash-family capture configured"})
    return Resolution("layer_ids")


_SPEC_WORDS = ("speculative", "spec_decode", "eagle", "nextn", "mtp", "dflash", "medusa", "draft", "ngram")


def speculative_facts(c: Clues) -> dict[str, str]:
    """Where in speculative code it was raised, and which algorithm this start used."""
    where = next((f for f in reversed(c.frames) if any(k in (f.path + " " + f.func).lower() for k in _SPEC_WORDS)), None)
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
RESOLVERS: dict[str, tuple[Resolver, tuple[str, ...], tuple[str, ...]]] = {
    "kv_budget": (resolve_kv_budget, ("raise_to", "does_not_fit"), ("have", "need")),
    "feature_dim": (resolve_feature_dim, ("layer_ids", "capture_missing"), ("why",)),
    "speculative_frame": (resolve_speculative_frame, ("speculative",), ("where", "algorithm", "algorithm_check")),
    "speculative_abort": (resolve_speculative_abort, ("after_speculative_setting",), ("where", "algorithm", "algorithm_check")),
}
