"""A fake `Host` (the Host interface of ddtree_ops/host.py) that behaves like a GPU host running its
SGLang service under systemd, in memory: files, the unit's state, its journal, HTTP on its port.

The contract tests hand a factory of these to the CLI as the command's `obj` (`cli.app.main(argv,
obj=...)`), the way GCM's health checks hand a fake to their Click commands, so `deploy` and
`rollback` run their real transaction (lock, preflight, release records, install, gate, rollback)
without root, SSH or systemd. The lab suite runs the same commands against real systemd and sshd.

What the fake understands is exactly what those commands send: the tool's own scripts and argv,
recognised by what they do. Anything else fails the test at once, naming the command, so a new
remote step is seen here first.

Behaviour is per start: a start of a release whose mode is in `broken` prints a fatal journal line
and fails (the CUDA library that cannot load, as in the story of DESIGN.md); any other start is
ready on its second poll and answers /health_generate and a smoke request with speculative metrics.
Its /metrics is what `metrics(mode)` returns for the mode of the unit serving (None: no ddtree counters
there, a 404): promote's tests make the shadow's and the served tree's counters with it. The host's
SGLang release, its installed plugin and its declared tree verify backends are what preflight's
SGLang script reports; `pip install` of the plugin wheel records the wheel's version as installed.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ddtree_ops.host import HostUnreachable, HttpResponse, HttpUnavailable, Result
from ddtree_ops.profile import Profile
from ddtree_ops.releases import APPLY
from ddtree_ops.render import render

FIXTURES = Path(__file__).resolve().parents[2] / "ddtree_ops" / "lab" / "fixtures"  # the lab's model configs
FATAL = "OSError: libcuda.so.1: cannot open shared object file: No such file or directory"
MIB_TOTAL = 49140  # an RTX A6000, as profiles/ct129.yaml says


@dataclass
class Unit:
    """The service's systemd unit as `systemctl show` reports it."""

    active: str = "inactive"
    sub: str = "dead"
    result: str = "success"
    pid: int = 0
    restarts: int = 0
    invocation: str = ""
    ticks: int = 0  # polls since this start
    broken: bool = False  # this start fails (decided when it starts)
    ready: bool = False
    mode: str = ""  # the mode of the release this start runs (its unit's header)

    @property
    def running(self) -> bool:
        return self.active == "active" and self.sub == "running"

    def show(self, unit: str) -> str:
        return (f"ActiveState={self.active}\nSubState={self.sub}\nResult={self.result}\nExecMainStatus=0\n"
                f"ExecMainCode=0\nMainPID={self.pid}\nNRestarts={self.restarts}\nInvocationID={self.invocation}\n"
                f"ActiveEnterTimestampMonotonic=0\nLoadState=loaded\nUnitFileState=enabled\n"
                f"FragmentPath=/etc/systemd/system/{unit}\nDropInPaths=\n")


