"""Observing one host: the only part of a smoke check that talks to a host, and it only reads
(systemctl show, the unit file's header, /health_generate, one /generate, /server_info, /metrics)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ddtree_ops import observe
from ddtree_ops.errors import OpsError
from ddtree_ops.host import Host, HostError, HttpUnavailable
from ddtree_ops.observe import UnitState
from ddtree_ops.smoke.parse import (ALGORITHM_MODES, Generation, ShadowMetrics, parse_generate, parse_metrics_accept,
                                    parse_metrics_shadow, parse_server_info, parse_unit_header)
from ddtree_ops.treestats import Counters, parse_metrics

if TYPE_CHECKING:
    from ddtree_ops.profile import Profile


@dataclass(frozen=True)
class HttpProbe:
    """One HTTP exchange: a status and a body, or the reason nothing usable came back."""

    status: int | None = None
    elapsed_s: float = 0.0
    error: str = ""
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


@dataclass(frozen=True)
class Golden:
    """The completion a check compares with: pinned in the profile (a prefix) or recorded (exact)."""

    text: str
    source: str  # "profile" or the recording it came from ("nextn on 2026-01-02T03:04:05Z")
    exact: bool
    stale: str = ""  # why a recording no longer applies (prompt, max tokens or model changed)


@dataclass(frozen=True)
class Previous:
    """What the last check of this host saw, from the state file."""

    restarts: int
    main_pid: int = 0
    invocation: str = ""
    checked_at: float = 0.0
    counters: Counters | None = None  # the ddtree plugin's counters at the last check (the window's start)


@dataclass(frozen=True)
class Observation:
    host: str
    unit_name: str = ""
    mode: str | None = None  # from the installed unit's ddtree-ops header, else /server_info
    release: str | None = None
    connect_error: str = ""  # set: nothing else was observed
    profile_error: str = ""
    unit: UnitState | None = None
    unit_error: str = ""
    health: HttpProbe | None = None
    generate: HttpProbe | None = None
    generation: Generation | None = None
    algorithm: str | None = None  # speculative_algorithm from /server_info ("" = reported as none)
    server_accept_len: float | None = None  # /server_info internal_states avg_spec_accept_length
    metrics_accept_len: float | None = None  # /metrics sglang:spec_accept_length
    shadow: ShadowMetrics | None = None  # /metrics ddtree_shadow_* (the ddtree plugin's gauges)
    counters: Counters | None = None  # /metrics ddtree_*_total (the ddtree plugin's counters, treestats)
    previous: Previous | None = None
    golden: Golden | None = None
    duration_s: float = 0.0  # the whole check, SSH connection included


def observe_host(host: Host, p: Profile, *, previous: Previous | None = None,
                 golden: Golden | None = None) -> Observation:
    """Read-only: every call below asks; nothing restarts, writes or flushes anything.

    A failed probe becomes part of the observation (a verdict's input); only a lost SSH
    connection escapes, and the caller turns it into UNKNOWN.
    """
    port, unit_name = p.service.port, p.service.unit
    obs = Observation(host=p.name, unit_name=unit_name, previous=previous, golden=golden)
    try:
        unit = observe.unit_state(host, unit_name)
        obs = replace(obs, unit=unit) if unit.load != "unknown" else replace(obs, unit_error="systemctl show said nothing")
    except HostError:
        raise
    except (OpsError, OSError) as exc:  # e.g. the command timed out: this check could not run
        obs = replace(obs, unit_error=str(exc))
    if obs.unit is not None and obs.unit.fragment:
        with contextlib.suppress(OpsError, OSError):
            head = host.get(obs.unit.fragment)
            mode, release = parse_unit_header(head.decode("utf-8", "replace")) if head else (None, None)
            obs = replace(obs, mode=mode, release=release)

    health = _probe(host, "GET", port, "/health_generate", timeout=p.gate.http_timeout_s)
    obs = replace(obs, health=health)
    if not health.ok:  # a hung or dead server would only make every further probe wait out its timeout
        return obs

    body = {"text": p.smoke.prompt, "sampling_params": {"temperature": 0, "max_new_tokens": p.smoke.max_new_tokens}}
    # past the critical budget the answer is CRITICAL whatever it says; one more second tells how late
    gen_probe = _probe(host, "POST", port, "/generate", body=body, timeout=p.smoke.latency_critical_s + 1.0)
    obs = replace(obs, generate=gen_probe, generation=parse_generate(gen_probe.body) if gen_probe.ok else None)

    info = _probe(host, "GET", port, "/server_info", timeout=5.0)
    if info.status == 404:  # SGLang before /server_info
        info = _probe(host, "GET", port, "/get_server_info", timeout=5.0)
    algorithm, server_accept = parse_server_info(info.body) if info.ok else (None, None)
    metrics = _probe(host, "GET", port, "/metrics", timeout=5.0)
    text = metrics.body.decode("utf-8", "replace") if metrics.ok else ""
    metrics_accept = parse_metrics_accept(text) if metrics.ok else None
    shadow = parse_metrics_shadow(text) if metrics.ok else None
    counters = parse_metrics(text) if metrics.ok else None
    mode = obs.mode or (ALGORITHM_MODES.get(algorithm or "") if algorithm else None)
    return replace(obs, mode=mode, algorithm=algorithm, server_accept_len=server_accept,
                   metrics_accept_len=metrics_accept, shadow=shadow, counters=counters)


def _probe(host: Host, method: str, port: int, path: str, *, body: Any = None, timeout: float) -> HttpProbe:
    t0 = time.monotonic()
    try:
        resp = host.http(method, port, path, body=body, timeout=timeout)
    except HttpUnavailable as exc:
        return HttpProbe(error=str(exc), elapsed_s=time.monotonic() - t0)
    return HttpProbe(resp.status, resp.elapsed_s, body=resp.body)
