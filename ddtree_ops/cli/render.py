"""`ddtree-ops render HOST`: the unit, env file or argv a deploy would install (pure; no host contact)."""

from __future__ import annotations

import shlex
from enum import Enum
from typing import Optional

import typer

from ddtree_ops import output
from ddtree_ops.cli import _common
from ddtree_ops.cli._common import JsonOpt, ProfilesOpt, SetOpt


class What(str, Enum):
    unit = "unit"
    env = "env"
    argv = "argv"


def render_cmd(host: str = typer.Argument(..., help="Host name (profiles/<host>.yaml)."),
               mode: Optional[str] = typer.Option(None, "--mode", "-m",
                                                  help="nextn | dflash | ddtree-shadow | ddtree (default: the profile's `mode:`)."),
               what: What = typer.Option(What.unit, "--what", help="unit, env (secrets redacted) or argv."),
               set_: Optional[list[str]] = SetOpt, as_json: bool = JsonOpt,
               profiles: Optional[str] = ProfilesOpt) -> int:
    """Print what a deploy would install, without touching any host.

    Example: ddtree-ops render ct129 --mode ddtree-shadow --what argv
    """
    # rendering loads pydantic (profiles): imported when the command runs
    from ddtree_ops.render import render

    p = _common.load(host, set_, profiles)
    r = render(p, mode or p.desired_mode)
    if as_json:
        output.emit_json({"command": "render", "exit_code": 0, **r.manifest(), "unit_text": r.unit_text,
                          "env_text": r.env_redacted})
    elif what is What.unit:
        output.data(r.unit_text)
    elif what is What.env:
        output.data(r.env_redacted)
    else:
        output.data(shlex.join(r.argv))
    return 0


def register(app: typer.Typer) -> None:
    app.command("render")(render_cmd)