@dataclass
class FakeHost:
    name: str
    unit_name: str = "sglang.service"
    files: dict[str, bytes] = field(default_factory=dict)
    unit: Unit = field(default_factory=Unit)
    journal: list[tuple[str, str]] = field(default_factory=list)  # (invocation, message)
    broken: set[str] = field(default_factory=set)  # modes whose next starts fail
    flags_refused: str = ""  # SGLang's parser refuses the launch flags with this message
    interrupt: str = ""  # "gate": Ctrl-C while the next start is gated; "preflight": while it is checked
    commands: list[str] = field(default_factory=list)  # every command run, in order
    starts: int = 0
    sglang: str = "0.5.23"  # the host's SGLang release, as its own `import sglang` says
    plugin: str | None = None  # the ddtree plugin version installed in the service's Python
    tree_backends: dict[str, str] = field(default_factory=dict)  # entry points ddtree_ops.tree_verify
    metrics: Callable[[str], str | None] | None = None  # the serving mode -> its /metrics text
    drops: list[str] = field(default_factory=list)  # the connection drops at the next command with each text
    reconnects: int = 0  # the tool's reconnects after a dropped connection

    # ------------------------------------------------------------------ set-ups

    @classmethod
    def serving(cls, p: Profile, mode: str = "nextn", **kw: Any) -> FakeHost:
        """A host set up by hand: `mode`'s unit and env file installed, its service running and healthy,
        its model files in place, no ddtree-ops state (what a first deploy adopts as its baseline)."""
        host = cls(p.name, unit_name=p.service.unit, **kw)
        r = render(p, mode)
        host.files[r.unit_path] = r.unit_text.encode()
        host.files[r.env_path] = r.env_text.encode()
        for model in ("Qwen3-8B", "Qwen3-8B-NextN", "Qwen3-8B-DFlash-b16"):
            for f in (FIXTURES / model).iterdir():
                host.files[f"/models/{model}/{f.name}"] = f.read_bytes()
        host._start()
        host.unit.ticks, host.unit.ready, host.unit.active, host.unit.sub = 2, True, "active", "running"
        return host

    def changed_files(self, before: dict[str, bytes]) -> list[str]:
        return sorted(k for k in set(before) | set(self.files) if before.get(k) != self.files.get(k))

    def text(self, path: str) -> str | None:
        data = self.files.get(path)
        return None if data is None else data.decode()

    # ------------------------------------------------------------------ the Host interface

    def run(self, argv: Any, *, stdin: bytes | None = None, timeout: float = 60.0, sudo: bool = False) -> Result:
        argv = [str(a) for a in argv]
        self.commands.append(argv[2][:60] if argv[:2] == ["sh", "-c"] else " ".join(argv))
        for text in self.drops:
            if any(text in a for a in argv):
                self.drops.remove(text)
                raise HostUnreachable(f"{self.name}: SSH connection lost while running {argv[0]}")
        out, rc = self._dispatch(argv, stdin or b"")
        return Result(tuple(argv), rc, out, "")

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.files[path] = data

    def get(self, path: str) -> bytes | None:
        return self.files.get(path)

    def http(self, method: str, port: int, path: str, *, body: Any = None, timeout: float = 10.0,
             host: str = "127.0.0.1") -> HttpResponse:
        if not (self.unit.running and self.unit.ready):
            raise HttpUnavailable(f"{self.name}: nothing answers on {host}:{port} (connection refused)")
        if (method, path) == ("GET", "/health_generate"):
            return HttpResponse(200, b"", 0.01)
        if (method, path) == ("POST", "/generate"):
            meta = {"finish_reason": {"type": "length", "length": 16}, "completion_tokens": 16,
                    "spec_verify_ct": 6, "spec_accept_length": 2.67, "e2e_latency": 0.3}
            return HttpResponse(200, json.dumps({"text": " Paris.", "meta_info": meta}).encode(), 0.3)
        if (method, path) == ("GET", "/metrics") and self.metrics is not None:
            text = self.metrics(self.unit.mode)
            if text is not None:
                return HttpResponse(200, text.encode(), 0.01)
        return HttpResponse(404, b'{"detail":"Not Found"}', 0.01)

    def stream(self, argv: Any, *, timeout: float = 30.0) -> Watch:
        argv = [str(a) for a in argv]
        assert argv[:2] == ["sh", "-c"] and "journalctl --unit" in argv[2] and "sleep" in argv[2], argv[:3]
        self.commands.append("watch " + argv[4])
        cursor = argv[6]  # sh -c WATCH sh UNIT POLL CURSOR ...
        return Watch(self, int(cursor.removeprefix("s=")) if cursor else 0)

    def close(self) -> None:
        pass

    def reconnect(self) -> None:
        self.reconnects += 1

    def __enter__(self) -> FakeHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the commands it knows

    def _dispatch(self, argv: list[str], stdin: bytes) -> tuple[str, int]:
        if argv[:2] == ["systemctl", "show"]:
            return self.unit.show(self.unit_name), 0
        if argv[:3] == ["rm", "-rf", "--"]:
            self._remove(argv[3])
            return "", 0
        if argv[:3] == ["rm", "-f", "--"]:
            for path in argv[3:]:
                self.files.pop(path, None)
            return "", 0
        if argv[1:4] == ["-m", "pip", "install"]:  # remote.pip_install: the plugin wheel put under /tmp
            wheel = argv[-1]
            assert wheel in self.files, f"pip install of a wheel that was never put: {wheel}"
            self.plugin = Path(wheel).name.split("-")[1]
            return "", 0
        if argv[:2] != ["sh", "-c"]:
            raise AssertionError(f"the fake host does not know the command {argv!r}")
        script, args = argv[2], argv[4:]
        if script.startswith(APPLY):
            self._apply(stdin.decode())
            rest = script[len(APPLY):]
            if not rest:
                return "", 0
            if "systemctl stop" in rest and "systemctl start --no-block" in rest:
                return self._restart(), 0
            raise AssertionError(f"the fake host does not know what follows the change script: {rest[:120]!r}")
        if 'base64 -w0 -- "$f"' in script:  # observe.read_files
            return "".join(f"+{p}\n{base64.b64encode(self.files[p]).decode()}\n" if p in self.files else f"-{p}\n"
                           for p in args), 0
        if 'test -d "$1" || exit 44' in script:  # lock.read_lock
            lock = args[0]
            return (self.text(f"{lock}/info.json") or "", 0) if self._is_dir(lock) else ("", 44)
        if 'if mkdir -- "$2"' in script:  # lock.acquire
            lock = args[1]
            if self._is_dir(lock):
                return self.text(f"{lock}/info.json") or "", 1
            self.files[f"{lock}/info.json"] = stdin
            return "", 0
        if "for d in releases/*/" in script:  # releases.read_state
            return self._state(args[0], int(args[1])), 0
        if '"$1" -c "$2" 2>/dev/null || python3 -c "$2"' in script:  # gpu.snapshot
            if self.interrupt == "preflight":
                self.interrupt = ""
                raise KeyboardInterrupt
            return json.dumps({"source": "nvml", "driver": "570.172.08", "errors": [], "apps": [],
                               "gpus": [{"index": 0, "uuid": "GPU-fake-0", "name": "NVIDIA RTX A6000",
                                         "memory_total_mib": MIB_TOTAL, "memory_used_mib": 600,
                                         "memory_free_mib": MIB_TOTAL - 600, "compute_cap": "8.6"}]}), 0
        if "prepare_server_args" in script:  # preflight.sglang_check: the host's own SGLang parser
            parse = self.flags_refused or "ok"
            return "\x1d" + json.dumps({"sglang": self.sglang, "ddtree-ops": self.plugin, "parse": parse,
                                        "algorithm": {"dflash_family": True, "resolved": "DFLASH"},
                                        "tree_backends": self.tree_backends}) + "\n", 0
        if "systemd-analyze verify" in script:  # preflight.verify_unit
            return "", 0
        raise AssertionError(f"the fake host does not know the script {script[:160]!r}")

    def _apply(self, records: str) -> None:
        """releases.APPLY: D (mkdir), W (write), R (rm -rf), A (append a line), fields base64."""
        lines = iter(records.splitlines())
        for line in lines:
            op, *fields = line.split()
            path = base64.b64decode(fields[0]).decode()
            if op == "W":
                self.files[path] = base64.b64decode(next(lines))
            elif op == "A":
                self.files[path] = self.files.get(path, b"") + base64.b64decode(next(lines)) + b"\n"
            elif op == "R":
                self._remove(path)
            elif op != "D":
                raise AssertionError(f"unknown change record {line!r}")

    def _remove(self, path: str) -> None:
        for k in [k for k in self.files if k == path or k.startswith(path.rstrip("/") + "/")]:
            del self.files[k]

    def _is_dir(self, path: str) -> bool:
        return any(k.startswith(path.rstrip("/") + "/") for k in self.files)

    def _restart(self) -> str:
        """deploy's install script after the files: the journal cursor and the unit's state from
        before the restart, the stop's duration, then the new start."""
        before = f"-- cursor: s={len(self.journal)}\n" + self.unit.show(self.unit_name)
        self.unit.active, self.unit.sub, self.unit.pid, self.unit.ready = "inactive", "dead", 0, False
        self._start()
        return before + "stop_ns=120000000\n"

    def _start(self) -> None:
        unit_text = self.text(f"/etc/systemd/system/{self.unit_name}") or ""
        mode = (re.search(r"\bmode=(\S+)", unit_text) or [None, "?"])[1]
        self.starts += 1
        self.unit = Unit(active="activating", sub="start", pid=4000 + self.starts, restarts=0,
                         invocation=f"inv{self.starts:04d}", broken=mode in self.broken, mode=mode)
        self.journal.append((self.unit.invocation, "Init torch distributed begin."))

    def tick(self) -> None:
        """One poll of the watcher: a start becomes ready on its second, or fails there."""
        u = self.unit
        if u.active not in ("activating", "active"):
            return
        u.ticks += 1
        if u.ticks < 2 or u.ready:
            return
        if u.broken:
            self.journal.append((u.invocation, FATAL))
            u.active, u.sub, u.result, u.pid = "failed", "failed", "exit-code", 0
        else:
            self.journal.append((u.invocation, "The server is fired up and ready to roll!"))
            u.active, u.sub, u.ready = "active", "running", True

    def _state(self, root: str, audit_lines: int) -> str:
        """releases.read_state: every meta.json, then current, known-good, pending.json, attempts.jsonl
        and the audit log's tail, separated by \\x1d."""
        metas = [v.decode() for k, v in sorted(self.files.items())
                 if k.startswith(f"{root}/releases/") and k.endswith("/meta.json")]
        audit = (self.text(f"{root}/audit.log") or "").splitlines(keepends=True)
        return ("".join(f"{m}\n\x1e\n" for m in metas) + "\x1d"
                + "\x1d".join(self.text(f"{root}/{f}") or "" for f in ("current", "known-good", "pending.json",
                                                                      "attempts.jsonl"))
                + "\x1d" + "".join(audit[-audit_lines:] if audit_lines else []))


