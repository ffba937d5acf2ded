"""Scheduling `ddtree-ops smoke` on the control machine: a systemd timer + oneshot service, or cron.

Rendering is pure (spec in, unit text and a crontab line out). Installing is a plan as data
(files to write, commands to run) carried out through any `Host`-shaped executor: `LocalHost`
for the control machine, or an SSH host when a test installs the timer inside a lab host.

No overlap, three ways: a oneshot service is never started again while it runs; the cron line
is wrapped in `flock -n`; and `smoke` itself takes the same lock (so manual runs are safe too).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ddtree_ops import remote
from ddtree_ops.config.paths import profiles_dir
from ddtree_ops.errors import OpsError, UsageError
from ddtree_ops.host import Host, Result
from ddtree_ops.render import fill_template, systemd_command, template_dir
from ddtree_ops.smoke import LOCK_PATH
from ddtree_ops.ssh import ENV_SSH_CONFIG, ssh_config_path

UNIT = "ddtree-smoke"
SERVICE = f"{UNIT}.service"
TIMER = f"{UNIT}.timer"
UNIT_DIR = "/etc/systemd/system"
LOCK = LOCK_PATH
SKIPPED_RC = 75  # EX_TEMPFAIL: flock's exit code for "somebody else holds it", told apart from smoke's 0-3


@dataclass(frozen=True)
class Every:
    """A period that divides the minute, hour or day, so OnCalendar and cron fire evenly."""

    seconds: int

    def __str__(self) -> str:
        s = self.seconds
        return f"{s // 3600}h" if s % 3600 == 0 else f"{s // 60}m" if s % 60 == 0 else f"{s}s"

    @property
    def on_calendar(self) -> str:
        s = self.seconds
        if s % 3600 == 0:
            return f"*-*-* 0/{s // 3600}:00:00"
        if s % 60 == 0:
            return f"*-*-* *:0/{s // 60}:00"
        return f"*-*-* *:*:0/{s}"

    @property
    def cron(self) -> str:
        s = self.seconds
        if s % 60:
            raise UsageError(f"cron cannot run every {self}: its smallest step is one minute (use the timer)")
        if s % 3600 == 0:
            return f"0 */{s // 3600} * * *" if s > 3600 else "0 * * * *"
        return f"*/{s // 60} * * * *" if s > 60 else "* * * * *"

    @property
    def randomized_delay(self) -> int:
        """A tenth of the period, at most five minutes: spread, but still about every period."""
        return max(1, min(self.seconds // 10, 300))

    @property
    def timeout(self) -> int:
        # smoke bounds itself (HTTP timeouts, SSH connect retries) well under 90 s
        return max(self.seconds, 90)


def parse_every(text: str) -> Every:
    m = re.fullmatch(r"\s*(\d+)\s*(s|sec|m|min|h|hr)?\s*", text or "")
    if not m:
        raise UsageError(f"--every {text!r}: expected a period such as 30s, 5m or 1h")
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[(m.group(2) or "m")[0]]
    even = ((0 < seconds < 60 and 60 % seconds == 0)
            or (60 <= seconds < 3600 and seconds % 60 == 0 and 3600 % seconds == 0)
            or (seconds >= 3600 and seconds % 3600 == 0 and 86400 % seconds == 0))
    if not even:
        raise UsageError(f"--every {text}: use a period that divides the minute, hour or day "
                         "(e.g. 15s, 5m, 10m, 2h), so runs are evenly spaced")
    if seconds < 10:
        raise UsageError(f"--every {text}: a smoke check every {seconds}s would load the servers; use 10s or more")
    return Every(seconds)


@dataclass(frozen=True)
class Spec:
    """What runs, how often, as whom."""

    every: Every
    executable: str  # absolute path of ddtree-ops
    hosts: tuple[str, ...] = ()  # empty: --all
    user: str = "root"
    prom_file: str | None = None
    ping_url: str | None = None
    ssh_config: str | None = None
    profiles_dir: str | None = None
    inventory: str | None = None  # an Ansible inventory named at install time (groups resolve alike)
    lock: str = LOCK  # the one smoke takes itself; the cron wrapper takes the same one

    @property
    def smoke_argv(self) -> list[str]:
        argv = [self.executable, "smoke", *(self.hosts or ["--all"])]
        if self.prom_file:
            argv += ["--prom-file", self.prom_file]
        if self.ping_url:
            argv += ["--ping-url", self.ping_url]
        if self.lock != LOCK:
            argv += ["--lock-file", self.lock]
        return argv

    @property
    def environment(self) -> dict[str, str]:
        """Pinned at install time: the service must read the same profiles and ssh_config as the
        operator who installed it, whatever its working directory."""
        env = {}
        if self.profiles_dir:
            env["DDTREE_OPS_PROFILES"] = self.profiles_dir
        if self.ssh_config:
            env["DDTREE_OPS_SSH_CONFIG"] = self.ssh_config
        if self.inventory:
            env["DDTREE_OPS_INVENTORY"] = self.inventory
        return env


def default_spec(every: str = "5m", *, hosts: Sequence[str] = (), prom_file: str | None = None,
                 ping_url: str | None = None, ssh_config: str | None = None, user: str | None = None) -> Spec:
    """A spec for this machine: this ddtree-ops, these profiles, the operator's ssh_config."""
    # only an ssh_config named now is pinned; otherwise the runs read their own user's ~/.ssh/config
    # (under sudo, "~" here would be root's)
    named = ssh_config or os.environ.get(ENV_SSH_CONFIG)
    cfg = ssh_config_path(named) if named else None
    return Spec(
        every=parse_every(every), executable=_executable(), hosts=tuple(hosts), user=user or _invoking_user(),
        prom_file=str(Path(prom_file).absolute()) if prom_file else None, ping_url=ping_url,
        ssh_config=str(cfg.absolute()) if cfg else None, profiles_dir=str(profiles_dir().resolve()),
        inventory=str(Path(os.environ["DDTREE_OPS_INVENTORY"]).absolute()) if os.environ.get("DDTREE_OPS_INVENTORY")
        else None,
    )


