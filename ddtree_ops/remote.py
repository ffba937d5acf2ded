"""Remote actions as data: each function returns the argv a host runs, nothing more.

One thin executor (`Host.run`) runs them; tests compare these lists, the way pyinfra tests its
operations and Kamal its command builders. Paths and names are arguments, never shell text, so
nothing here needs quoting.
"""

from __future__ import annotations

Argv = list[str]

# INVOCATION_ID tags systemd's own lines about the unit, _SYSTEMD_INVOCATION_ID the service's
JOURNAL_FIELDS = "MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,UNIT,__REALTIME_TIMESTAMP,_PID,PRIORITY"
UNIT_PROPS = ("ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "MainPID",
              "NRestarts", "InvocationID", "ActiveEnterTimestampMonotonic", "LoadState",
              "UnitFileState", "FragmentPath", "DropInPaths")


# ------------------------------------------------------------------ systemd


def systemctl_show(unit: str, props: tuple[str, ...] = UNIT_PROPS) -> Argv:
    return ["systemctl", "show", "--property", ",".join(props), "--", unit]


def daemon_reload() -> Argv:
    return ["systemctl", "daemon-reload"]


def reset_failed(unit: str) -> Argv:
    # exits non-zero when the unit was not failed: callers ignore its status
    return ["systemctl", "reset-failed", "--", unit]


def restart(unit: str) -> Argv:
    """Stop, then start without waiting. A plain `systemctl restart` of a unit still activating
    (a server that never became ready keeps its start job running) is merged into that job and
    restarts nothing; an explicit stop cancels the job. --no-block on the start: ExecStartPost
    waits for readiness, and the gate watches instead of blocking here."""
    return ["sh", "-c", 'systemctl stop -- "$1"; systemctl start --no-block -- "$1"', "sh", unit]


def enable(unit: str) -> Argv:
    return ["systemctl", "enable", "--quiet", "--", unit]


def stop(unit: str) -> Argv:
    return ["systemctl", "stop", "--no-block", "--", unit]


def verify_unit(path: str) -> Argv:
    return ["systemd-analyze", "verify", "--", path]


# ------------------------------------------------------------------ journald


def journal_cursor(unit: str) -> Argv:
    """The cursor of the newest entry, taken before a restart to scope the gate's reads."""
    return ["journalctl", "--unit", unit, "--lines", "0", "--show-cursor", "--no-pager", "--quiet"]


def journal_after(unit: str, cursor: str | None, *, max_lines: int = 5000) -> Argv:
    argv = ["journalctl", "--unit", unit, "--output", "json", "--no-pager", "--quiet",
            "--output-fields", JOURNAL_FIELDS]
    if cursor:
        argv += ["--after-cursor", cursor]
    else:
        argv += ["--lines", str(max_lines)]
    return argv


def journal_invocation(unit: str, invocation_id: str) -> Argv:
    return ["journalctl", "--output", "json", "--no-pager", "--quiet",
            f"_SYSTEMD_INVOCATION_ID={invocation_id}", "+", f"UNIT={unit}",
            f"INVOCATION_ID={invocation_id}"]


# ------------------------------------------------------------------ files


def mkdirs(*paths: str, mode: str = "0755") -> Argv:
    return ["mkdir", "-p", "-m", mode, "--", *paths]


def rename(src: str, dest: str) -> Argv:
    """rename(2) within one directory: the target is either the old file or the new one."""
    return ["mv", "-f", "-T", "--", src, dest]


def remove(*paths: str) -> Argv:
    return ["rm", "-f", "--", *paths]


def remove_tree(path: str) -> Argv:
    return ["rm", "-rf", "--", path]


def cat(path: str) -> Argv:
    return ["cat", "--", path]


def append_line(path: str, line: str) -> Argv:
    # one write(2) of one line with O_APPEND: concurrent writers never interleave inside a line
    return ["sh", "-c", 'printf "%s\\n" "$1" >> "$2"', "sh", line, path]


def mkdir_lock(path: str) -> Argv:
    """mkdir is atomic: exactly one of two racing deploys gets rc 0 (Kamal's lock)."""
    return ["mkdir", "--", path]


# ------------------------------------------------------------------ GPU and Python on the host


def nvidia_smi_gpus() -> Argv:
    return ["nvidia-smi",
            "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,compute_cap,driver_version",
            "--format=csv,noheader,nounits"]


def nvidia_smi_apps() -> Argv:
    return ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
            "--format=csv,noheader,nounits"]


# The first lines of a script that imports SGLang on the host. The import (torch with it) makes a great
# many objects and none of them is garbage, so Python's cyclic collector only walks them over and over: a
# sixth of the import's CPU on a lab host (bench/gc_pause_cpu.py, `lab`). The script ends in seconds, and
# nothing it makes needs collecting.
QUIET_GC = "import gc\ngc.disable()\n"


def python_run(python: str, script: str, *args: str) -> Argv:
    return [python, "-c", script, *args]


def env_run(env: dict[str, str], argv: Argv) -> Argv:
    return ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]


def pip_install(python: str, wheel: str) -> Argv:
    return [python, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
            "--disable-pip-version-check", "--quiet", wheel]


# ------------------------------------------------------------------ a multi-node service's steps
# (staged on every node first, then stopped and started in the order SGLang needs)

_UNIT_SHOW = ",".join(UNIT_PROPS)


def stage_unit(unit: str) -> Argv:
    """After the files are written: make systemd read them and enable the unit, start nothing."""
    return ["sh", "-c", 'u="$1"; systemctl daemon-reload || exit 1; systemctl reset-failed -- "$u" 2>/dev/null; '
            'systemctl enable --quiet -- "$u"', "sh", unit]


def stop_and_wait(unit: str) -> Argv:
    """Stop and return once it is stopped (a rank left running would hold its peers' collectives)."""
    return ["sh", "-c", 's=$(date +%s%N); systemctl stop -- "$1"; printf "stop_ns=%s\\n" $(( $(date +%s%N) - s ))',
            "sh", unit]


def start_scoped(unit: str) -> Argv:
    """The journal cursor and the unit's InvocationID from before the start (the gate judges this
    start only), then the start itself, not waited for (ExecStartPost waits for readiness)."""
    return ["sh", "-c", 'u="$1"; journalctl --unit "$u" --lines 0 --show-cursor --no-pager --quiet; '
            f'systemctl show --property {_UNIT_SHOW} -- "$u"; systemctl reset-failed -- "$u" 2>/dev/null; '
            'systemctl start --no-block -- "$u"', "sh", unit]


# Run on a node by the service's Python: can it open a TCP connection to rank 0's rendezvous?
# "refused" is fine (nothing listens there yet); a timeout is a firewall dropping the port or no route.
TCP_PROBE = r'''
import socket, sys
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    socket.create_connection((host.strip("[]"), port), timeout=timeout).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except socket.timeout:
    print("timeout")
except OSError as exc:
    print("error %s" % exc)
'''


def tcp_probe(python: str, host: str, port: int, timeout_s: float = 3.0) -> Argv:
    return ["sh", "-c", '"$1" -c "$2" "$3" "$4" "$5" 2>/dev/null || python3 -c "$2" "$3" "$4" "$5"', "sh",
            python, TCP_PROBE, host, str(port), f"{timeout_s:g}"]