class Watch:
    """The gate's watcher on the host (gate.WATCH): a frame per poll, the unit's state, then this
    start's journal lines as `journalctl -o json`."""

    def __init__(self, host: FakeHost, cursor: int) -> None:
        self.host, self.cursor, self.pending = host, cursor, []

    def readline(self, timeout: float) -> str | None:
        if not self.pending:
            if self.host.interrupt == "gate":
                self.host.interrupt = ""
                raise KeyboardInterrupt
            self.host.tick()
            start, self.cursor = self.cursor, len(self.host.journal)
            self.pending = [*self.host.unit.show(self.host.unit_name).splitlines(), "\x1e",
                            *(json.dumps({"MESSAGE": msg, "_SYSTEMD_INVOCATION_ID": inv, "__CURSOR": f"s={i}",
                                          "__REALTIME_TIMESTAMP": str(1_700_000_000_000_000 + i)})
                              for i, (inv, msg) in enumerate(self.host.journal[start:], start)), "\x1d"]
        return self.pending.pop(0)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def factory(hosts: dict[str, FakeHost]) -> Callable[[Profile], FakeHost]:
    """The Host factory a command receives as its `obj`: the fake of the profile's host."""
    return lambda p: hosts[p.name]


def records(host: FakeHost, root: str = "/var/lib/ddtree-ops/sglang") -> dict[str, Any]:
    """The records on the host as `history` reads them: current, pending, the attempts, and the
    release the profile's default policy rolls back to (the last NEXTN release that passed)."""
    from ddtree_ops.attempts import rollback_target
    from ddtree_ops.releases import parse_state

    state = parse_state(host._state(root, 50))
    target = rollback_target(state.attempts, policy="known-good-mode", known_good_mode="nextn")
    return {"known_good": target.release_id if target else None, "current": state.current,
            "pending": (host.text(f"{root}/pending.json") or "").strip() or None, "attempts": state.attempts}


def shipped_profiles(dest: Path, host: str, extra_yaml: str) -> Path:
    """The shipped profiles copied to `dest`, with `extra_yaml` appended to HOST's profile (a shorter
    stay window: holding one is the lab's to test)."""
    import shutil

    shutil.copytree(Path(__file__).resolve().parents[2] / "profiles", dest)
    with open(dest / f"{host}.yaml", "a") as fh:
        fh.write(extra_yaml)
    return dest


def cli_runner(capsys: Any, profiles: Path, host: FakeHost) -> Callable[..., tuple[int, Any, str]]:
    """`ddtree-ops ARGS --profiles DIR` with the fake host injected as the command's obj; each call
    returns (exit code, the JSON document or None, stderr)."""
    import pytest

    from ddtree_ops.cli.app import main

    def run(*args: str) -> tuple[int, Any, str]:
        with pytest.raises(SystemExit) as done:
            main([*args, "--profiles", str(profiles)], obj=factory({host.name: host}))
        out = capsys.readouterr()
        return int(done.value.code), (json.loads(out.out) if out.out.strip() else None), out.err

    return run
