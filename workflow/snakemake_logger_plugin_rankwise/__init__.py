"""Snakemake logger plugin ``rankwise``: the file, line and column of a YAML syntax error
in a ``--configfile``, and one line instead of a traceback for a missing one.

Snakemake 9 parses every ``--configfile`` itself, before the workflow's Snakefile runs, and
reports a syntax error only as ``Config file is not valid JSON or YAML`` (no file, no
line: ``snakemake/common/configfile.py`` drops the parser's message), so no check in the
workflow can see it. Logger plugins are set up before that parse and receive that error.
The workflow's default profile (``profiles/default``: ``logger: [rankwise]``) selects this
one; on that error it re-reads the command line's config files the way Snakemake does
(JSON, else YAML via ``yte``) and prints, for the first that fails, rankwise's one-line
message: ``error: my.yaml:12:5: YAML syntax error: ...``.  An empty config file, or one
whose top level is a list or a scalar, gets Snakemake's "must be given as JSON or YAML with
keys at top level" (again no file): the plugin adds ``error: my.yaml: the config file is
empty, not a mapping of keys; ...``.

A ``--configfile`` that does not exist (a typo) makes Snakemake log a 25-line Python
traceback ending in ``FileNotFoundError``; a filter on Snakemake's logger (it runs before
any handler, Snakemake's own stream included) replaces that one record's text with
``error: my.yml: config file not found; ...`` (and one in another encoding than UTF-8,
a UnicodeDecodeError traceback, with ``error: my.yaml: not a readable config file: line 3
is not UTF-8 text ...``).  A second filter names each finished job
by its wildcards: with the profile's ``quiet: [rules]`` Snakemake prints only ``Finished
jobid: 35 (Rule: encode)``, which does not say which dataset or encoder; it becomes
``Finished jobid: 35 (Rule: encode; dataset=market, encoder=osnet, split=query)``, from
the job's start record (which the quiet output does not show).  Every other record is
left as it is.  ``--workflow-profile none`` turns all of this off.

Installed with rankwise (a top-level package under ``workflow/``); Snakemake finds logger
plugins by their module name ``snakemake_logger_plugin_<name>``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

# Snakemake's messages for a config file it cannot parse, and for one that parses to
# something other than a mapping (snakemake/common/configfile.py); neither names the file
UNPARSABLE = "Config file is not valid JSON or YAML"
NOT_A_MAPPING = "Config file must be given as JSON or YAML with keys at top level"


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    """No settings."""


def command_line_configfiles(argv: list[str]) -> list[str]:
    """The ``--configfile``/``--configfiles`` paths of a Snakemake command line, parsed by
    Snakemake's own parser (its aliases, options around them); [] when it does not parse
    (silently). Config files set by a profile are not seen."""
    import contextlib
    import io

    from snakemake.cli import get_argument_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text on errors
            args = get_argument_parser().parse_args(argv)
    except (Exception, SystemExit):
        return []
    return [str(f) for f in args.configfile or []]


def _parse(path: str):
    """``path`` parsed as Snakemake parses a config file (snakemake/common/configfile.py:
    JSON, else YAML through ``yte``); its errors propagate."""
    import json

    import yte

    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except ValueError:
            f.seek(0)
        return yte.process_yaml(f, require_use_yte=True)


def syntax_error(paths: list[str]) -> str | None:
    """rankwise's one-line message for the first file Snakemake cannot parse, else None."""
    import yaml

    from rankwise.errors import RankwiseError
    from rankwise.pipeline_config import load_yaml

    for path in paths:
        try:
            _parse(path)
        except yaml.YAMLError:
            try:
                load_yaml(path)
            except RankwiseError as error:
                return f"error: {error}"
            return None
        except Exception:
            continue  # not ours to explain (a missing file: Snakemake names it)
    return None


def not_a_mapping(paths: list[str]) -> str | None:
    """rankwise's one-line message for the first of ``paths`` that parses (as Snakemake
    parses it) to something other than a mapping of keys, else None."""
    for path in paths:
        try:
            config = _parse(path)
        except Exception:
            continue  # not ours to explain (unparsable or missing: the other messages)
        if not isinstance(config, dict):
            kinds = {list: "holds a list", str: "holds a string", bool: "holds a boolean"}
            what = "is empty" if config is None else kinds.get(type(config), "holds a number")
            return (
                f"error: {path}: the config file {what}, not a mapping of keys; write "
                "top-level keys such as 'datasets:' and 'encoders:' (config/config.yaml)"
            )
    return None


