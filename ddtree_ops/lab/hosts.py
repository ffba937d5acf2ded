"""The lab's host list: which hosts a lab of N has, their GPU classes and addresses, and the Ansible
inventory that names them. Pure data, below both the machine that boots them (`machine.py`) and the
payload that gives each its /etc/hosts (`payload.py`).
"""

from __future__ import annotations

import re
from typing import Sequence

from ddtree_ops.lab._sys import LabError

HOSTS = ("ct129", "ct200")
# the two GPU classes of the lab: group name -> first host number (ct129: RTX A6000, ct200: RTX PRO 6000)
CLASSES = {"a6000": 129, "pro6000": 200}
MAX_HOSTS = 64
SUBNET = "10.200.0"


# lab hosts with two (simulated) cards, for tensor-parallel services: the extra RTX PRO 6000 hosts
# (ct201, ct202, ...) are also in group pro6000x2 (profiles/groups/pro6000x2.yaml: gpu.count 2);
# ct200 stays the one-card host of the story
TWO_CARD_GROUP = "pro6000x2"


def two_card(host: str) -> bool:
    return class_of(host) == "pro6000" and host != "ct200"


def lab_hosts(count: int) -> list[str]:
    """ct129 and ct200, then more of each class in turn: ct130, ct201, ct131, ct202, ... (each extra
    host costs about 280 MiB; the address comes from the number, as for the first two)."""
    if not 1 <= count <= MAX_HOSTS:
        raise LabError(f"--hosts {count}: the lab has 1 to {MAX_HOSTS} hosts")
    out: list[str] = []
    i = 0
    while len(out) < count:
        for first in CLASSES.values():
            if len(out) < count:
                out.append(f"ct{first + i}")
        i += 1
    return out


def class_of(host: str) -> str:
    n = int(re.sub(r"\D", "", host) or 0)
    return "pro6000" if n >= CLASSES["pro6000"] else "a6000"


def inventory_text(hosts: Sequence[str], command: str) -> str:
    """The lab's Ansible inventory (YAML): group `lab` (every host, the classes in turn) with the
    children `a6000` and `pro6000`, whose settings come from profiles/groups/<class>.yaml, and
    `pro6000x2`: the two-card hosts among the RTX PRO 6000 ones."""
    lines = [f"# ddtree-ops lab: written by `{command}` (an Ansible YAML inventory: ansible-inventory reads it too)",
             "# groups: lab (every host), a6000 (RTX A6000, sm_86), pro6000 (RTX PRO 6000 Blackwell, sm_120)",
             "all:", "  children:", "    lab:", "      hosts:"]
    lines += [f"        {h}:" for h in hosts]
    lines += ["      children:"]
    for name in CLASSES:
        members = [h for h in hosts if class_of(h) == name]
        lines += [f"        {name}:", "          hosts:" if members else "          hosts: {}"]
        lines += [f"            {h}:" for h in members]
    two = [h for h in hosts if two_card(h)]
    lines += [f"        {TWO_CARD_GROUP}:", "          hosts:" if two else "          hosts: {}"]
    lines += [f"            {h}:" for h in two]
    return "\n".join(lines) + "\n"


def address_of(host: str) -> str:
    digits = re.sub(r"\D", "", host)
    n = int(digits) if digits else 0
    if not 2 <= n <= 254:
        n = 2 + sum(host.encode()) % 250
    return f"{SUBNET}.{n}"
