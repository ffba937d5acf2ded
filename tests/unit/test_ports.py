"""tests/ports.py: the ports the stand-in tests give their servers stay out of the kernel's
ephemeral range, where an outgoing connection could take one before the server binds it."""

from __future__ import annotations

import socket

from ports import HIGH, LOW, free_ports


def test_ports_are_free_consecutive_and_below_the_ephemeral_range() -> None:
    base = free_ports(5)
    assert LOW <= base and base + 5 <= HIGH <= 32768
    for p in range(base, base + 5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_skipped() -> None:
    base = free_ports(3)
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        held.bind(("127.0.0.1", base + 1))
        held.listen()
        again = free_ports(3)
        assert not again <= base + 1 < again + 3


def test_calls_before_anything_binds_get_different_ports() -> None:
    # two servers of one test asked for their ports before either started (test_standin_ranks)
    a, b = free_ports(3), free_ports(3)
    assert not set(range(a, a + 3)) & set(range(b, b + 3))
