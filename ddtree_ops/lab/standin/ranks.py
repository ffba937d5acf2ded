"""ddtree-ops LAB STAND-IN: SGLang's parallel ranks and torch's multi-node rendezvous.

What is real: the TCP rendezvous. Node 0 listens at --dist-init-addr's port on every interface (as
torch's TCPStore server does, started by global rank 0: torch.distributed.rendezvous
`_create_c10d_store`, start_daemon = rank == 0); every other node connects there, retrying until
--dist-timeout, and the store answers once every node has joined. Over the same connections the
nodes take the minimum free memory of every card (SGLang's get_available_gpu_memory(distributed=True),
an all-reduce MIN over the world group) and rank 0 broadcasts the shutdown (SGLang's ShutdownReq).
A connection that closes without that shutdown is a dead peer: the survivors exit when their
collective times out, as NCCL's watchdog makes them (after --dist-timeout), printing torch's lines.

What is simulated: the ranks' work. One process per local card holds that card's memory
(server.py), and the scheduler's log lines carry each rank's prefix as SGLang prints them
(`[2026-12-01 17:46:17 TP1] Load weight begin. ...`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

DEFAULT_DIST_TIMEOUT_S = 600  # torch's default store and collective timeout


@dataclass(frozen=True)
class Topology:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def per_node(self) -> int:
        return max(1, self.world // self.nnodes)

    @property
    def local_ranks(self) -> list[int]:
        first = self.node_rank * self.per_node
        return list(range(first, first + self.per_node))

    def prefix(self, rank: int) -> str:
        """SGLang's scheduler log prefix for a global rank (scheduler.py configure_logger): DP, PP
        and TP parts, each only when that size is above one; empty for a single rank."""
        if self.world == 1:
            return ""
        dp, rest = divmod(rank, self.tp * self.pp)
        pp, tp = divmod(rest, self.tp)
        out = (f" DP{dp}" if self.dp > 1 else "") + (f" PP{pp}" if self.pp > 1 else "")
        return out + (f" TP{tp}" if self.tp > 1 else "")

    @property
    def host_port(self) -> tuple[str, int]:
        addr = self.dist_init_addr or "127.0.0.1:20000"
        host, _, port = addr.rpartition(":")
        return host.strip("[]"), int(port)


def topology(sa: Any) -> Topology:
    timeout = getattr(sa, "dist_timeout", None)
    return Topology(tp=int(getattr(sa, "tp_size", 1) or 1), pp=int(getattr(sa, "pp_size", 1) or 1),
                    dp=int(getattr(sa, "dp_size", 1) or 1), nnodes=int(getattr(sa, "nnodes", 1) or 1),
                    node_rank=int(getattr(sa, "node_rank", 0) or 0),
                    dist_init_addr=getattr(sa, "dist_init_addr", None),
                    dist_timeout_s=float(timeout) if timeout else DEFAULT_DIST_TIMEOUT_S)


class RendezvousError(Exception):
    """torch's own words for a rendezvous that did not complete (the message is the log line)."""


