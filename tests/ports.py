"""Local TCP ports for the servers a test starts, below Linux's ephemeral range (32768-60999).

A port in that range can be taken between the check and the server's bind by any outgoing
connection's local end, the test's own HTTP polls included: the realsglang stand-in runs lost a
server to "address already in use" that way, 2 runs in 4 on a loaded 2-core box. Below the range
only another listener can take it. The search starts at a place that depends on the process, so
two workers of one session (or two sessions) do not probe the same ports first, and goes on after
the last ports it gave, so calls before any server binds get different ports."""

from __future__ import annotations

import os
import socket

LOW, HIGH = 20000, 32768  # below the kernel's default ip_local_port_range
_next = [(os.getpid() * 97) % (HIGH - LOW)]  # where this process's next search starts, from LOW


def free_ports(n: int = 1) -> int:
    """The first of `n` consecutive ports that were all free just now."""
    span = HIGH - LOW - n
    for k in range(0, span, max(n, 1)):
        base = LOW + (_next[0] + k) % span
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            _next[0] = base + n - LOW
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in {LOW}-{HIGH}")


def free_port() -> int:
    return free_ports(1)
