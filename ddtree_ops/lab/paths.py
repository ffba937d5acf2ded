"""Where the lab keeps things: all of it outside the repository, under one directory.

    <home>/tree/            the cached Debian tree (read-only lower layer of every host)
    <home>/wheelhouse/      wheels for the tree's /opt/sglang/venv (downloaded once)
    <home>/keys/            the lab's SSH client key and each host's host key (kept across up/down)
    <home>/ssh_config       what `DDTREE_OPS_SSH_CONFIG` points at; <home>/known_hosts beside it
    <home>/inventory.yml    what `DDTREE_OPS_INVENTORY` points at: groups lab, a6000, pro6000
    <home>/run/             one `up`'s state: per-host overlay, state.json with PIDs (removed by `down`)
    <home>/logs/            nspawn console logs of the last run (kept for post-mortems)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_HOME = "DDTREE_LAB_HOME"


def lab_home() -> Path:
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".cache" / "ddtree-ops" / "lab")


@dataclass(frozen=True)
class Paths:
    home: Path

    @classmethod
    def default(cls) -> Paths:
        return cls(lab_home())

    @property
    def tree(self) -> Path:
        return self.home / "tree"

    @property
    def tree_stamp(self) -> Path:
        return self.tree / "etc" / "ddtree-lab" / "recipe"

    @property
    def wheelhouse(self) -> Path:
        return self.home / "wheelhouse"

    @property
    def keys(self) -> Path:
        return self.home / "keys"

    @property
    def client_key(self) -> Path:
        return self.keys / "client_ed25519"

    def host_key(self, host: str) -> Path:
        return self.keys / f"host_{host}_ed25519"

    @property
    def ssh_config(self) -> Path:
        return self.home / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.home / "known_hosts"

    @property
    def inventory(self) -> Path:
        """The lab's hosts and groups (an Ansible YAML inventory): what DDTREE_OPS_INVENTORY points at."""
        return self.home / "inventory.yml"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def state(self) -> Path:
        return self.run / "state.json"

    def host_dir(self, host: str) -> Path:
        return self.run / host

    def host_root(self, host: str) -> Path:
        """The merged overlay the container boots from."""
        return self.host_dir(host) / "root"

    @property
    def logs(self) -> Path:
        return self.home / "logs"
