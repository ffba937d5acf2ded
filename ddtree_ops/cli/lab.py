"""`ddtree-ops lab up|down|status|env|fault|load`: local test hosts ct129 and ct200 (real systemd, journald
and sshd in nspawn containers; an SGLang stand-in in place of the GPU server). Needs root."""

from __future__ import annotations

import typer

from ddtree_ops import output

lab_app = typer.Typer(help="Local lab hosts ct129, ct200 (and more with --hosts N): real systemd + sshd "
                           "containers with an SGLang stand-in (no GPU). Needs root.", no_args_is_help=True)


@lab_app.command("up")
def up(no_seed: bool = typer.Option(False, "--no-seed", help="Boot the hosts without installing the NEXTN service."),
       hosts: int = typer.Option(2, "--hosts", min=1, max=64, metavar="N",
                                 help="How many hosts: ct129 (RTX A6000), ct200 (RTX PRO 6000), then more of each "
                                      "class in turn (ct130, ct201, ct131, ...; ~280 MiB each). A lab that is up "
                                      "with fewer grows.")) -> int:
    """Build the lab tree (once, cached) and boot the hosts with the NEXTN service healthy.

    Writes an ssh_config and an Ansible inventory (groups lab, a6000, pro6000) and ends by printing
    the line that points the CLI at both, so `eval "$(ddtree-ops lab up)"` works.
    Example: ddtree-ops lab up --hosts 6
    """
    from ddtree_ops.lab import api  # psutil and the lab's machinery (~50 ms): not for --help

    t = api.up(count=hosts, seed=not no_seed, log=output.say)
    if t.get("total"):
        output.say(f"lab up in {t['total']:.1f}s (tree {'built' if t.get('tree_built') else 'cached'}: "
                   f"{t.get('tree', 0):.1f}s, boot {t.get('boot', 0):.1f}s, seed {t.get('seed', 0):.1f}s)")
    output.data(api.env_line())
    return 0


@lab_app.command("down")
def down() -> int:
    """Stop the lab hosts (by PID) and remove their namespaces, links, mounts and overlays.

    Example: ddtree-ops lab down
    """
    from ddtree_ops.lab import api  # psutil and the lab's machinery (~50 ms): not for --help

    api.down(log=output.say)
    return 0


@lab_app.command("status")
def status(as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")) -> int:
    """Each lab host: address, whether it runs, systemd state, service state, faults, memory.
    Exit 0 when every host is up and its service active, 1 otherwise.

    Example: ddtree-ops lab status
    """
    from ddtree_ops.lab import api  # psutil and the lab's machinery (~50 ms): not for --help

    rows = api.status()
    ok = all(r.running and r.service == "active" for r in rows)
    if as_json:
        paths = api.Paths.default()
        output.emit_json({"command": "lab status", "exit_code": 0 if ok else 1, "ssh_config": str(paths.ssh_config),
                          "inventory": str(paths.inventory), "hosts": [r.__dict__ for r in rows]})
    else:
        output.data(f"{'HOST':<7} {'ADDRESS':<14} {'SYSTEM':<12} {'SERVICE':<12} {'MEM(PSS)':>9}  FAULTS")
        for r in rows:
            output.data(f"{r.name:<7} {r.address:<14} {r.system:<12} {r.service:<12} {r.pss_mib:>6.0f}MiB  "
                        f"{','.join(r.faults) or '-'}")
    return 0 if ok else 1


@lab_app.command("env")
def env() -> int:
    """Print `export DDTREE_OPS_SSH_CONFIG=<lab ssh_config> DDTREE_OPS_INVENTORY=<lab inventory>` for
    `eval "$(ddtree-ops lab env)"`."""
    from ddtree_ops.lab import api  # psutil and the lab's machinery (~50 ms): not for --help

    output.data(api.env_line())
    return 0


@lab_app.command("fault")
def fault(host: str = typer.Argument(..., help="A lab host: ct129, ct200, or an extra one (ct130, ct201, ...)"),
          name: str = typer.Argument(..., help="libcuda-missing, hang, crash-after-ready, slow-start, "
                                               "accept-collapse, rank-oom, tree-mask, port-busy, stray-gpu-process, "
                                               "stray-gpu-card1, rendezvous-unreachable, or clear"),
          every_start: bool = typer.Option(False, "--every-start",
                                           help="Apply to every start until cleared, not only the next one.")) -> int:
    """Inject a fault into HOST for the next start of its service (`clear` removes all).

    The next start uses the fault up, so a rollback's start is clean; --every-start keeps it
    (a host that stays broken). tree-mask breaks the next start's served tree (mode ddtree): its
    verify mask is wrong off the spine, so it accepts well below what the shadow predicted. port-busy, stray-gpu-process and stray-gpu-card1 are real processes
    on the host, rendezvous-unreachable a real route in its network namespace (its packets to the
    other lab hosts are dropped); they last until `clear`.

    Example: ddtree-ops lab fault ct129 libcuda-missing && ssh -F ... ct129 systemctl restart sglang
    """
    from ddtree_ops.lab import api  # psutil and the lab's machinery (~50 ms): not for --help

    now = api.fault(host, name, every_start=every_start)
    output.say(f"{host}: faults now {', '.join(now) or 'none'}")
    return 0


@lab_app.command("load")
def load(host: str = typer.Argument(..., help="A lab host: ct129, ct200, or an extra one"),
         seconds: float = typer.Option(60.0, "--seconds", min=1, max=3600, help="How long to send."),
         clients: int = typer.Option(2, "--clients", min=1, max=16, help="Requests in flight at once."),
         batch: int = typer.Option(2, "--batch", min=1, max=64, help="Greedy prompts a request (one batch)."),
         max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, max=4096),
         wait: bool = typer.Option(False, "--wait", help="Return when the load ends, with its count."),
         stop: bool = typer.Option(False, "--stop", help="Stop a load running on HOST.")) -> int:
    """Put traffic on HOST's service: greedy /generate requests for --seconds, from inside the host.

    It runs as a transient unit there (ddtree-lab-load.service), so it goes on through a restart of the
    service, as a promote's switch does, and after this command returns (--wait: until it ends). At the
    defaults a ddtree-shadow host gathers over 1,000 exact rounds in about a minute.

    Example: ddtree-ops lab load ct200 --seconds 90 && ddtree-ops promote ct200
    """
    from ddtree_ops.lab import api  # psutil and the lab's machinery (~50 ms): not for --help

    if stop:
        api.stop_load(host)
        output.say(f"{host}: load stopped")
        return 0
    plan = api.LoadPlan(seconds=seconds, clients=clients, batch=batch, max_new_tokens=max_new_tokens)
    output.say(api.load(host, plan, wait=wait))
    return 0


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
