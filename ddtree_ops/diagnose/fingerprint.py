"""A failure nobody has named, described well enough to act on (issue 31).

When no rule names a crash (`unclassified_crash`: an exception no rule knows, a process that died at
the end of the log, a Rust panic), its description is:
- the component that raised it: the message's own words where they name a layer (the CUDA runtime's
  error strings, NCCL, a C++ terminate), else the innermost raising frame that belongs to a known
  component (SGLang's scheduler, model loader, speculative worker, attention backend, CUDA graph
  runner; FlashInfer's or Triton's JIT; torch.distributed), else the logger's own prefix (glog's
  `ProcessGroupNCCL.cpp:607]`, `NCCL WARN`, SGLang's `TP0` record);
- the exception's class and message;
- the component's remedy: the profile key to try and what to check where the component has one
  (attention backend, CUDA graphs, the draft, the parallel settings, NCCL's environment), otherwise
  where to look.

`Description.key` (component, class, message with its numbers, addresses and paths taken out) is the
fingerprint `diagnose GROUP` groups hosts by: hosts that fail the same unnamed way are one line.
The components and every word of their remedies live in the catalogue (`components:`). Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddtree_ops.diagnose import journal


@dataclass(frozen=True)
class Component:
    """One part of the stack a crash can come from (the catalogue's `components:`, in priority order)."""

    id: str
    name: str
    text: tuple[str, ...] = ()  # words of the message that name this layer
    paths: tuple[str, ...] = ()  # a raising frame's path (or function) holding one of these
    logger: tuple[str, ...] = ()  # regexes over the raw line: the logger's own prefix
    remedy: str = ""
    profile_key: str | None = None


UNKNOWN = Component("unknown", "unknown",
                    remedy="Read the lines just above this one: the first error there is the cause; search the "
                           "signature in the engine's issue tracker.")

# a (dotted, possibly C++-scoped) exception class, an optional "(Inner)", then ':' or the end
_EXC = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.:]{0,200}(?:Error|Exception|Exit|Interrupt|Fault|Failure|Warning)"
                  r"(?:\([A-Za-z0-9_.]{1,200}\))?)(?::\s?(.*))?$")
_THROW = re.compile(r"terminate called after throwing an instance of '([^']{1,200})'")
_WHAT = re.compile(r"what\(\):\s*(.*)$")
_NUM = re.compile(r"0x[0-9a-fA-F]+|[0-9]+")
_PATH = re.compile(r"(?:/[^/\s'\"]+){2,}/")
MESSAGE_CHARS = 300


@dataclass(frozen=True)
class Description:
    component: Component
    named_by: str  # what named the component: "the message", "frame F", "the logger prefix 'P'"
    exception: str  # the class ("KeyError", "c10::DistBackendError"), "" when the line is not an exception
    message: str

    @property
    def key(self) -> str:
        """The fingerprint: hosts whose failures share it fail the same unnamed way."""
        shape = _PATH.sub("", _NUM.sub("N", self.message.strip()))[:160]
        return f"{self.component.id}|{self.exception}|{shape}"

    def head(self) -> str:
        """'SGLang's scheduler: KeyError: ...' (one line for people and for the group table)."""
        exc = f"{self.exception}: {self.message}" if self.exception else self.message
        return f"{self.component.name}: {exc.strip()[:200]}"

    def to_json(self) -> dict[str, str]:
        return {"component": self.component.id, "component_name": self.component.name, "named_by": self.named_by,
                "exception": self.exception, "message": self.message, "key": self.key}


def split_exception(text: str) -> tuple[str, str]:
    """(class, message) of an exception line; ("", the line) when it is not one."""
    t = text.strip()
    m = _THROW.search(t)
    if m:
        what = _WHAT.search(t)
        return m.group(1), (what.group(1) if what else "")
    m = _EXC.match(t)
    if m:
        return m.group(1), (m.group(2) or "").strip()[:MESSAGE_CHARS]
    return "", t[:MESSAGE_CHARS]


def describe(text: str, frames: list[journal.Frame], raw: str, components: tuple[Component, ...]) -> Description:
    """The component, exception and message of an unnamed failure: its line's text (cleaned), the
    frames of its traceback part (outermost first), the raw line as the log had it."""
    exception, message = split_exception(text)
    for c in components:
        if any(w in text for w in c.text):
            return Description(c, "the message", exception, message)
    for f in reversed(frames):  # the innermost frame that belongs to a component
        where = f"{f.path} {f.func}"
        for c in components:
            if any(p in where for p in c.paths):
                return Description(c, f"frame {f.short()}", exception, message)
    for c in components:
        for rx in c.logger:
            m = re.search(rx, raw)
            if m:
                return Description(c, f"the logger prefix '{m.group(0).strip()[:60]}'", exception, message)
    return Description(UNKNOWN, "no frame, word of the message or logger prefix it knows", exception, message)
