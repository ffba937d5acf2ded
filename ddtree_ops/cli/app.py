"""The `ddtree-ops` command: a thin layer over the library.

Each command module exposes `register(app)`; a command parses its options, calls the library,
renders the result and returns an exit code. Only typer and the standard library are imported
at module level here and in every command module, so `--help` answers at once; paramiko,
pydantic, torch and sglang are imported inside the commands that use them.
"""

from __future__ import annotations

import os
import sys
from types import UnionType
from typing import Union, get_args, get_origin

# Plain help text: rich-rendered help costs ~0.25 s per `--help` (importing and laying out rich),
# more than the whole rest of start-up. TYPER_USE_RICH=1 brings it back.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer  # noqa: E402  (must follow the environment default above)

from typer._click.exceptions import ClickException, UsageError  # noqa: E402  (typer 0.29 carries click)

from ddtree_ops import __version__, output  # noqa: E402
from ddtree_ops.cli import (  # noqa: E402
    deploy,
    diagnose,
    engine,
    history,
    lab,
    lock,
    preflight,
    profile,
    promote,
    render,
    rollback,
    schedule,
    smoke,
)
from ddtree_ops.errors import OpsError  # noqa: E402
from ddtree_ops.status import INTERRUPTED, USAGE  # noqa: E402

app = typer.Typer(
    name="ddtree-ops",
    help=(
        "Deploy SGLang speculative-decoding services (NEXTN, DFLASH, DDTree shadow-linear and "
        "tree) as systemd units, gate them on real readiness, name the root cause when they fail, "
        "roll back to the NEXTN known-good release, and promote the DDTree tree when its shadow "
        "says it pays."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddtree-ops {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Global options."""


def _skip_pydantic_for_unset_flags() -> None:
    """Typer 0.29 coerces every parameter through a pydantic TypeAdapter, including the root
    group's unset --help flag on every subcommand call; importing pydantic for that costs ~0.1 s
    per invocation. An unset boolean flag needs no coercion: it is False. A plain string option
    (`str`, `str | None`, no parser or click type) needs none either: its value is the string typed
    (or None), so it gets a pass-through coercion and `diagnose --log FILE` never imports pydantic
    (issue 31: start-up)."""
    param = getattr(typer.core, "_TyperParameter", None)
    original = getattr(param, "process_value", None)
    if param is None or original is None:
        return
    try:
        from typer._coercion import RuntimeParam  # typer 0.29's coercion contract (no pydantic behind it)
    except ImportError:  # another typer: every parameter keeps its own coercion
        passthrough = None
    else:
        class PlainString(RuntimeParam):  # type: ignore[misc]
            def _coerce_value(self, value: object, param: object, ctx: object) -> object:
                return value if isinstance(value, str) else str(value)

        passthrough = PlainString

    def plain_string(desc: object) -> bool:
        ann = getattr(desc, "annotation", None)
        info = getattr(desc, "parameter_info", None)
        if info is None or getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
            return False
        return ann is str or (get_origin(ann) in (Union, UnionType) and set(get_args(ann)) == {str, type(None)})

    def process_value(self: object, ctx: object, value: object) -> object:
        desc = getattr(self, "type_descriptor", None)
        if value is None and getattr(desc, "annotation", None) is bool:
            value = False
        elif passthrough is not None and getattr(self, "_runtime_param", 0) is None and plain_string(desc):
            self._runtime_param = passthrough(parameter_info=desc.parameter_info, annotation=desc.annotation)  # type: ignore[attr-defined]
        return original(self, ctx, value)

    param.process_value = process_value


_skip_pydantic_for_unset_flags()

for _module in (deploy, rollback, promote, diagnose, smoke, render, profile, preflight, history, lock,
                schedule, lab, engine):
    _module.register(app)


def main(argv: list[str] | None = None, *, obj: object = None) -> None:
    """Entry point: maps usage errors to 64 and expected failures to their exit codes.

    `obj` reaches every command as its context object: a Host factory (profile -> Host) that the
    commands use instead of SSH (`cli/_common.connector`), as the contract tests inject a fake."""
    command = typer.main.get_command(app)
    args = argv if argv is not None else sys.argv[1:]
    try:
        rc = command.main(args=args, prog_name="ddtree-ops", standalone_mode=False, obj=obj)
    except UsageError as exc:
        exc.show()
        _error_document(args, USAGE, exc.format_message())
        sys.exit(USAGE)
    except ClickException as exc:
        exc.show()
        _error_document(args, USAGE, exc.format_message())
        sys.exit(USAGE)
    except OpsError as exc:
        # messages quote operator input (profile values, --set), which must print as typed, not as markup
        output.fail(output.escape(str(exc)))
        if exc.hint:
            output.say(f"  hint: {output.escape(exc.hint)}")
        _error_document(args, exc.exit_code, str(exc), exc.hint)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(INTERRUPTED)
    except typer.Exit as exc:  # raised inside callbacks when standalone_mode is off
        sys.exit(exc.exit_code)
    if os.environ.get("DDTREE_OPS_DEBUG_RC"):
        sys.stderr.write(f"rc={rc}\n")
    sys.exit(rc if isinstance(rc, int) else 0)


def _error_document(args: list[str], code: int, message: str, hint: str | None = None) -> None:
    """With --json, a command that ends in an error still prints its one document on stdout, so a
    script reads `command`, `schema_version` and `exit_code` whatever happened (stderr has the words)."""
    if "--json" not in args:
        return
    words = [a for a in args if not a.startswith("-")][:2]
    name = " ".join(words[:2]) if words[:1] in (["lock"], ["lab"], ["profile"], ["engine"], ["schedule"]) else \
        (words[0] if words else "")
    output.emit_json({"command": name, "exit_code": int(code), "error": message, "hint": hint})


if __name__ == "__main__":  # `python -m ddtree_ops.cli.app`, like `python -m ddtree_ops`
    main()