def _executable() -> str:
    beside = Path(sys.executable).parent / "ddtree-ops"
    found = str(beside) if beside.is_file() else shutil.which("ddtree-ops")
    if not found:
        raise OpsError("cannot find the ddtree-ops executable to schedule (install the package, or run from its venv)")
    return str(Path(found).absolute())


def _invoking_user() -> str:
    """Whoever ran sudo: the runs need that user's SSH keys and known_hosts."""
    import getpass

    return os.environ.get("SUDO_USER") or getpass.getuser()


# ------------------------------------------------------------------ rendering (pure)


def env_line(key: str, value: str) -> str:
    """One Environment= assignment, quoted for systemd ("%" is a specifier, so it is doubled)."""
    if re.search(r"[\x00-\x1f\x7f]", value):
        raise UsageError(f"{key}: {value!r} contains a control character; systemd cannot carry it")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'Environment="{key}={escaped}"'


def _fill(name: str, values: dict[str, str], template: str | None) -> str:
    text = template if template is not None else (template_dir() / f"{name}.tmpl").read_text(encoding="utf-8")
    return fill_template(text, values)


def _values(spec: Spec) -> dict[str, str]:
    return {
        "hosts": ", ".join(spec.hosts) or "all hosts", "every": str(spec.every), "user": spec.user,
        "on_calendar": spec.every.on_calendar, "randomized_delay": f"{spec.every.randomized_delay}s",
        "timeout": f"{spec.every.timeout}s", "lock_file": spec.lock,
        "environment": "\n".join(env_line(k, v) for k, v in sorted(spec.environment.items())),
        "exec_start": systemd_command(spec.smoke_argv),
    }


def render_service(spec: Spec, *, template: str | None = None) -> str:
    return _fill(SERVICE, _values(spec), template)


def render_timer(spec: Spec, *, template: str | None = None) -> str:
    return _fill(TIMER, _values(spec), template)


def units(spec: Spec) -> dict[str, str]:
    return {SERVICE: render_service(spec), TIMER: render_timer(spec)}


def cron_line(spec: Spec) -> str:
    """A crontab line: `flock -n` on smoke's own lock; a skipped run logs that it skipped, and
    everything goes to syslog/journal instead of cron mail every few minutes."""
    run = shlex.join(["flock", "-n", "-E", str(SKIPPED_RC), spec.lock, *_env_argv(spec), *spec.smoke_argv])
    skipped = shlex.quote(f"skipped: another smoke run holds {spec.lock}")
    command = f"{{ {run}; [ $? -ne {SKIPPED_RC} ] || echo {skipped}; }} 2>&1 | logger -t ddtree-smoke"
    # cron turns an unescaped % into a newline before the shell ever sees the line
    return f"{spec.every.cron} {command.replace('%', chr(92) + '%')}"


def _env_argv(spec: Spec) -> list[str]:
    return ["env", *(f"{k}={v}" for k, v in sorted(spec.environment.items()))] if spec.environment else []


# ------------------------------------------------------------------ verification


