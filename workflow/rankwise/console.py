"""The ``rankwise`` console script: the command line, imported behind a Ctrl-C guard.

Importing :mod:`rankwise.cli` (click and the command modules) takes ~40-50 ms, before
click's own handler can turn a Ctrl-C into ``Aborted!``; a Ctrl-C then (an impatient
user, a pipeline cancelled as its jobs start) printed a traceback through the import.
Here it ends as a Ctrl-C inside a command does under click: a blank line closing the
terminal's ``^C``, ``Aborted!`` on stderr, exit status 1.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:
        print("\nAborted!", file=sys.stderr)
        sys.exit(1)
    command_line()