def not_utf8(paths: list[str]) -> str | None:
    """rankwise's one-line message for the first of ``paths`` that is not UTF-8 text
    (Snakemake's traceback ends in UnicodeDecodeError), else None."""
    from pathlib import Path

    from rankwise.manifest import first_non_utf8_line, not_utf8

    for path in paths:
        where = first_non_utf8_line(Path(path))
        if where is not None:
            return f"error: {not_utf8(Path(path), 'config file', where)}"
    return None


def missing_configfile(paths: list[str]) -> str | None:
    """rankwise's one-line message for the first of ``paths`` that is not a file, else None."""
    import os

    for path in paths:
        if not os.path.isfile(path):
            what = (
                "is a folder, not a config file" if os.path.isdir(path) else "config file not found"
            )
            return f"error: {path}: {what}; pass the path of an existing YAML file to --configfile"
    return None


class _MissingConfigfile(logging.Filter):
    """Rewrites Snakemake's traceback for a ``--configfile`` it could not open."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            exception = getattr(record, "exception", None)
            if record.levelno >= logging.ERROR and exception in (
                "FileNotFoundError",
                "IsADirectoryError",
                "UnicodeDecodeError",
            ):
                text = str(record.msg)
                if "configfile" in text:  # snakemake/common/configfile.py in the traceback
                    paths = command_line_configfiles(sys.argv[1:])
                    line = missing_configfile(paths) or not_utf8(paths)
                    if line:
                        record.msg, record.args = line, ()
        except Exception:  # a logger must never break the run it reports on
            pass
        return True


class _JobNames(logging.Filter):
    """Adds a job's wildcards to Snakemake's "Finished jobid: N (Rule: r)" line."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[int, str] = {}  # jobid -> "dataset=..., encoder=..."

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            event = getattr(record, "event", None)
            if event == LogEvent.JOB_INFO:
                wildcards = getattr(record, "wildcards", None) or {}
                name = ", ".join(f"{k}={v}" for k, v in dict(wildcards).items())
                if name:
                    self.names[int(getattr(record, "jobid", -1))] = name
            elif event == LogEvent.JOB_ERROR:
                self.names.pop(int(getattr(record, "jobid", -1)), None)
            elif event == LogEvent.JOB_FINISHED:
                name = self.names.pop(int(getattr(record, "job_id", -1)), None)
                text = str(record.msg)
                if name and text.endswith(")") and not record.args:
                    record.msg = f"{text[:-1]}; {name})"
        except Exception:  # a logger must never break the run it reports on
            pass
        return True


#: Snakemake's config-file messages -> the check that names the file
_CHECKS = {UNPARSABLE: syntax_error, NOT_A_MAPPING: not_a_mapping}


class LogHandler(LogHandlerBase):
    """Adds one line naming the file after Snakemake's "not valid JSON or YAML" and "keys
    at top level" errors, and turns the
    traceback of a missing ``--configfile`` into one line (:class:`_MissingConfigfile`),
    and names finished jobs by their wildcards (:class:`_JobNames`); silent otherwise."""

    def __post_init__(self) -> None:
        # A logger's filters run before its handlers: Snakemake's own stream handler then
        # prints the rewritten record.  (This handler runs in a queue thread, too late.)
        logger = logging.getLogger("snakemake.logging")
        for kind in (_MissingConfigfile, _JobNames):
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR:
            return
        text = str(record.msg)
        check = next((check for key, check in _CHECKS.items() if key in text), None)
        if check is None:
            return
        try:
            line = check(command_line_configfiles(sys.argv[1:]))
        except Exception:  # a logger must never break the run it reports on
            return
        if line:
            print(line, file=sys.stderr, flush=True)

    @property
    def writes_to_stream(self) -> bool:
        return False  # keep Snakemake's own stream handler: this only adds a line

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True  # every record reaches emit(), which picks its own

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False
