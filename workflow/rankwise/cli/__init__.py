"""The ``rankwise`` command line (click).

One module per group of commands: :mod:`.evaluation` (evaluate, rank, metrics),
:mod:`.statistics` (compare, ci, scores), :mod:`.report` (report), :mod:`.pipeline`
(prepare, encode); the options they share are built in :mod:`.shared` from the specs
of :mod:`rankwise.options`. Modules here import only click and light modules at the
top; the heavy ones (numpy, pandas, numba, dask, zarr, matplotlib) are imported in the
command bodies, so ``rankwise --help`` and ``--version`` answer at once.

Input errors (:class:`~rankwise.errors.RankwiseError`) print one line
``error: ...`` and exit with status 2; nothing is written.
"""

from __future__ import annotations

import sys

import click

from .. import __version__
from ..errors import RankwiseError
from . import evaluation, pipeline, report, statistics


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


for _command in (
    evaluation.evaluate,
    evaluation.rank,
    evaluation.metrics,
    evaluation.verify,
    statistics.compare,
    statistics.ci,
    statistics.scores,
    report.report,
    pipeline.prepare,
    pipeline.encode,
):
    main.add_command(_command)
