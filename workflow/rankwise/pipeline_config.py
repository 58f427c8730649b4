"""The pipeline's config, checked before any job is built (pure functions for common.smk).

- :func:`load_yaml`: YAML with ``file:line`` syntax errors and duplicated keys as errors
  (a copy-pasted epoch entry that was not renamed would otherwise replace the first).
- :func:`check_config`: the JSON schema (config/schema.yaml, the single source), reported
  as one line: ``file:line: key.path: what is wrong; did you mean ...?``.
- :func:`expand_checkpoints`: ``checkpoints: <glob>`` sweeps -> one encoder per file,
  named ``<entry>@<file stem>`` (a repeated stem by its folders; other characters
  as ``-``: :func:`sweep_names`), in natural order (epoch_2 before epoch_10).
- :func:`check_paths` / :func:`encoder_paths`: every file or folder the config names
  exists before any job runs, so no missing path ever enters the DAG.
- :func:`dataset_fingerprints`: what a loader reads, per split, as one digest (a param of
  ``prepare``, written to ``{split}.fingerprint`` for ``encode``).

Every error is a :class:`~rankwise.errors.RankwiseError` with a one-line message.
Relative paths start from the working directory (Snakemake's ``--directory``).
"""

from __future__ import annotations

import collections
import csv
import difflib
import glob
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from stat import S_ISLNK
from typing import Any, NoReturn

import yaml

from .errors import RankwiseError

#: The option a sweep's files go to, per encoder kind (torch kinds: see issue #10).
CHECKPOINT_OPTION = {
    "python": "checkpoint",
    "onnx": "model",
    "reid": "checkpoint",
    "timm": "checkpoint",
    "torchscript": "model",
}
#: The options naming files an encoder reads, per kind (``factory`` only as a .py file).
ENCODER_FILE_OPTIONS = {
    "python": ("checkpoint", "factory"),
    "onnx": ("model",),
    "precomputed": ("query", "gallery", "path", "ids", "query_ids", "gallery_ids"),
    "reid": ("checkpoint",),
    "timm": ("checkpoint",),
    "torchscript": ("model",),
}
#: The options naming folders (``dir``) or files (``file``) a loader reads.
DATASET_PATH_OPTIONS = {
    "market1501": {"root": "dir"},
    "msmt17": {"root": "dir"},
    "folder": {"root": "dir", "query_dir": "dir", "gallery_dir": "dir"},
    "manifest": {"query": "file", "gallery": "file"},
    "veri776": {"root": "dir"},
    "dukemtmc": {"root": "dir"},
    "cuhk03-np": {"root": "dir"},
    "identity-folders": {"root": "dir"},
    "mot": {"root": "dir"},
}
#: Loaders whose whole ``root`` tree (every file: images, list files, gt.txt,
#: seqinfo.ini) is what both splits are read from.
TREE_LOADERS = ("veri776", "dukemtmc", "cuhk03-np", "identity-folders", "mot")
#: Stands for a sweep's file in the entry's options until :func:`expand_checkpoints`.
SWEEP_PLACEHOLDER = "<one file per match of checkpoints>"
SPLITS = ("query", "gallery")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class CommandLineConfig:
    """The values of Snakemake's ``--config KEY=VALUE`` arguments, merged after every
    config file: listed last among a check's ``files``, an error at a key they set is
    named ``--config`` (not a line of the file whose value they replaced).

    Snakemake reads a value inside a ``--config`` mapping as text (YAML's base loader:
    ``report={resamples: 200}`` gives the string ``'200'``); :func:`check_config` reads
    such a text as the number, boolean or null the schema wants there, as a config file
    would have."""

    def __init__(self, values: Any):
        self.values = values

    def __str__(self) -> str:
        return "--config"

    def sets(self, keys: Sequence[Any]) -> int:
        """How many leading ``keys`` the ``--config`` values set."""
        node, depth = self.values, 0
        for key in keys:
            if isinstance(node, dict) and str(key) in {str(k) for k in node}:
                node = next(v for k, v in node.items() if str(k) == str(key))
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                break
            depth += 1
        return depth


#: A config file, or the ``--config`` values (merged last).
ConfigSource = str | os.PathLike | CommandLineConfig


class ConfigError(RankwiseError):
    """A bad value at a config key path (``keys``); the message starts with that path."""

    def __init__(self, keys: Sequence[Any], what: str):
        super().__init__(f"{key_path(keys)}: {what}")
        self.keys = list(keys)


def _located(error: ConfigError, files: Sequence[ConfigSource]) -> RankwiseError:
    """``error`` prefixed with the ``file:line`` that sets its key (when ``files`` do)."""
    return RankwiseError(f"{_where(files, error.keys)}: {error}") if files else error