class Rendezvous:
    """One node's side of the store: node 0 serves, the others connect. `join` blocks until every
    node is in (or raises RendezvousError with torch's message) and returns the least free MiB of
    every card of every node. Afterwards `watch` calls `on_lost(node, clean)` once when a peer's
    connection closes: clean is True when rank 0 broadcast the shutdown first."""

    def __init__(self, topo: Topology, log: Callable[[str], None]) -> None:
        self.topo = topo
        self.log = log
        self.peers: list[socket.socket] = []
        self.shutdown_sent = False
        self._lost = False

    def join(self, free_mib: int) -> int:
        return self._serve(free_mib) if self.topo.node_rank == 0 else self._connect(free_mib)

    def _serve(self, free_mib: int) -> int:
        host, port = self.topo.host_port
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("0.0.0.0", port))
        except OSError as exc:
            raise RendezvousError(f"torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                                  f"local network address. port: {port}, useIpv6: 0, code: -98, name: EADDRINUSE, "
                                  f"message: {exc.strerror}") from None
        srv.listen(64)
        deadline = time.monotonic() + self.topo.dist_timeout_s
        frees = [free_mib]
        while len(self.peers) < self.topo.nnodes - 1:
            srv.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                joined = len(self.peers) + 1
                raise RendezvousError(f"torch.distributed.DistStoreError: Timed out after "
                                      f"{int(self.topo.dist_timeout_s) + 1} seconds waiting for clients. "
                                      f"{joined}/{self.topo.nnodes} clients joined.") from None
            conn.settimeout(10)
            try:
                hello = json.loads(conn.makefile("r").readline() or "{}")
            except (OSError, ValueError):
                conn.close()
                continue
            frees.append(int(hello.get("free_mib", 0)))
            conn.settimeout(None)  # from here on a quiet peer is a live one: only a close means it is gone
            self.peers.append(conn)
        srv.close()
        least = min(frees)
        for conn in self.peers:
            conn.sendall((json.dumps({"min_free_mib": least}) + "\n").encode())
        return least

    def _connect(self, free_mib: int) -> int:
        host, port = self.topo.host_port
        deadline = time.monotonic() + self.topo.dist_timeout_s
        warned = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RendezvousError(f"torch.distributed.DistNetworkError: The client socket has timed out after "
                                      f"{int(self.topo.dist_timeout_s * 1000)}ms while trying to connect to "
                                      f"({host}, {port}).")
            try:
                conn = socket.create_connection((host, port), timeout=min(left, 5.0))
                break
            except OSError as exc:
                if not warned:  # torch's client warns and retries (the catalogue's benign c10d line)
                    self.log(f"[W socket.cpp:755] [c10d] The client socket has failed to connect to "
                             f"[{host}]:{port} (errno: {exc.errno or 110} - {exc.strerror or 'Connection timed out'}).")
                    warned = True
                time.sleep(min(1.0, max(left, 0)))
        conn.sendall((json.dumps({"node_rank": self.topo.node_rank, "free_mib": free_mib}) + "\n").encode())
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            answer = json.loads(conn.makefile("r").readline() or "{}")
        except (OSError, ValueError):
            answer = {}
        if "min_free_mib" not in answer:
            raise RendezvousError(f"torch.distributed.DistStoreError: Timed out after {int(self.topo.dist_timeout_s) + 1} "
                                  "seconds waiting for clients. (the store at rank 0 closed before every node joined)")
        conn.settimeout(None)
        self.peers = [conn]
        return int(answer["min_free_mib"])

    def broadcast_shutdown(self) -> None:
        """Rank 0's ShutdownReq to every other node (they leave cleanly)."""
        self.shutdown_sent = True
        for conn in self.peers:
            try:
                conn.sendall(b'{"shutdown": true}\n')
            except OSError:
                pass

    def watch(self, on_lost: Callable[[int, bool], None]) -> None:
        for i, conn in enumerate(self.peers):
            node = i + 1 if self.topo.node_rank == 0 else 0
            threading.Thread(target=self._watch_one, args=(conn, node, on_lost), daemon=True).start()

    def _watch_one(self, conn: socket.socket, node: int, on_lost: Callable[[int, bool], None]) -> None:
        clean = False
        try:
            for line in conn.makefile("r"):
                if '"shutdown"' in line:
                    clean = True
                    break
        except OSError:
            pass
        if not self._lost and not self.shutdown_sent:
            self._lost = True
            on_lost(node, clean)


def watchdog_lines(topo: Topology, rank: int, seq: int = 112) -> list[str]:
    """What torch's NCCL watchdog prints on a rank whose collective waited for a dead peer past the
    timeout (ProcessGroupNCCL.cpp), then the abort that takes the process down."""
    ms = int(topo.dist_timeout_s * 1000)
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    work = (f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={ms})")
    return [f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: {work} ran for {ms + 13} milliseconds before timing out.",
            f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
            f"Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: "
            f"{seq}, last completed NCCL work: {seq - 1}."]
