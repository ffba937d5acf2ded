"""The node_exporter textfile: gauges in a prometheus_client registry, written with
`write_to_textfile` (a temp file beside the target, renamed over it: readers see the old file or
the new one, and the temp name does not end in `.prom`, so node_exporter never reads half a file).

One file can serve several timers: the series of hosts this run did not check are read back from
the existing file (with prometheus_client's own parser) and kept, and so is the last success time
of a host that failed now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ddtree_ops.errors import OpsError
from ddtree_ops.smoke.judge import HostResult


_METRICS = {
    "ddtree_smoke_success": "1 when the host served the smoke request with nothing critical (OK or WARNING), else 0.",
    "ddtree_smoke_state": "Nagios state of the last smoke check: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.",
    "ddtree_smoke_latency_seconds": "Wall time of the smoke /generate request.",
    "ddtree_smoke_accept_length": "Speculative acceptance length of the smoke request (tokens per verify step).",
    "ddtree_smoke_unit_restarts": "systemd NRestarts of the SGLang unit.",
    "ddtree_smoke_duration_seconds": "Wall time of the whole check of the host.",
    "ddtree_smoke_last_run_timestamp_seconds": "When the host was last checked.",
    "ddtree_smoke_last_success_timestamp_seconds": "When the host last passed (kept from the previous file on failure).",
}
_LABELS = ("host", "mode")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def read_prom(text: str) -> list[Sample]:
    """Our own samples back from a textfile (prometheus_client's parser; other metrics ignored)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in _METRICS:
                out.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return out


def _samples(results: Sequence[HostResult], previous: Sequence[Sample], now: float) -> list[Sample]:
    """This run's samples, plus every sample of hosts this run did not check, plus the last
    success time of hosts that failed now."""
    checked = {r.host for r in results}
    samples = [s for s in previous if s.label("host") not in checked]
    for r in results:
        old_mode = next((s.label("mode") for s in previous if s.label("host") == r.host), None)
        labels = (("host", r.host), ("mode", r.mode or old_mode or "unknown"))
        values: dict[str, float | None] = {
            "ddtree_smoke_success": 1.0 if r.served else 0.0,
            "ddtree_smoke_state": float(int(r.state)),
            "ddtree_smoke_latency_seconds": r.value("latency"),
            "ddtree_smoke_accept_length": r.value("accept_len"),
            "ddtree_smoke_unit_restarts": r.value("restarts"),
            "ddtree_smoke_duration_seconds": r.observation.duration_s,
            "ddtree_smoke_last_run_timestamp_seconds": now,
        }
        if r.served:
            values["ddtree_smoke_last_success_timestamp_seconds"] = now
        else:
            kept = [s.value for s in previous if s.name == "ddtree_smoke_last_success_timestamp_seconds"
                    and s.label("host") == r.host]
            values["ddtree_smoke_last_success_timestamp_seconds"] = max(kept) if kept else None
        samples += [Sample(name, labels, v) for name, v in values.items() if v is not None]
    return samples


def registry(results: Sequence[HostResult], previous: Sequence[Sample], now: float) -> object:
    """A prometheus_client registry holding one gauge per metric, its series sorted by labels."""
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry(auto_describe=True)
    samples = _samples(results, previous, now)
    for name, help_text in _METRICS.items():
        mine = sorted((s for s in samples if s.name == name), key=lambda s: s.labels)
        if not mine:
            continue
        gauge = Gauge(name, help_text, labelnames=_LABELS, registry=reg)
        for s in mine:
            gauge.labels(**{k: s.label(k) or "" for k in _LABELS}).set(s.value)
    return reg


def render_prom(results: Sequence[HostResult], previous: Sequence[Sample], now: float) -> str:
    """The exposition text the textfile gets (what `write_prom` writes)."""
    from prometheus_client import generate_latest

    return generate_latest(registry(results, previous, now)).decode("utf-8")  # type: ignore[arg-type]


def write_prom(path: Path, results: Sequence[HostResult], now: float) -> None:
    from prometheus_client import write_to_textfile

    try:
        previous = read_prom(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        previous = []
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OpsError(f"cannot read the existing textfile {path}: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry(results, previous, now))  # type: ignore[arg-type]
    # node_exporter runs as its own user; a timer's UMask= must not make the file unreadable to it
    os.chmod(path, 0o644)
