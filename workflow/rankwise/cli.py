"""The ``rankwise`` command line (click).

Input errors (:class:`~rankwise.errors.RankwiseError`) print one line
``error: ...`` and exit with status 2; nothing is written.
"""

from __future__ import annotations

import sys

import click

from . import __version__
from .errors import RankwiseError


class _Group(click.Group):
    """Turns RankwiseError into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except RankwiseError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except click.UsageError as exc:  # bad option value, missing option, unknown command
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"error: {exc.format_message()}{hint}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="rankwise")
def main() -> None:
    """Reproducible, out-of-core retrieval and re-identification evaluation."""


def _register() -> None:
    """Attach the subcommands defined in their own modules."""
    from . import cli_core

    for command in cli_core.COMMANDS:
        main.add_command(command)
    for module_name in ("cli_pipeline", "cli_report", "cli_compare"):
        try:
            module = __import__(f"rankwise.{module_name}", fromlist=["COMMANDS"])
        except ModuleNotFoundError as exc:
            if exc.name != f"rankwise.{module_name}":
                raise
            continue
        for command in module.COMMANDS:
            main.add_command(command)


_register()
