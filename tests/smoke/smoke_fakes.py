"""Fakes for the smoke checks: a Host that answers like a healthy SGLang host unless told otherwise.

(A module of its own, not conftest.py, so test files can import the builders by name.)"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ddtree_ops.host import HttpResponse, Result

UNIT_HEADER = "# ddtree-ops release=nextn-0123456789ab profile_sha256=abcd mode=nextn host={host}\n[Unit]\n"


def show(active: str = "active", sub: str = "running", result: str = "success", restarts: int = 0,
         pid: int = 4242, load: str = "loaded") -> str:
    return (f"ActiveState={active}\nSubState={sub}\nResult={result}\nExecMainStatus=0\nMainPID={pid}\n"
            f"NRestarts={restarts}\nInvocationID=abc\nLoadState={load}\nUnitFileState=enabled\n"
            "FragmentPath=/etc/systemd/system/sglang.service\nDropInPaths=\n")


def generate_body(text: str = " Paris. It is the largest city in France.", accept: float | None = 2.67,
                  meta: dict[str, Any] | None = None) -> bytes:
    m: dict[str, Any] = {"id": "x", "finish_reason": {"type": "length", "length": 16}, "prompt_tokens": 5,
                         "completion_tokens": 16, "e2e_latency": 0.3}
    if accept is not None:
        m.update({"spec_verify_ct": round(16 / accept), "spec_accept_length": accept})
    m.update(meta or {})
    return json.dumps({"text": text, "meta_info": m}).encode()


def server_info(algorithm: str | None = "EAGLE", avg: float | None = 2.5) -> bytes:
    return json.dumps({"speculative_algorithm": algorithm, "version": "0.5.23",
                       "internal_states": [{"last_gen_throughput": 40.0, "avg_spec_accept_length": avg}]}).encode()


def metrics(accept: float | None = 2.4) -> bytes:
    lines = ["# TYPE sglang:num_running_reqs gauge", 'sglang:num_running_reqs{model_name="q"} 0.0']
    if accept is not None:
        lines.append(f'sglang:spec_accept_length{{dp_rank="0",model_name="q",tp_rank="0"}} {accept}')
    return ("\n".join(lines) + "\n").encode()


Answer = HttpResponse | Exception | Callable[[], HttpResponse]


@dataclass
class FakeHost:
    """Canned observations. `routes` maps "GET /path" to a response, an exception to raise, or a
    callable; `calls` records what was asked, so tests can see that nothing was changed."""

    name: str = "ct129"
    systemctl: str = field(default_factory=show)
    unit_text: str | None = None
    routes: dict[str, Answer] = field(default_factory=dict)
    delay_s: float = 0.0
    calls: list[str] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        if self.unit_text is None:
            self.unit_text = UNIT_HEADER.format(host=self.name)
        defaults: dict[str, Answer] = {
            "GET /health_generate": ok(b"", 0.05), "POST /generate": ok(generate_body(), 0.41),
            "GET /server_info": ok(server_info()), "GET /metrics": ok(metrics()),
        }
        self.routes = {**defaults, **self.routes}

    def run(self, argv: Any, *, stdin: bytes | None = None, timeout: float = 60.0, sudo: bool = False) -> Result:
        argv = list(argv)
        self.calls.append("run " + " ".join(argv))
        if argv[:2] == ["systemctl", "show"]:
            return Result(tuple(argv), 0, self.systemctl, "")
        return Result(tuple(argv), 1, "", "not faked")

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        raise AssertionError(f"smoke must not write to the host ({path})")

    def get(self, path: str) -> bytes | None:
        self.calls.append(f"get {path}")
        return self.unit_text.encode() if self.unit_text is not None else None

    def http(self, method: str, port: int, path: str, *, body: Any = None, timeout: float = 10.0,
             host: str = "127.0.0.1") -> HttpResponse:
        key = f"{method} {path}"
        self.calls.append(key)
        if self.delay_s:
            time.sleep(self.delay_s)
        answer = self.routes.get(key, HttpResponse(404, b"not found", 0.001))
        if isinstance(answer, Exception):
            raise answer
        return answer() if callable(answer) else answer

    def close(self) -> None:
        self.closed = True


def ok(body: bytes, elapsed: float = 0.02, status: int = 200) -> HttpResponse:
    return HttpResponse(status, body, elapsed)


def connector(hosts: dict[str, FakeHost | Exception]) -> Callable[[Any], Any]:
    """A `connect(profile)` for smoke.check_hosts that hands out the fakes by host name."""

    @contextlib.contextmanager
    def connect(p: Any) -> Iterator[FakeHost]:
        fake = hosts[p.name]
        if isinstance(fake, Exception):
            raise fake
        try:
            yield fake
        finally:
            fake.close()

    return connect
