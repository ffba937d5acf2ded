"""`lab load`'s clients (ddtree_ops/lab/standin/load.py) against a local HTTP server: they send like
traffic behind a health-checking load balancer, so a service that says 503 on /health (SGLang from its
SIGTERM on) gets no new request, and one that serves again gets them again."""

from __future__ import annotations

import http.server
import threading
import time
from typing import Iterator

import pytest

from ddtree_ops.lab.standin import load


class Service(http.server.ThreadingHTTPServer):
    """/health answers 503 while `draining` is set; every /generate is logged with the state it met."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.draining = threading.Event()
        self.generates: list[bool] = []     # per /generate: whether the service was draining

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class Handler(http.server.BaseHTTPRequestHandler):
    server: Service

    def do_GET(self) -> None:
        self.send_response(503 if self.server.draining.is_set() else 200)
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.generates.append(self.server.draining.is_set())
        time.sleep(0.05)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[Service]:
    srv = Service()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_no_request_reaches_a_service_whose_health_says_it_is_draining(service: Service,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def drain() -> None:
        time.sleep(1.0)
        service.draining.set()
        time.sleep(1.5)
        service.draining.clear()

    threading.Thread(target=drain, daemon=True).start()
    assert load.main([str(service.port), "4", "2", "1", "8"]) == 0
    # a request already on its way when the drain began may land in the balancer's first poll interval
    landed_draining = sum(service.generates)
    assert landed_draining <= 2, service.generates
    assert service.generates[:5] == [False] * 5 and service.generates[-5:] == [False] * 5   # before and after
    assert "0 failed" in capsys.readouterr().out