def verify(unit_texts: dict[str, str], *, tool: str | None = None) -> list[str]:
    """`systemd-analyze verify` on copies staged under their real names (it derives the unit type
    from the suffix). It exits 0 on many warnings, so any line about our units is a problem."""
    exe = tool or shutil.which("systemd-analyze")
    if not exe:
        raise OpsError("systemd-analyze is not installed here; cannot verify the units")
    with tempfile.TemporaryDirectory(prefix="ddtree-smoke-verify.") as d:
        paths = []
        for name, text in unit_texts.items():
            (Path(d) / name).write_text(text, encoding="utf-8")
            paths.append(str(Path(d) / name))
        proc = subprocess.run([exe, "verify", "--man=no", *paths], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""})
        ours = tuple(unit_texts) + (d,)
        problems = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()
                    if ln.strip() and any(n in ln for n in ours)]
        if proc.returncode != 0 and not problems:
            problems.append(f"systemd-analyze verify exited {proc.returncode}: "
                            f"{(proc.stderr or proc.stdout).strip()[-300:]}")
        return [p.replace(d + "/", "") for p in problems]


# ------------------------------------------------------------------ installing


@dataclass(frozen=True)
class Plan:
    files: tuple[tuple[str, str], ...]  # (path, text)
    commands: tuple[tuple[str, ...], ...] = ()

    def describe(self) -> list[str]:
        return [f"write {p}" for p, _ in self.files] + [shlex.join(c) for c in self.commands]


def plan(spec: Spec, *, root: str | None = None, enable: bool = True) -> Plan:
    """With root (a staging tree), only the files; otherwise files, daemon-reload, enable --now."""
    base = (root.rstrip("/") if root else "") + UNIT_DIR
    files = tuple((f"{base}/{name}", text) for name, text in units(spec).items())
    if root:
        return Plan(files)
    commands: list[tuple[str, ...]] = [("systemctl", "daemon-reload")]
    if enable:
        commands.append(("systemctl", "enable", "--now", TIMER))
    return Plan(files, tuple(commands))


def systemd_booted() -> bool:
    """sd_booted(3): systemd is PID 1 exactly when this directory exists."""
    return os.path.isdir("/run/systemd/system")


def apply(plan_: Plan, host: Host) -> list[Result]:
    """Write each file beside its target and rename it over (never half a unit), then run."""
    done = []
    for path, text in plan_.files:
        host.run(remote.mkdirs(os.path.dirname(path)), sudo=True, timeout=20).check(f"creating {os.path.dirname(path)}")
        tmp = f"{path}.ddtree-new"
        host.put(tmp, text.encode(), mode=0o644)
        done.append(host.run(remote.rename(tmp, path), sudo=True, timeout=20).check(f"installing {path}"))
    for argv in plan_.commands:
        done.append(host.run(list(argv), sudo=True, timeout=60).check())
    return done


@dataclass
class LocalHost:
    """The control machine as an executor for install plans (the `Host` calls a plan uses)."""

    name: str = "localhost"
    ran: list[tuple[str, ...]] = field(default_factory=list)

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0,
            sudo: bool = False) -> Result:
        t0 = time.monotonic()
        self.ran.append(tuple(argv))
        try:
            proc = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout)
        except FileNotFoundError as exc:
            return Result(tuple(argv), 127, "", str(exc), time.monotonic() - t0)
        return Result(tuple(argv), proc.returncode, proc.stdout.decode("utf-8", "replace"),
                      proc.stderr.decode("utf-8", "replace"), time.monotonic() - t0)

    def put(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(path, mode)

    def get(self, path: str) -> bytes | None:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None

    def close(self) -> None:
        pass


def install(spec: Spec, *, host: Host | None = None, root: str | None = None, enable: bool = True,
            check_units: bool = True) -> Plan:
    """Verify the units, then write and enable them; refuse clearly where that cannot work."""
    if root is None and host is None:
        if not systemd_booted():
            raise OpsError("this machine does not run systemd as PID 1, so a timer cannot be installed here",
                           hint="use `ddtree-ops schedule print --cron` for a crontab line, or "
                                "`schedule install --root DIR` to write the units into a staging tree")
        try:
            pwd.getpwnam(spec.user)
        except KeyError:
            raise UsageError(f"--user {spec.user}: no such user on this machine") from None
        if os.geteuid() != 0:
            raise OpsError(f"installing into {UNIT_DIR} needs root", hint="run it with sudo (the runs still "
                           f"happen as {spec.user}, whose SSH keys they use)")
    if check_units and shutil.which("systemd-analyze"):
        problems = verify(units(spec))
        if problems:
            raise OpsError("the rendered units do not pass systemd-analyze verify:\n  " + "\n  ".join(problems))
    p = plan(spec, root=root, enable=enable)
    apply(p, host or LocalHost())
    return p
