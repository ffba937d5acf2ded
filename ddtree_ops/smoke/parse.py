"""Parsing what the server answered: /generate, /server_info, /metrics, the installed unit's header.

Pure functions from bytes to values; nothing here talks to a host or decides a state.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping


# SGLang's --speculative-algorithm as /server_info reports it -> our mode names (NEXTN resolves to EAGLE)
ALGORITHM_MODES = {"NEXTN": "nextn", "EAGLE": "nextn", "EAGLE3": "nextn", "DFLASH": "dflash",
                   "DDTREE": "ddtree-shadow"}
# meta_info spellings across SGLang versions (facts/sglang-ddtree.md 3.5)
_ACCEPT_LEN_KEYS = ("spec_accept_length", "spec_accept_len")
_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")


@dataclass(frozen=True)
class Generation:
    """What the smoke /generate answered, parsed (see `parse_generate`)."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    verify_ct: int | None = None
    accept_len: float | None = None
    spec_reported: bool = False  # any spec_* field in meta_info
    e2e_latency_s: float | None = None
    problem: str = ""  # a response that is not a usable completion


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _acceptance(value: Any) -> float | None:
    """An acceptance length, or None: below 1 is impossible (the bonus token alone is 1), so a 0
    there is a gauge with nothing measured yet (an idle server), not a collapse."""
    x = _number(value)
    return x if x is not None and x >= 1.0 else None


def accept_length(meta: Mapping[str, Any]) -> float | None:
    """Acceptance length (tokens per verify step, bonus included) from /generate meta_info.

    Newer SGLang reports it directly; otherwise it is completion_tokens / spec_verify_ct, or
    1 + accepted drafts / verify steps where only the draft counters are there.
    """
    for key in _ACCEPT_LEN_KEYS:
        if (x := _acceptance(meta.get(key))) is not None:
            return x
    verify = _number(meta.get("spec_verify_ct"))
    if not verify:
        return None
    if (completion := _number(meta.get("completion_tokens"))) is not None:
        return _acceptance(completion / verify)
    for key in _ACCEPTED_KEYS:
        if (accepted := _number(meta.get(key))) is not None:
            return _acceptance(1.0 + accepted / verify)
    return None


def parse_generate(body: bytes) -> Generation:
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return Generation(problem=f"answered 200 with a non-JSON body: {body[:80]!r}")
    if isinstance(doc, list) and doc:  # a batched answer; we sent one prompt
        doc = doc[0]
    if not isinstance(doc, dict):
        return Generation(problem="answered 200 with JSON that is not an object")
    meta = doc.get("meta_info") if isinstance(doc.get("meta_info"), dict) else {}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):  # SGLang: {"type": "length", "length": 16}
        finish = finish.get("type")
    completion = _number(meta.get("completion_tokens"))
    verify = _number(meta.get("spec_verify_ct"))
    text = doc.get("text")
    return Generation(
        text=text if isinstance(text, str) else "",
        finish_reason=str(finish) if finish is not None else None,
        completion_tokens=int(completion) if completion is not None else None,
        verify_ct=int(verify) if verify is not None else None,
        accept_len=accept_length(meta),
        spec_reported=any(str(k).startswith("spec_") for k in meta),
        e2e_latency_s=_number(meta.get("e2e_latency")),
        problem="" if isinstance(text, str) else "answered without a text field",
    )


def parse_server_info(body: bytes) -> tuple[str | None, float | None]:
    """(speculative algorithm, mean recent acceptance length over the scheduler ranks)."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    algo = doc.get("speculative_algorithm")
    algorithm = None if "speculative_algorithm" not in doc else (
        "" if algo in (None, "", "NONE", "None") else str(algo).upper())
    values = [x for s in doc.get("internal_states") or [] if isinstance(s, dict)
              if (x := _acceptance(s.get("avg_spec_accept_length"))) is not None]
    return algorithm, (sum(values) / len(values) if values else None)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class ShadowMetrics:
    """The ddtree plugin's gauges on /metrics (`ddtree_ops.engine.sglang_metrics`); its counters are
    read by `treestats.parse_metrics`, which smoke prefers where a plugin exports them."""

    rounds: float | None = None        # ddtree_shadow_rounds: verify rounds accounted
    tau_chain: float | None = None
    tau_tree_lower: float | None = None
    silent: str | None = None          # the reason of ddtree_shadow_silent{reason} == 1, if set

    @property
    def present(self) -> bool:
        return self.rounds is not None or self.silent is not None


_REASON = re.compile(r'reason="((?:[^"\\]|\\.)*)"')


def parse_metrics_shadow(text: str) -> ShadowMetrics:
    values: dict[str, float] = {}
    silent = None
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith("ddtree_shadow_"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1).removeprefix("ddtree_shadow_")
        if name == "silent":
            r = _REASON.search(m.group(2) or "")
            if value >= 1 and r:
                silent = r.group(1).replace('\\"', '"')
        elif not m.group(2):
            values[name] = value
    return ShadowMetrics(values.get("rounds"), values.get("tau_chain"), values.get("tau_tree_lower"), silent)


def parse_metrics_accept(text: str) -> float | None:
    """Mean of the `sglang:spec_accept_length` gauge over its series (one per rank)."""
    values = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == "sglang:spec_accept_length" and (x := _acceptance(m.group(3))) is not None:
            values.append(x)
    return sum(values) / len(values) if values else None


def parse_unit_header(text: str) -> tuple[str | None, str | None]:
    """(mode, release) from the first comment that render.py writes into every unit it installs."""
    for line in text.splitlines()[:5]:
        if line.startswith("# ddtree-ops") and "mode=" in line:
            fields = dict(w.split("=", 1) for w in line[1:].split() if "=" in w)
            return fields.get("mode"), fields.get("release")
    return None, None
