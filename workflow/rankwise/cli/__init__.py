"""The ``rankwise`` command line (click).

One module per group of commands: :mod:`.evaluation` (evaluate, rank, metrics),
:mod:`.statistics` (compare, ci, scores), :mod:`.report` (report), :mod:`.pipeline`
(prepare, encode); the options they share are built in :mod:`.shared` from the specs
of :mod:`rankwise.options`. Modules here import only click and light modules at the
top; the heavy ones (numpy, pandas, numba, dask, zarr, matplotlib) are imported in the
command bodies, so ``rankwise --help`` and ``--version`` answer at once.

Input errors (:class:`~rankwise.errors.RankwiseError`) and file-system errors (an
output folder that is a file, no permission, a full disk: :class:`OSError`) print one
line ``error: ...`` and exit with status 2; nothing is written.
"""

from __future__ import annotations

import gc
import os
import sys

import click

from ..errors import RankwiseError
from . import evaluation, pipeline, report, shared, statistics


class _Group(click.Group):
    """Turns RankwiseError into one line on stderr and exit status 2."""

    def __call__(self, *args, **kwargs):
        """The console script's entry (click's test runner calls ``main`` instead)."""
        try:
            return super().__call__(*args, **kwargs)
        finally:
            # The process ends here. Its final garbage collection would walk every object
            # numba, pandas and dask created (~0.15-0.3 s after a ranking run); frozen
            # objects are skipped, and the operating system frees the memory anyway.
            gc.freeze()

    def invoke(self, ctx: click.Context):
        from ..options import flag_spelling

        try:
            with flag_spelling():  # messages from deep inside name the flags
                return super().invoke(ctx)
        except RankwiseError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except click.UsageError as exc:  # bad option value, missing option, unknown command
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"error: {exc.format_message()}{hint}", err=True)
            sys.exit(2)
        except BrokenPipeError:  # `rankwise ... | head`: the reader left; nothing to say
            # (Python's recipe: point stdout at devnull so the exit flush cannot fail again)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except OSError as exc:  # an output folder that is a file, a full disk, no permission
            click.echo(f"error: {_os_error_line(exc)}", err=True)
            sys.exit(2)


def _os_error_line(exc: OSError) -> str:
    """One line from an OSError: the path(s), the reason, what to check."""
    what = exc.strerror or type(exc).__name__
    if exc.filename is None:
        return f"{what}: {exc}" if exc.strerror is None else what
    path = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        # the nearest existing part of the path is a file where a folder was to be
        part = shared.nearest_existing(exc.filename)
        if part is not None and not part.is_dir():
            return shared.in_the_way(part)
    return f"{path}: {what}; check that this path (and its folder) can be read or written"


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    """``--version``; the package metadata is read only then (~40 ms every job would pay)."""
    if not value or ctx.resilient_parsing:
        return
    from .. import __version__

    click.echo(f"rankwise, version {__version__}")
    ctx.exit()


@click.group(cls=_Group)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
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
