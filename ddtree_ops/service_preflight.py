"""Preflight across the nodes of a multi-node service: every node's own preflight side by side, then
what needs all of them: every rank's KV pool sized from the least free card anywhere, one SGLang
release on every node, rank 0's rendezvous reachable from every other node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ddtree_ops import remote
from ddtree_ops.host import Host
from ddtree_ops.preflight import FAIL, OK, Check, Preflight, plan_memory, run_preflight
from ddtree_ops.render import Rendered
from ddtree_ops.service_nodes import Service, each


@dataclass
class ServicePreflight:
    nodes: list[Preflight]
    names: list[str]
    service: list[Check] = field(default_factory=list)  # checks across nodes (reported once)

    @property
    def failed(self) -> list[tuple[str, Check]]:
        out = [(self.names[i], c) for i, pf in enumerate(self.nodes) for c in pf.failed]
        return out + [("service", c) for c in self.service if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "service_checks": [c.__dict__ for c in self.service],
                "nodes": [{"node": n, "rank": i, **pf.to_json()} for i, (n, pf) in enumerate(zip(self.names, self.nodes))]}


def preflight_service(hosts: Sequence[Host], svc: Service, mode: str, rendered: Sequence[Rendered],
                      plugin_version: str) -> ServicePreflight:
    """Every node's own preflight side by side, then the checks that need all of them."""
    pfs = each(list(hosts), lambda i, h: run_preflight(h, svc.nodes[i], mode, rendered[i], svc.layout(i),
                                                        plugin_version))
    spf = ServicePreflight(pfs, svc.hosts)
    _memory_across(spf, svc)
    _same_sglang(spf)
    _rendezvous(spf, hosts, svc)
    return spf


def _memory_across(spf: ServicePreflight, svc: Service) -> None:
    """SGLang sizes every rank's pool from the least free memory of ALL ranks (an all-reduce MIN
    over the world group): a node's own plan becomes the plan of the least free card anywhere."""
    rows = [(n, r) for n, pf in zip(spf.names, spf.nodes) for r in pf.cards]
    if not rows or any(pf.shapes is None for pf in spf.nodes):
        return
    node, least = min(rows, key=lambda x: x[1].free_for_service)
    for i, pf in enumerate(spf.nodes):
        plan_memory(pf, svc.nodes[i], least.free_for_service, len(rows))
    # (when it does not fit, every node's own memory check says so)
    spf.service.append(Check("memory", OK,
                             f"every rank sized from the least free card of the service: {node} card {least.index} "
                             f"({least.free_for_service:,} MiB free for it), {len(rows)} cards on "
                             f"{len(spf.nodes)} nodes", {}))


def _same_sglang(spf: ServicePreflight) -> None:
    versions = {n: pf.sglang_version for n, pf in zip(spf.names, spf.nodes) if pf.sglang_version}
    if len(set(versions.values())) > 1:
        listing = ", ".join(f"{n} {v}" for n, v in versions.items())
        spf.service.append(Check("sglang", FAIL, f"the nodes run different SGLang releases ({listing}): every rank "
                                                 "must run the same one", {}))


def _rendezvous(spf: ServicePreflight, hosts: Sequence[Host], svc: Service) -> None:
    """From every other node, a TCP connection to rank 0's --dist-init-addr: refused is fine
    (nothing listens there yet), a timeout is a firewall dropping the port or no route."""
    m = svc.rank0.multinode
    if m is None:
        return

    def probe(i: int, h: Host) -> tuple[str, str]:
        if i == 0:
            return "", ""
        res = h.run(remote.tcp_probe(svc.nodes[i].service.python, m.dist_init_host, m.dist_init_port), timeout=30)
        return (res.stdout.strip().splitlines() or ["error no answer"])[-1], (res.stderr or "").strip()[-200:]

    for i, (said, err) in enumerate(each(list(hosts), probe)):
        if i == 0:
            continue
        target = f"rank 0's rendezvous {m.dist_init_addr}"
        if said in ("open", "refused"):
            spf.nodes[i].add("rendezvous", OK, f"{target} is reachable from {svc.hosts[i]} "
                                               f"({'a server answers' if said == 'open' else 'nothing listens yet'})")
        else:
            why = "timed out after 3 s: a firewall dropping the port, or no route" if said == "timeout" else said or err
            spf.nodes[i].add("rendezvous", FAIL, f"{svc.hosts[i]} cannot reach {target} ({why}); rank {i} would wait "
                                                 "at the store until --dist-timeout and the service would never start")