# ---------------------------------------------------------------- YAML


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                # <<: *base (copying an entry): SafeLoader merges it below, and a key the
                # mapping sets itself overrides a merged one, as YAML says
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise RankwiseError(
                    f"{self.name}:{line}: key {key!r} given twice (first on line {seen[key]}); "
                    "the second would silently replace the first: rename or remove one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def refuse(error: Exception) -> NoReturn:
    """Stop the Snakemake process on a config error: its one line on stderr (the
    terminal, whatever the logger prints) and exit status 2, as the commands' bad input.
    (``sys.exit(message)`` would exit 1.)"""
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(2)


def load_yaml(path: str | os.PathLike) -> Any:
    """The YAML file at ``path``; syntax errors and duplicated keys raise, naming file and line."""
    from .manifest import read_utf8_text

    file = Path(path)
    try:
        text = read_utf8_text(file, "config file")
    except OSError as exc:
        raise RankwiseError(
            f"{file}: cannot read the config file ({exc}); check the path"
        ) from None
    loader = _UniqueKeyLoader(text)
    loader.name = str(file)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else str(file)
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise RankwiseError(
            f"{where}: YAML syntax error: {what}; check the indentation and quoting there"
        ) from None
    except yaml.YAMLError as exc:
        raise RankwiseError(f"{file}: YAML error: {exc}") from None
    finally:
        loader.dispose()


def _locate(path: ConfigSource, keys: Sequence[Any]) -> tuple[int, int | None]:
    """(how many leading ``keys`` the YAML file sets, the line of the deepest of them);
    for ``--config`` values (line 0), how many of them they set."""
    if isinstance(path, CommandLineConfig):
        depth = path.sets(keys)
        return depth, (0 if depth else None)
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return 0, None
    depth, line = 0, None
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
        depth += 1
    return depth, line


def _where(files: Sequence[ConfigSource], keys: Sequence[Any]) -> str:
    """``file:line`` of the file that sets most of ``keys`` (the last one on a tie: it wins
    the merge), else the last file's name."""
    best = None
    for file in files:
        depth, line = _locate(file, keys)
        if line is not None and (best is None or depth >= best[0]):
            best = (depth, str(file) if isinstance(file, CommandLineConfig) else f"{file}:{line}")
    return best[1] if best else (str(files[-1]) if files else "config")


# ---------------------------------------------------------------- schema


def key_path(keys: Iterable[Any]) -> str:
    """``datasets.market.ks[1]`` for the keys ``("datasets", "market", "ks", 1)``."""
    text = ""
    for key in keys:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text or "(top level)"


def did_you_mean(word: str, choices: Iterable[Any]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, else the list of them."""
    choices = sorted(map(str, choices))
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; valid: {', '.join(choices)}" if choices else ""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(error) -> tuple[list[Any], str]:
    """(key path, what is wrong) for one jsonschema error."""
    keys = list(error.absolute_path)
    kind, schema, instance = error.validator, error.schema, error.instance
    if kind == "additionalProperties" and isinstance(instance, dict):
        known = set(schema.get("properties", {}))
        unknown = [k for k in instance if k not in known]
        key = unknown[0] if unknown else "?"
        return keys + [key], f"unknown key {key!r}{did_you_mean(key, known)}"
    if kind == "enum":
        hint = did_you_mean(instance, error.validator_value)
        return keys, f"{_short(instance)} is not allowed{hint}"
    if kind == "required":
        missing = [
            k for k in error.validator_value if isinstance(instance, dict) and k not in instance
        ]
        return keys, f"missing key {missing[0] if missing else '?'!r}; add it"
    if kind == "type":
        wanted = error.validator_value
        wanted = [wanted] if isinstance(wanted, str) else list(wanted)
        read_as = (  # YAML's reading of an unquoted name or text, when it is not text
            "true or false (so are yes, no, on and off)"
            if isinstance(instance, bool)
            else "a number"
            if isinstance(instance, (int, float))
            else None
        )
        if "propertyNames" in error.schema_path and isinstance(instance, bool):
            return keys, (  # the name as written (yes, on, true, ...) is not known here
                f"a name is read by YAML as {read_as}, not as text; write that name in "
                "quotes (e.g. 'yes':)"
            )
        if "propertyNames" in error.schema_path and read_as:  # a dataset's or encoder's name
            return keys + [str(instance)], (
                f"the name {instance} is read by YAML as {read_as}, not as text; write it "
                f"in quotes ('{instance}':)"
            )
        # only where text alone is wanted: a junk label -1.0 in quotes matches no label
        hint = f"; YAML reads it as {read_as}: write it in quotes" if wanted == ["string"] else ""
        hint = hint if read_as else ""
        return keys, f"expected {' or '.join(wanted)}, got {_short(instance)}{hint}"
    if kind in ("pattern", "not") and "@" in str(instance) and keys[-2:-1] == ["encoders"]:
        entry, _, rest = str(instance).partition("@")
        named = f"{entry}@{name_part(rest)}"
        hint = (  # a file's name as it is, not as its sweep names it (epoch=3 -> epoch-3)
            f"; a sweep writes other characters as -: did you mean {named!r}?"
            if named != instance and _NAME.match(entry) and "@" not in rest
            else ""
        )
        return keys, (
            f"{_short(instance)} is neither an encoder name nor entry@name (one checkpoint "
            f"of a sweep, as the sweep names it): letters, digits and _ . + - around one @{hint}"
        )
    if kind in ("pattern", "not"):  # only the names' pattern uses these
        return keys, (
            f"name {_short(instance)} cannot be a folder name; use letters, digits "
            "and _ . + - (not ending in .tmp, .zarr, .json or .txt)"
        )
    if kind == "anyOf":
        hint = error.schema.get("description") or "see config/schema.yaml"
        return keys, f"{_short(instance)} is not allowed ({hint})"
    return keys, error.message if len(error.message) <= 160 else error.message[:157] + "..."


#: A YAML 1.2 float with an exponent and no dot (``1e-4``): YAML 1.1, which Snakemake's
#: parser follows, reads it as a string.
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+")


def _numbers_from_text(
    config: dict, validator, command_line: CommandLineConfig | None = None
) -> None:
    """Replace (in place) each string that the schema wants as a number and that is a
    float written the YAML 1.2 way (``fprs: [1e-4]``, ``lambda: 3e-1``) by that float:
    the documented configs mean the number, not the text.  A text that ``--config``
    set (``command_line``; Snakemake reads every value inside a ``--config`` mapping as
    text) is read as YAML where the schema wants a number, boolean or null there."""
    kinds = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }

    def from_command_line(error, wanted: list[str]) -> Any:
        """The value a ``--config`` text stands for, where the schema wants it; else
        the text itself."""
        text, keys = error.instance, error.absolute_path
        if command_line is None or command_line.sets(keys) < len(keys):
            return text
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            return text
        return value if any(w in kinds and kinds[w](value) for w in wanted) else text

    def all_errors(errors):  # an anyOf's (a loader's branch) errors sit in its context
        for error in errors:
            yield error
            yield from all_errors(error.context or ())

    for error in list(all_errors(validator.iter_errors(config))):
        wanted = error.validator_value if error.validator == "type" else ()
        wanted = [wanted] if isinstance(wanted, str) else wanted
        if not (wanted and isinstance(error.instance, str) and error.absolute_path):
            continue
        if "number" in wanted and _EXPONENT_FLOAT.fullmatch(error.instance.strip()):
            value: Any = float(error.instance)
        else:
            value = from_command_line(error, wanted)
            if value is error.instance:
                continue
        *parents, last = error.absolute_path
        node = config
        for key in parents:
            node = node[key]
        node[last] = value


def check_config(config: dict, schema: dict, *, files: Sequence[ConfigSource] = ()) -> None:
    """Raise one RankwiseError line for the first schema violation of ``config``.

    ``files`` are the config files in merge order; the message names the one (and its
    line) that sets the offending key. Defaults are not filled here (Snakemake's
    ``validate()`` does that afterwards, on a config known to be valid).  Numbers that
    YAML 1.1 read as text (``1e-4``) become numbers first (:func:`_numbers_from_text`).
    """
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import best_match

    # JSON Schema's "integer" takes 5.0; the jobs' options do not (ks, seed, sizes, and
    # junk label -1.0, which as a string matches no label): an int, and not a bool
    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    strict = validators.extend(Draft202012Validator, type_checker=checker)(schema)
    command_line = next((f for f in files if isinstance(f, CommandLineConfig)), None)
    _numbers_from_text(config, strict, command_line)
    error = best_match(strict.iter_errors(config))
    if error is None:
        return
    keys, what = _describe(error)
    where = _where(files, keys)
    raise RankwiseError(f"{where}: {key_path(keys)}: {what}")


def check_dataset_encoders(datasets: dict, encoders: dict, sweeps: dict[str, list[str]]) -> None:
    """Every name in ``datasets.<name>.encoders`` is an encoder (or a sweep's entry)."""
    known = set(encoders) | set(sweeps)
    for name, dataset in datasets.items():
        if (dataset or {}).get("encoders") == []:
            raise ConfigError(
                ["datasets", name, "encoders"],
                "an empty list evaluates nothing; list encoder names, or null for every encoder",
            )
        for encoder in (dataset or {}).get("encoders") or []:
            entry, _, stem = encoder.partition("@")
            if encoder not in known and stem and entry in sweeps:
                found = [n.partition("@")[2] for n in sweeps[entry]]
                raise ConfigError(
                    ["datasets", name, "encoders"],
                    f"{encoder!r}: the sweep {entry!r} has no checkpoint {stem!r}"
                    f"{did_you_mean(stem, found)} (it has: {', '.join(found) or 'none'})",
                )
            if encoder not in known:
                raise ConfigError(
                    ["datasets", name, "encoders"],
                    f"{encoder!r} is not under `encoders:`{did_you_mean(encoder, known)}",
                )


def rerank_flags(dataset: dict) -> str:
    """A checked dataset entry's query expansion and re-ranking as `rankwise rank` flags
    ("" = none).  ``drop_junk`` goes with them only: alone it changes nothing (junk rows
    are never ranked), so it changes no param and reruns nothing, like an option the
    protocol does not take."""
    from .options import recorded_rerank
    from .registry import get_protocol

    flags = []
    if dataset.get("aqe") is not None:
        flags.append(f"--aqe {dataset['aqe']['k']},{dataset['aqe']['alpha']}")
    if dataset.get("rerank") is not None:  # k1,k2,lambda[,variant], in field order
        flags.append("--rerank " + ",".join(map(str, recorded_rerank(dataset["rerank"]).values())))
    taken = "drop_junk" in get_protocol(dataset["protocol"]).options
    if flags and taken and dataset.get("drop_junk"):
        flags.append("--drop-junk")
    return " ".join(flags)


def _scalar_text(files: Sequence[ConfigSource], keys: Sequence[Any]) -> str | None:
    """The text of the scalar at ``keys`` as written in the last of ``files`` that sets it
    (it wins the merge), or None."""
    text = None
    for file in files:
        if isinstance(file, CommandLineConfig):
            if file.sets(keys) == len(keys):  # text already: never read as a number
                text = None
            continue
        try:
            node = yaml.compose(Path(file).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        for key in keys:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == str(key)), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
                node = node.value[key] if key < len(node.value) else None
            else:
                node = None
            if node is None:
                break
        if isinstance(node, yaml.ScalarNode):
            text = node.value
    return text


def check_junk_labels(datasets: dict, files: Sequence[ConfigSource] = ()) -> None:
    """No junk label holds a comma: the jobs get the list as ``--junk-labels a,b``, so
    ``"a,b"`` would silently become the two labels ``a`` and ``b``.  And an unquoted
    label that YAML 1.1 (Snakemake's parser) reads as another number than written
    (``010`` is octal 8, ``0x1F``, ``1_000``, ``+5``, ``0001`` is 1) is refused: labels
    compare as strings, so ``010`` silently junked label ``8``."""
    for name, dataset in datasets.items():
        for i, label in enumerate(dataset.get("junk_labels") or ()):
            keys = ["datasets", name, "junk_labels", i]
            if isinstance(label, int) and not isinstance(label, bool):
                written = _scalar_text(files, keys)
                if written is not None and written.strip() != str(label):
                    raise ConfigError(
                        keys,
                        f"{written} is read by YAML as the number {label}, so the junk label "
                        f"would be {str(label)!r}; quote it (junk_labels: ['{written}'])",
                    )
            if "," in str(label):
                raise ConfigError(
                    ["datasets", name, "junk_labels", i],
                    f"{label!r} holds a comma, which the jobs' command line reads as two "
                    "labels; rename that label in the manifests, or use the Python API "
                    "(rankwise.api), whose lists take any label",
                )


def check_precomputed(encoders: dict) -> None:
    """A precomputed entry names one file per split: the pipeline encodes the query and
    the gallery from the same options, so ``path`` (with ``ids``) or a fixed ``split``
    would give both splits the same rows (the query ranked against itself, exit 0)."""
    for name, entry in encoders.items():
        if entry["kind"] != "precomputed":
            continue
        options = entry["options"]
        for key in ("path", "ids"):
            if options.get(key) is not None:
                fix = "query and gallery" if key == "path" else "query_ids and gallery_ids"
                raise ConfigError(
                    ["encoders", name, "options", key],
                    f"one file for both splits: the pipeline encodes the query and the "
                    f"gallery from this entry; give options {fix} instead",
                )
        if options.get("split", "auto") != "auto":
            raise ConfigError(
                ["encoders", name, "options", "split"],
                f"{options['split']!r}: the pipeline encodes both splits from this entry, "
                "each from its own file; remove split",
            )
        for key in ("query", "gallery"):
            if options.get(key) is None:
                raise ConfigError(
                    ["encoders", name, "options"],
                    f"missing {key}: the pipeline encodes the query and the gallery, each "
                    "from its own file (options query and gallery)",
                )
        # on_missing: drop aligns by id: each split needs its ids, from an ids file or the
        # 'ids' array of a Zarr group (a folder: opened by the encode job, which says so
        # when it has none); before, a missing one failed the encode job, after the others
        for key in ("query", "gallery") if options.get("on_missing") == "drop" else ():
            features = Path(str(options[key])).expanduser()
            if options.get(f"{key}_ids") is None and not features.is_dir():
                raise ConfigError(
                    ["encoders", name, "options", f"{key}_ids"],
                    f"missing: on_missing: drop matches the {key} rows by id, and "
                    f"{options[key]} is a file without ids; give options {key}_ids (one id "
                    "per feature row), or a Zarr group holding an 'ids' array",
                )


def check_reranking(datasets: dict) -> None:
    """``datasets.<name>.rerank`` / ``aqe`` / ``verification``: what the schema cannot say
    (k2 <= k1, a protocol they apply to), as :func:`rankwise.options.check_rerank` and
    :func:`~rankwise.options.check_verification`; a partial mapping gets its defaults
    filled in (in place).  (``drop_junk`` without either changes nothing:
    :func:`rerank_flags`.)  And ``ap: trapezoid`` on a protocol that reports no AP
    (:func:`rankwise.options.check_ap`)."""
    from .options import (
        AQE,
        RERANK,
        check_ap,
        check_rerank,
        check_rerank_alone,
        check_verification,
    )

    for name, dataset in datasets.items():
        try:
            if dataset.get("ap", "standard") != "standard":
                check_ap(dataset["ap"], dataset["protocol"])
        except RankwiseError as error:
            raise ConfigError(["datasets", name, "ap"], str(error)) from None
        for spec in (AQE, RERANK):  # the error at the key, not the dataset's line
            given = dataset.get(spec.name)
            if given is None:
                continue
            try:
                dataset[spec.name] = check_rerank(given, dataset["protocol"], spec.name, spec)
            except RankwiseError as error:
                # a default in the message (k2 = 6 against k1: 4) says it is one
                left = [f.name for f in spec.fields if isinstance(given, dict)]
                unset = [n for n in left if n not in given and f"{n}=" in str(error)]
                note = "".join(
                    f" ({n} is the default {spec.fields[left.index(n)].default}: set it)"
                    for n in unset
                )
                raise ConfigError(["datasets", name, spec.name], f"{error}{note}") from None
        try:
            if dataset.get("verification") is not None:
                dataset["verification"] = check_verification(
                    dataset["verification"],
                    dataset["protocol"],
                    dataset.get("multi_query", "none"),
                )
            check_rerank_alone(
                dataset.get("rerank"),
                dataset.get("aqe"),
                dataset.get("multi_query", "none"),
                dataset.get("single_gallery_shot", False),
            )
        except RankwiseError as error:
            raise ConfigError(["datasets", name], str(error)) from None


def check(config: dict, schema_path: str | os.PathLike, files: Sequence[ConfigSource] = ()) -> None:
    """Check the config files and the merged ``config`` before Snakemake's ``validate()``.

    Re-reads ``files`` for duplicated keys (Snakemake's loader keeps the last), gives each
    dataset and encoder entry its own ``options`` dict (``validate()`` would otherwise
    share one default object between entries), marks sweep entries
    (:func:`mark_sweeps`) and raises the first schema violation as one line.
    """
    for file in files:
        if not isinstance(file, CommandLineConfig) and Path(file).is_file():
            load_yaml(file)
    for section in ("datasets", "encoders"):
        entries = config.get(section)
        # not a mapping (``encoders: [a, b]``, the form of a dataset's list): the schema
        # check below says so in one line
        for entry in entries.values() if isinstance(entries, dict) else ():
            if isinstance(entry, dict):
                entry.setdefault("options", {})
    encoders = config.get("encoders")
    if isinstance(encoders, dict):
        try:
            mark_sweeps(encoders)
        except ConfigError as error:
            raise _located(error, files) from None
    check_config(config, load_yaml(schema_path), files=files)
    for section, what in (("datasets", "dataset"), ("encoders", "encoder")):
        if not config.get(section):
            raise RankwiseError(
                f"{_where(files, [section])}: {section}: none defined; add at least one "
                f"{what} (see config/config.yaml)"
            )


def ignored_protocol_options(datasets: dict) -> list[tuple[list[Any], str]]:
    """``(key path, note)`` for each option of a dataset that its protocol does not take,
    set to a value other than its default: the jobs rank without it (``multi_query:
    mean`` under ``recall`` gives plain recall numbers).  Not an error, unlike on the
    command line: a config may share one block of options between datasets of several
    protocols (a YAML anchor), so each is named in a note on the terminal, and changing
    it reruns nothing.  Options that only wait for another of the dataset's own options
    are not named: ``shot_repeats`` / ``shot_seed`` with single-gallery-shot off,
    ``drop_junk`` without re-ranking or query expansion (:func:`rerank_flags`)."""
    from .options import JUNK_LABELS, PROTOCOL_OPTIONS
    from .registry import REGISTRY, get_protocol

    notes = []
    for name, dataset in datasets.items():
        protocol = dataset.get("protocol")
        if protocol not in REGISTRY:  # the schema's error
            continue
        taken = get_protocol(protocol).options
        for spec in PROTOCOL_OPTIONS:
            if spec.name not in dataset or spec.name in taken:
                continue
            value = dataset[spec.name]
            if spec is JUNK_LABELS and isinstance(value, list):
                value = tuple(str(v) for v in value)  # YAML integers: the labels' text
            if value == spec.default:
                continue
            takers = [n for n, other in REGISTRY.items() if spec.name in other.options]
            notes.append(
                (
                    ["datasets", name, spec.name],
                    f"applies to protocol {' or '.join(takers)} only, not {protocol!r}: "
                    f"ignored (set protocol: {takers[0]} to use it, or remove it)",
                )
            )
    return notes


def resolve(config: dict, files: Sequence[ConfigSource] = ()) -> tuple[dict, dict]:
    """After ``validate()``: expand sweeps, check encoder names and every path.

    Returns ``(encoders, sweeps)`` as :func:`expand_checkpoints`; each dataset's
    ``encoders`` list (in place) names the expanded encoders. An error's message starts
    with the ``file:line`` (of ``files``) that sets the offending key.
    """
    try:
        encoders, sweeps = expand_checkpoints(config["encoders"])
        datasets = config["datasets"]
        check_name_lengths(datasets, encoders, sweeps)
        check_dataset_encoders(datasets, encoders, sweeps)
        for keys, note in ignored_protocol_options(datasets):
            print(f"note: {_where(files, keys)}: {key_path(keys)}: {note}", file=sys.stderr)
        check_reranking(datasets)
        check_junk_labels(datasets, files)
        check_precomputed(encoders)
        for dataset in datasets.values():
            dataset["encoders"] = expand_names(dataset["encoders"], sweeps)
        check_paths(datasets, encoders, sweeps)
        check_manifest_images(datasets, encoders)
    except ConfigError as error:
        raise _located(error, files) from None
    return encoders, sweeps


#: The longest dataset or encoder name: each is a file name with a suffix
#: (``<encoder>.zarr.lock``, ``<dataset>-progressive.pdf``; a report's temporary file
#: ``.<name>.<pid>.<random>.tmp`` adds 22) and a file name's bytes are at most 255 on
#: common file systems.
MAX_NAME = 200

#: Snakemake takes a wildcard value ending in one substring repeated 20 times or more
#: for a runaway recursion (its PeriodicityDetector) and stops the run.
_PERIODIC = re.compile(r"(.+)\1{19,}$")


def check_name_lengths(datasets: dict, encoders: dict, sweeps: dict[str, list[str]]) -> None:
    """Refuse a name longer than :data:`MAX_NAME` (the jobs' file names would fail
    mid-run: "File name too long") or one Snakemake would refuse as periodic."""
    origin = {e: s for s, names in sweeps.items() for e in names}
    for section, names in (("datasets", datasets), ("encoders", encoders)):
        for name in names:
            keys = [section, origin.get(name, name)]
            where = "" if name not in origin else f" (the checkpoint {name})"
            if len(name) > MAX_NAME:
                raise ConfigError(
                    keys,
                    f"name{where} is {len(name)} characters long; at most {MAX_NAME} "
                    "(it names files): shorten it" + (" or the file" if where else ""),
                )
            repeated = _PERIODIC.search(name)
            if repeated:
                times = len(repeated[0]) // len(repeated[1])
                raise ConfigError(
                    keys,
                    f"name{where} ends in {repeated[1]!r} repeated {times} times, which "
                    "Snakemake refuses (it takes it for a runaway recursion); rename it",
                )


# ---------------------------------------------------------------- checkpoint sweeps


def natural_key(text: str) -> list:
    """Sort key putting ``epoch_2`` before ``epoch_10`` (digit runs compare as numbers)."""
    return [
        # isdecimal, as the split's \d: '²' is a digit to isdigit() but not to int()
        (0, int(part), part) if part.isdecimal() else (1, 0, part.lower())
        for part in re.split(r"(\d+)", text)
        if part
    ]


def mark_sweeps(encoders: dict) -> None:
    """Put :data:`SWEEP_PLACEHOLDER` in each sweep entry's checkpoint option (in place).

    The schema then checks the entry like a single-file one (e.g. ``onnx`` requires
    ``model``); :func:`expand_checkpoints` replaces the placeholder by each file.
    """
    for name, entry in encoders.items():
        if not isinstance(entry, dict) or "checkpoints" not in entry:
            continue
        kind = entry.get("kind")
        if kind not in CHECKPOINT_OPTION:
            raise ConfigError(
                ["encoders", name, "checkpoints"],
                f"kind {kind!r} reads no checkpoint file; use one of "
                f"{', '.join(CHECKPOINT_OPTION)}, or remove checkpoints",
            )
        options = entry.setdefault("options", {})
        option = CHECKPOINT_OPTION[kind]
        if isinstance(options, dict):
            if options.get(option) not in (None, SWEEP_PLACEHOLDER):
                raise ConfigError(
                    ["encoders", name, "options", option],
                    "give either checkpoints or this option, not both",
                )
            options[option] = SWEEP_PLACEHOLDER


def expand_checkpoints(encoders: dict) -> tuple[dict, dict[str, list[str]]]:
    """Expand ``checkpoints: <glob>`` entries into one encoder per matching file.

    Returns ``(encoders, sweeps)``: the encoders with each sweep entry ``e`` replaced, in
    place in the config order, by ``e@<name>`` entries (:func:`sweep_names`, in natural
    order of the files' stems, then of their paths) whose kind's checkpoint option
    (:data:`CHECKPOINT_OPTION`) is the file; and ``sweeps``, entry name -> its expanded
    names. The glob is evaluated now: files that appear later join on the next run. A
    pattern matching no file, or two files given one name, is an error.
    """
    expanded, sweeps = {}, {}
    for name, entry in encoders.items():
        pattern = entry.get("checkpoints") if isinstance(entry, dict) else None
        if pattern is None:
            expanded[name] = entry
            continue
        option = CHECKPOINT_OPTION[entry["kind"]]
        found = glob.glob(os.path.expanduser(pattern), recursive=True)
        files = [f for f in found if os.path.isfile(f)]
        if not files:
            folders = sorted((f for f in found if os.path.isdir(f)), key=natural_key)
            if folders:  # Hugging Face's checkpoint-*/: the weights are a file inside
                raise ConfigError(
                    ["encoders", name, "checkpoints"],
                    f"{pattern!r} matches {len(folders)} folder(s) ({folders[0]}, ...) and no "
                    f"file; a checkpoint is a file: add the file's name to the pattern "
                    f"({folder_advice(folders[0])})",
                )
            raise ConfigError(
                ["encoders", name, "checkpoints"],
                f"{pattern!r} matches no file (relative paths start from "
                f"{os.getcwd()}); check the pattern",
            )
        # in natural order of each file's own stem, then of its path: a run's epoch named
        # by its path (a-epoch_2, b-epoch_2) stays among the epochs (after epoch_1), not
        # before them all
        named = sorted(
            zip(sweep_names(os.path.expanduser(pattern), files), files, strict=True),
            key=lambda pair: (
                natural_key(name_part(checkpoint_stem(pair[1]))),
                natural_key(pair[1]),
            ),
        )
        seen: dict[str, str] = {}
        for stem, file in named:
            if stem in seen:
                raise ConfigError(
                    ["encoders", name, "checkpoints"],
                    f"{seen[stem]} and {file} would both be the encoder {name}@{stem}; "
                    "narrow the pattern, or rename one of the files",
                )
            if stem.endswith((".tmp", ".zarr", ".json", ".txt")):
                # the schema's rule for names: ep.json.pt would make metrics files
                # run@ep.json.json beside run@ep.json (the one of run@ep)
                raise ConfigError(
                    ["encoders", name, "checkpoints"],
                    f"{file}: the name {stem!r} cannot be part of an encoder name (it ends "
                    "in .tmp, .zarr, .json or .txt); rename the file",
                )
            seen[stem] = file
            base = {k: v for k, v in entry.items() if k != "checkpoints"}
            expanded[f"{name}@{stem}"] = {
                **base,
                "options": {**entry.get("options", {}), option: file},
            }
        sweeps[name] = [f"{name}@{stem}" for stem in seen]
    return expanded, sweeps


def sweep_names(pattern: str, files: Sequence[str]) -> list[str]:
    """The name (after ``<entry>@``) a sweep gives each of ``files``, matches of ``pattern``.

    Each file's :func:`checkpoint_stem` (``epoch_60.pth`` -> ``epoch_60``). A stem two or
    more files share (Hugging Face's ``checkpoint-500/model.safetensors``,
    ``checkpoint-1000/model.safetensors``) names none of them: each of those files is named
    by its path below the pattern's fixed leading folder (:func:`_fixed_folder`), its own
    name's suffix dropped as :func:`checkpoint_stem` drops it, with ``/`` as ``-``:
    ``checkpoint-500-model``. Either way, a character an encoder name may not hold becomes
    ``-`` (:func:`name_part`): Lightning's ``epoch=3-step=100.ckpt`` -> ``epoch-3-step-100``.

    A stem that a path name repeats (``runs/a/model.pt`` -> ``a-model`` beside
    ``runs/c/a-model.pt``) is shared too: that file is named by its path as well
    (``c-a-model``). Names are compared as they will be, after :func:`name_part`
    (``a/epoch=1.ckpt`` and ``b/epoch-1.ckpt``: ``a-epoch-1``, ``b-epoch-1``).

    Only the files of a shared name are named by their paths, so a file that joins a
    sweep renames only those whose names it repeats: a new run folder
    whose ``epoch_5.pth`` repeats an older run's renames that file alone, not every
    checkpoint of the sweep (each rename is evaluated again under its new name).
    """
    fixed = _fixed_folder(pattern)
    stems = [name_part(checkpoint_stem(file)) for file in files]
    paths = [
        name_part("-".join([*Path(os.path.relpath(Path(file).parent, fixed)).parts, stem]))
        for file, stem in zip(files, stems, strict=True)
    ]
    # a path name may be another file's stem (runs/a/model.pt -> a-model beside
    # runs/c/a-model.pt): that file is named by its path too, until no stem is shared
    # (each round names more files by their paths, so this ends); names still shared
    # are the caller's error
    by_path = [False] * len(files)
    while True:
        names = [p if b else s for s, p, b in zip(stems, paths, by_path, strict=True)]
        counts = collections.Counter(names)
        shared = [i for i, n in enumerate(names) if counts[n] > 1 and not by_path[i]]
        if not shared:
            return names
        for i in shared:
            by_path[i] = True


def name_part(text: str) -> str:
    """``text`` with each character an encoder name may not hold (anything but ASCII
    letters, digits and ``_ . + -``) replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", text)


def _fixed_folder(pattern: str) -> Path:
    """The folders of ``pattern`` before its first component holding a wildcard
    (``runs/checkpoint-*/model.safetensors`` -> ``runs``; ``.`` when the first has one)."""
    fixed = []
    for part in Path(pattern).parts[:-1]:
        if re.search(r"[*?[]", part):
            break
        fixed.append(part)
    return Path(*fixed)


def expand_names(names: Sequence[str] | None, sweeps: dict[str, list[str]]) -> list[str] | None:
    """A dataset's ``encoders:`` list with each sweep entry replaced by its checkpoints."""
    if names is None:
        return None
    return list(dict.fromkeys(n for name in names for n in sweeps.get(name, [name])))


_CHECKPOINT_SUFFIXES = (
    ".pth.tar",
    ".pth",
    ".pt",
    ".tar",
    ".onnx",
    ".safetensors",
    ".ckpt",
    ".bin",
    ".jit",
    ".torchscript",
)
_TORCHREID_NAME = re.compile(r"^(?P<base>.+)\.pth\.tar-(?P<epoch>\d+)$")


def folder_advice(folder: str) -> str:
    """What to write instead of a folder where a checkpoint or model file belongs (a
    Hugging Face Trainer's ``checkpoint-500/``): the checkpoint-like files inside it."""
    try:
        inside = sorted(
            entry.name
            for entry in os.scandir(str(folder))
            if entry.is_file() and entry.name.lower().endswith(_CHECKPOINT_SUFFIXES)
        )
    except OSError:
        inside = []
    if not inside:
        return "name the file itself"
    shown = ", ".join(os.path.join(str(folder), name) for name in inside[:3])
    return f"name the file itself: {shown}{', ...' if len(inside) > 3 else ''}"


def checkpoint_stem(path: str | os.PathLike) -> str:
    """The name a sweep gives a checkpoint file: its name without the checkpoint suffix.

    ``epoch_60.pth`` -> ``epoch_60``; ``model.pth.tar`` -> ``model``; torchreid's
    ``model.pth.tar-60`` -> ``model-60`` (the epoch kept, so every epoch has its own name);
    fast-reid's ``model_0059999.pth`` -> ``model_0059999``; any other name: ``Path.stem``.
    """
    name = Path(path).name
    torchreid = _TORCHREID_NAME.match(name)
    if torchreid:
        return f"{torchreid['base']}-{torchreid['epoch']}"
    for suffix in _CHECKPOINT_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return Path(name).stem


# ---------------------------------------------------------------- paths


def encoder_options(options: dict) -> str:
    """The encode rule's ``--options`` (a param: a change reruns encode): the entry's
    options as ``validate()`` filled them in, in JSON, those recorded only when set left
    out at their default (:meth:`rankwise.options.OptionSet.recorded`), so adding such an
    option to rankwise reruns nothing (:data:`rankwise.options.UNRECORDED_ENCODER_OPTIONS`:
    an option a kind lacks is never in its entry)."""
    from .options import UNRECORDED_ENCODER_OPTIONS, recorded

    return json.dumps(recorded(UNRECORDED_ENCODER_OPTIONS, options), sort_keys=True)


def encoder_paths(kind: str, options: dict, split: str | None = None) -> list[str]:
    """The files (or Zarr folders) an encoder reads; ``split`` picks a precomputed split.
    An ONNX model's external data files (:mod:`rankwise.onnx_files`) follow the model.

    ``~`` expanded, as the encoders expand it: these are the encode rule's inputs, and
    Snakemake refuses a path starting with ``~`` (MissingInputException) after the
    config check passed it."""
    paths = []
    for key in ENCODER_FILE_OPTIONS.get(kind, ()):
        value = options.get(key)
        if not value:
            continue
        if kind == "python" and key == "factory":
            value = str(value).rpartition(":")[0]
            if not value.endswith(".py"):
                # module:function: its source file where the encoder finds the user's
                # own code (PYTHONPATH, the project folder), so that editing it reruns
                # encode as editing a file.py factory does; an installed module: nothing
                value = module_source(value)
                if value is None:
                    continue
        if kind == "precomputed" and split is not None:
            key_split = key.removesuffix("_ids")  # query_ids go with query
            if key_split in SPLITS and key_split != split:
                continue
        paths.append(os.path.expanduser(str(value)))
        if kind == "onnx" and key == "model":  # its weights may be files of their own
            from .onnx_files import external_data_files

            paths += [str(p) for p in external_data_files(paths[-1])]
    return paths


def module_source(module: str) -> str | None:
    """The source file of ``module`` (``a.b``: ``a/b.py`` or ``a/b/__init__.py``) in a
    ``PYTHONPATH`` folder or the working directory (the encoder's fallback for a
    ``module:function`` factory), found without importing anything; ``None`` for a
    module found elsewhere (an installed package)."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    folders = [f for f in os.environ.get("PYTHONPATH", "").split(os.pathsep) if f]
    for folder in [*folders, os.curdir]:
        base = os.path.join(folder, *parts) if folder != os.curdir else os.path.join(*parts)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def _missing(path: str, want: str = "any") -> bool:
    path = os.path.expanduser(path)
    return not {"file": os.path.isfile, "dir": os.path.isdir, "any": os.path.exists}[want](path)


def check_paths(datasets: dict, encoders: dict, sweeps: dict[str, list[str]] | None = None) -> None:
    """Raise for the first file or folder named by the config that does not exist."""
    where = f"relative paths start from {os.getcwd()}"
    for name, dataset in datasets.items():
        if dataset["loader"] == "folder":  # its fingerprint and jobs follow the layout
            from .datasets import folder_layout

            try:
                folder_layout(dataset["options"])
            except RankwiseError as error:
                raise ConfigError(["datasets", name, "options"], str(error)) from None
        for key, want in DATASET_PATH_OPTIONS.get(dataset["loader"], {}).items():
            value = dataset["options"].get(key)
            if value and _missing(str(value), want):
                what = "folder" if want == "dir" else "file"
                raise ConfigError(
                    ["datasets", name, "options", key],
                    f"{what} {value} not found ({where}); fix the path",
                )
    origin = {e: s for s, names in (sweeps or {}).items() for e in names}
    for name, entry in encoders.items():
        for key in ENCODER_FILE_OPTIONS.get(entry["kind"], ()):
            for path in encoder_paths(entry["kind"], {key: entry["options"].get(key)}):
                # a sweep's entry is named in the config file without its @stem
                keys = ["encoders", origin.get(name, name), "options", key]
                if "{" in path or "}" in path:  # an input of the encode rule
                    raise ConfigError(
                        keys,
                        f"{path}: Snakemake reads braces in a path as wildcards; rename "
                        "the file or folder without '{' and '}'",
                    )
                if _missing(path):
                    raise ConfigError(
                        keys, f"{path} not found ({where}); fix the path or remove the entry"
                    )
                if os.path.isdir(path) and not _may_be_folder(entry["kind"], key):
                    raise ConfigError(
                        keys, f"{path} is a folder, not a file; {folder_advice(path)}"
                    )
                if entry["kind"] == "python" and key == "factory":
                    spec = str(entry["options"][key])
                    if spec.rpartition(":")[0].endswith(".py"):  # module:function: imported
                        _check_factory(path, spec, keys)


def _may_be_folder(kind: str, key: str) -> bool:
    """Whether an encoder's file option may name a folder: precomputed embeddings (a Zarr
    store); every other one names a file (a checkpoint, a model, ids, a factory)."""
    return kind == "precomputed" and key in ("query", "gallery", "path")


def check_manifest_images(datasets: dict, encoders: dict) -> None:
    """Every image a ``manifest`` dataset's CSVs name exists, when one of its encoders
    reads images (all kinds but ``precomputed``): a missing one failed that split's
    encode jobs after others had run, naming the pipeline's copy of the manifest
    (``results/manifests/<dataset>/``, paths rebased there) instead of the user's CSV."""
    for name, dataset in datasets.items():
        if dataset["loader"] != "manifest":
            continue
        kinds = {encoders[e]["kind"] for e in dataset["encoders"] or encoders if e in encoders}
        if not kinds - {"precomputed"}:
            continue
        for split in SPLITS:
            missing = _missing_images(Path(os.path.expanduser(dataset["options"][split])))
            if missing:
                (row, item, raw, path), more = missing[0], len(missing) - 1
                others = f" ({more} more row{'' if more == 1 else 's'} too)" if more else ""
                raise ConfigError(
                    ["datasets", name, "options", split],
                    f"{dataset['options'][split]}: row {row} (id {item!r}): image {raw!r} not "
                    f"found (looked for {path}){others}; fix the 'path' column or restore "
                    "the file",
                )


def _missing_images(csv_path: Path) -> list[tuple[int, str, str, Path]]:
    """``(row, id, path as written, path looked for)`` of each row of the manifest CSV
    whose image does not exist (rows numbered by the file's lines, header = 1; paths
    relative to the CSV's folder, as ``rankwise prepare`` and ``encode`` read them).
    A CSV the csv module cannot read, or without ``path``: none (prepare says what is
    wrong)."""
    missing = []
    for line, item, raw in _manifest_paths(csv_path) or []:
        path = Path(raw) if Path(raw).is_absolute() else csv_path.parent / raw
        if not _exists(path):
            missing.append((line, item, raw, path))
    return missing


def _manifest_paths(csv_path: Path) -> list[tuple[int, str, str]] | None:
    """``(line, id, path as written)`` of each row of the manifest CSV that names a path
    (header = line 1; id ``"?"`` without an ``id`` column), read as ``read_manifest``
    does (utf-8-sig: a byte-order mark is not part of the first column's name); None
    when it has no ``path`` column or the csv module cannot read it."""
    from .manifest import any_field_size

    rows = []
    with (
        open(csv_path, newline="", encoding="utf-8-sig", errors="surrogateescape") as handle,
        any_field_size(),
    ):
        reader = csv.reader(handle)
        try:
            header = [c.strip() for c in next(reader, [])]
            if "path" not in header:
                return None
            column = header.index("path")
            id_column = header.index("id") if "id" in header else None
            for row in reader:
                # spaces and tabs, as read_manifest strips values (a no-break space stays)
                raw = row[column].strip(" \t") if column < len(row) else ""
                if raw:
                    item = (
                        row[id_column].strip(" \t")
                        if id_column is not None and id_column < len(row)
                        else "?"
                    )
                    rows.append((reader.line_num, item, raw))
        except csv.Error:
            return None
    return rows


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a NUL in the name: prepare names the row
        return True


def _check_factory(path: str, spec: str, keys: list[Any]) -> None:
    """``file.py:function``: the file parses and defines ``function`` at its top level
    (read, not imported: a typo fails here, not in the encode job after prepare ran)."""
    import ast

    attr = spec.rpartition(":")[2]
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except SyntaxError as exc:
        raise ConfigError(keys, f"{path}:{exc.lineno}: Python syntax error ({exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(keys, f"{path}: cannot read it ({exc})") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return  # names we cannot see without importing it
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif not isinstance(node, ast.Expr):
            return  # if/try/for blocks may define it: the encode job will tell
    if attr not in names:
        raise ConfigError(
            keys, f"{path} defines no {attr!r}{did_you_mean(attr, names)}; fix the function name"
        )


# ---------------------------------------------------------------- dataset fingerprints


def _digest(lines: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


class _ManifestPaths:
    """Each file's path as a manifest written to folder ``manifests`` holds it
    (:func:`rankwise.datasets.relative_path`: links resolved, relative to the manifests'
    real folder), so a fingerprint changes exactly when those paths do: a link on the way
    pointed at a copy with the same names, sizes and mtimes changes it; a project moved
    with its data does not (a move away from data outside it does). One realpath and one
    relpath per folder, not per file (20k realpath calls cost ~0.25 s per Snakemake
    start); a linked file is read as its link's target (one ``readlink``), whose folder
    is resolved once per folder as written in the links, and only a target that is a
    link again (a chain) costs a realpath of its own."""

    def __init__(self, manifests: str | os.PathLike) -> None:
        self.base = os.path.realpath(manifests)
        self.folders: dict[str, str] = {}  # folder as walked -> relative real folder
        self.real: dict[str, str] = {}  # real folder -> relative to base

    def _relative(self, real_folder: str) -> str:
        if real_folder not in self.real:
            self.real[real_folder] = os.path.relpath(real_folder, self.base)
        return self.real[real_folder]

    def _in_folder(self, folder: str, name: str) -> str:
        """``folder/name`` as a manifest holds it, ``name`` not a link (``folder`` may
        hold links and ``..``: resolved as realpath resolves them, links first)."""
        if folder not in self.folders:
            self.folders[folder] = self._relative(os.path.realpath(folder))
        return os.path.join(self.folders[folder], name)

    def absolute(self, path: str, link: bool) -> str:
        """``path``'s real path, absolute (links resolved through the same caches)."""
        return os.path.normpath(os.path.join(self.base, self(path, link)))

    def __call__(self, path: str, link: bool) -> str:
        if not link:
            return self._in_folder(*os.path.split(path))
        # a link's own folder says nothing of where it points: its target's folder does
        # (relative targets start from the link's folder; os.path.join keeps absolute ones)
        target = os.path.join(os.path.dirname(path), os.readlink(path))
        folder, name = os.path.split(target)
        if name in ("", ".", "..") or S_ISLNK(os.lstat(target).st_mode):
            folder, name = os.path.split(os.path.realpath(path))  # a chain of links
            return os.path.join(self._relative(folder), name)
        return self._in_folder(folder, name)


def _stat_line(
    label: str,
    path: str | os.PathLike,
    real: _ManifestPaths | None = None,
    absolute: bool = False,
) -> str:
    """``label``, size and mtime of ``path``; with ``real``, also its path as a manifest
    holds it (:class:`_ManifestPaths`), or with ``absolute`` its real path (a path the
    manifest keeps as written: where the project lies changes nothing)."""
    try:
        if real is None:
            stat = os.stat(path)
            return f"{label}\t{stat.st_size}\t{stat.st_mtime_ns}"
        path = os.fspath(path)
        stat = os.lstat(path)
        link = S_ISLNK(stat.st_mode)
        if link:
            stat = os.stat(path)
        resolved = real.absolute(path, link) if absolute else real(path, link)
    except (OSError, ValueError):  # ValueError: a NUL in the name (prepare names the row)
        return f"{label}\tmissing"
    return f"{label}\t{resolved}\t{stat.st_size}\t{stat.st_mtime_ns}"


def folder_digest(folder: str | os.PathLike) -> str:
    """sha256 of every file below ``folder`` (hidden ones too: a Zarr v2 store's
    ``.zarray``) by relative name, size and mtime: a precomputed Zarr store whose chunks
    are rewritten in place changes it, where the folder's own mtime does not."""
    from .datasets import walk_files

    root = Path(folder)
    files = walk_files(root, hidden=True)
    return "files:" + _digest(_stat_line(p.relative_to(root).as_posix(), p) for p in files)


def _images_below(folder: Path, recursive: bool, real: _ManifestPaths) -> list[str]:
    """Lines ``relative name, path as a manifest holds it, size, mtime`` of the images
    below ``folder`` (sorted; :func:`_stat_line`).

    Recursive: the files the loaders see (:func:`rankwise.datasets.walk_files`, which
    follows linked sub-folders).
    """
    from .datasets import IMAGE_EXTENSIONS, walk_files

    if not folder.is_dir():
        return [f"{folder}\tmissing"]
    if recursive:
        paths = walk_files(folder)
    else:
        paths = [p for p in folder.iterdir() if not p.name.startswith(".") and not p.is_dir()]
    return sorted(
        _stat_line(path.relative_to(folder).as_posix(), path, real)
        for path in paths
        if path.suffix.lower() in IMAGE_EXTENSIONS
    )


def _files_below(folder: Path, real: _ManifestPaths) -> list[str]:
    """Lines ``relative name, path as a manifest holds it, size, mtime`` of every
    non-hidden file below ``folder`` (:func:`_stat_line`)."""
    from .datasets import walk_files

    if not folder.is_dir():
        return [f"{folder}\tmissing"]
    return sorted(
        _stat_line(path.relative_to(folder).as_posix(), path, real) for path in walk_files(folder)
    )


def _file_lines(path: Path) -> list[str]:
    """The file's sha256 (cached by its stat stamp, see rankwise.hashing), or 'missing'."""
    from .hashing import file_sha256

    return [f"{path}\t{file_sha256(path)}" if path.is_file() else f"{path}\tmissing"]


def _manifest_images(csv_path: Path, real: _ManifestPaths) -> list[str]:
    """The manifest's bytes, and path, path as prepare's manifest holds it, size and
    mtime of each image it names."""
    lines = _file_lines(csv_path)
    if not csv_path.is_file():
        return lines
    # not a CSV the csv module reads, or no path column: the CSV's own bytes are the
    # fingerprint; prepare says what is wrong. `~` is a folder's name there, as for prepare
    for _, _, value in _manifest_paths(csv_path) or []:
        # prepare keeps an absolute path as written: its real path counts (a link pointed
        # elsewhere), not one relative to the manifests (a moved project reran)
        lines.append(_stat_line(value, csv_path.parent / value, real, os.path.isabs(value)))
    return lines


def _msmt17_images(root: Path, images: str, split: str, real: _ManifestPaths) -> list[str]:
    listing = root / f"list_{split}.txt"
    lines = _file_lines(listing)
    if images in (None, "", "auto"):
        folder = next((root / d for d in ("test", "mask_test_v2") if (root / d).is_dir()), None)
    else:
        folder = root / images
    if folder is None or not listing.is_file():
        return lines
    # each image's path as the manifest holds it: `images: auto` picks test/ or
    # mask_test_v2/, whichever exists (a renamed folder keeps sizes and mtimes)
    # utf-8-sig, as the loader reads it: a byte-order mark kept made the first image's
    # name "\ufeff0000/..." (always missing), so its changes reran nothing
    text = listing.read_text(encoding="utf-8-sig", errors="replace")
    for line in text.splitlines():
        fields = line.split()
        if fields:
            lines.append(_stat_line(fields[0], folder / fields[0], real))
    return lines


def splits_apart(loader: str, options: dict) -> bool:
    """Whether each split's manifest depends on the loader's options and that split's
    own data alone, the data :func:`dataset_fingerprints` digests for it: then the
    pipeline prepares (and so encodes) a split whose data changed without the other.

    True for ``manifest`` (one CSV per split), ``market1501`` (one folder per split),
    ``msmt17`` (one list file per split) and ``folder`` with ``query_dir`` and
    ``gallery_dir``. False where one listing makes both splits (``folder`` with
    ``root``: a seeded split of one tree; the tree loaders) or the loader writes files
    both splits share (the demos' images, ``mot``'s crops).
    """
    if loader == "folder":
        from .datasets import folder_layout

        return folder_layout(options) == "split dirs"
    return loader in ("manifest", "market1501", "msmt17")


def dataset_fingerprints(
    loader: str, options: dict, *, manifests: str | os.PathLike = os.curdir
) -> dict[str, str]:
    """split -> sha256 of what the loader reads for it (generated demo data: of the
    loader's name and options, all its data depends on); ``manifests``: the folder
    prepare writes the manifests to.

    ``manifest``: the CSV's bytes, and the relative path, size and mtime of every image
    its ``path`` column names. ``market1501``, ``folder``: the relative name, size and
    mtime of every image of the split's folder (``folder`` with ``root``: of the whole
    tree, for both splits; with ``query_dir`` and ``gallery_dir``, also whether the two
    are one folder). ``msmt17``: the list file's bytes and the size and mtime of each
    image it lists. ``veri776``, ``dukemtmc``, ``cuhk03-np``, ``identity-folders``,
    ``mot``: the relative name, size and mtime of every file below ``root`` (list files,
    ``gt.txt`` and ``seqinfo.ini`` included), for both splits. Every loader's lines also
    hold each file's path as a manifest in ``manifests`` holds it (:class:`_ManifestPaths`:
    links resolved, relative to that folder). So editing a CSV, adding, removing
    or rewriting an image changes the digest; touching an image (same bytes, new mtime)
    does too, since images are not hashed: hashing a whole dataset on every run would
    cost minutes.
    """
    real = _ManifestPaths(manifests)
    if loader == "manifest":
        parts = {s: _manifest_images(Path(os.path.expanduser(options[s])), real) for s in SPLITS}
    elif loader == "market1501":
        root = Path(os.path.expanduser(options["root"]))
        folders = {
            s: root / options.get(f"{s}_folder", default)
            for s, default in zip(SPLITS, ("query", "bounding_box_test"), strict=True)
        }
        parts = {s: _images_below(f, False, real) for s, f in folders.items()}
    elif loader == "msmt17":
        root = Path(os.path.expanduser(options["root"]))
        images = options.get("images", "auto")
        parts = {s: _msmt17_images(root, images, s, real) for s in SPLITS}
    elif loader == "folder":
        if options.get("root"):
            tree = _images_below(Path(os.path.expanduser(options["root"])), True, real)
            parts = {s: tree for s in SPLITS}
        else:
            dirs = {s: Path(os.path.expanduser(options[f"{s}_dir"])) for s in SPLITS}
            # ids are prefixed query/ and gallery/ unless both are one folder, links
            # resolved: each split's manifest depends on both folders' real paths
            same = os.path.realpath(dirs["query"]) == os.path.realpath(dirs["gallery"])
            parts = {
                s: [f"one folder\t{same}", *_images_below(d, True, real)] for s, d in dirs.items()
            }
    elif loader in TREE_LOADERS:
        tree = _files_below(Path(os.path.expanduser(options["root"])), real)
        parts = {s: tree for s in SPLITS}
    else:  # the offline demos: generated from their options alone, so the options are
        # their data's digest (prepare's options param alone reran prepare, but a run
        # stopped after it left encode nothing to see: the same CSVs, other images)
        options_json = json.dumps(options, sort_keys=True, default=str)
        return {s: "generated:" + _digest([loader, options_json]) for s in SPLITS}
    return {s: _digest(parts[s]) for s in SPLITS}
