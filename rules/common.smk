# Config validation and the small functions the rules use. No computation here.

import json
import os
import re
import shlex
import sys
from functools import lru_cache

from snakemake.utils import validate

# `rankwise` lives next to the Python running Snakemake (a venv's bin/): make the
# shell rules find it even when the venv is not activated.
os.environ.update(
    PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
)

from rankwise import options as rankwise_options
from rankwise import pipeline_config
from rankwise.registry import get_protocol
from rankwise.errors import RankwiseError

# Software: every rule runs the `rankwise` CLI, found on PATH (above) by default; with
# `--sdm conda` in this environment (path relative to the rules/ files that name it).
CONDA_ENV = "../envs/rankwise.yaml"

# The config files in Snakemake's merge order: config/config.yaml, then --configfile's
# (then --config's values).
_overrides = [str(f) for f in workflow.overwrite_configfiles]
CONFIG_FILES = [
    str(f)
    for f in workflow.configfiles
    if str(f) not in _overrides and not workflow.config_settings.replace_workflow_config
] + _overrides
# `--config KEY=VALUE` values are merged last: an error at a key they set names --config
if workflow.config_settings.config:
    CONFIG_FILES.append(
        pipeline_config.CommandLineConfig(dict(workflow.config_settings.config))
    )

# Checked once, each problem as one line (no traceback) before any job is built: our
# own schema check (key path, did-you-mean), then validate() fills every default, then
# sweeps expand and every path the config names must exist.
try:
    pipeline_config.check(
        config, os.path.join(workflow.basedir, "config", "schema.yaml"), CONFIG_FILES
    )
    validate(config, schema="../config/schema.yaml")
    ENCODERS, SWEEPS = pipeline_config.resolve(config, CONFIG_FILES)
except RankwiseError as _error:
    pipeline_config.refuse(_error)

DATASETS = config["datasets"]
ENGINE = config["engine"]

# Every rule's shell ends with `|| { s=$?; tail -n 1 LOG >&2; exit $s; }`: a failed job's
# one-line error (the last line of its log) reaches the terminal, whatever the profile.


wildcard_constraints:
    dataset="|".join(map(re.escape, DATASETS)) or "(?!)",
    encoder="|".join(map(re.escape, ENCODERS)) or "(?!)",
    split="query|gallery",


# ---------------------------------------------------------------- output versions
# A release whose fix changes what a stage writes from the same inputs (a CHANGELOG
# "Fixed" entry with other numbers, bytes or documents) bumps that stage's number here.
# Above 0 the number is one more of the stage's params (`output_version`), so Snakemake's
# params trigger reruns every job of the stage written before, and what depends on them.
# 0 adds no param: a release that bumps nothing reruns nothing. Only ever raise a number.
OUTPUT_VERSIONS = {"prepare": 0, "encode": 0, "rank": 0, "verify": 0, "metrics": 0, "report": 0}


def output_version(stage):
    """`params: **output_version(stage)`: nothing at version 0, else one param whose value
    no other param can have (Snakemake compares the *set* of a job's param values, not
    their names: a bare `1` beside another param's 1 changed nothing)."""
    version = OUTPUT_VERSIONS[stage]
    return {"output_version": f"rankwise {stage} output v{version}"} if version else {}


def by_name(**params):
    """`params: **by_name(a=..., b=...)`: the params, and `settings`: all of them by name
    as one JSON string.  Snakemake compares the *set* of a job's param values, not their
    names, so a changed value that another param already had reran nothing (`gap_frames:
    1` -> `10` beside `query_stride: 1` and the `shot_repeats: 10` every rank job carries;
    `worst_queries: 0` -> `10` beside `seed: 0` and `top_k: 10`).  A function here takes
    the wildcards only: one of `threads` or `input` stays out of the rerun checks (or is
    covered by the inputs) and goes beside this, not in it."""

    def settings(wildcards):
        values = {key: v(wildcards) if callable(v) else v for key, v in params.items()}
        return json.dumps(values, sort_keys=True, default=str)

    return {**params, "settings": settings}


# ---------------------------------------------------------------- targets


def dataset_encoders(dataset):
    """The encoders evaluated on `dataset`: its `encoders:` list, else all of them."""
    return DATASETS[dataset]["encoders"] or list(ENCODERS)


def all_pairs(pattern):
    """`pattern` formatted for every (dataset, encoder) pair that runs."""
    return [
        pattern.format(dataset=d, encoder=e) for d in DATASETS for e in dataset_encoders(d)
    ]


# ---------------------------------------------------------------- encoders


def encoder_files(wildcards):
    """The files that define an encoder: checkpoint, ONNX model, factory .py, embeddings.

    All exist (checked above). Files are ancient(): their mtime is ignored and
    `encoder_hash` (a param) reruns the job when their bytes change. A folder (a Zarr
    store) is tracked by its files' names, sizes and mtimes (the folder's own mtime
    does not change when a chunk is rewritten in place).
    """
    entry = ENCODERS[wildcards.encoder]
    paths = pipeline_config.encoder_paths(entry["kind"], entry["options"], wildcards.split)
    return [ancient(p) if os.path.isfile(p) else p for p in paths]


@lru_cache(maxsize=None)
def _sha256(path, size, mtime_ns, ctime_ns):
    from rankwise.hashing import file_sha256

    return file_sha256(path)


def encoder_hash(wildcards):
    """sha256 of each file the encoder reads (cached by its stat stamp); a folder
    (a Zarr store) by the names, sizes and mtimes of every file below it."""
    hashes = {}
    for path in map(str, encoder_files(wildcards)):
        if os.path.isfile(path):
            stat = os.stat(path)
            hashes[path] = _sha256(path, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        elif os.path.isdir(path):
            hashes[path] = pipeline_config.folder_digest(path)
    return hashes


def encoder_options(wildcards):
    return pipeline_config.encoder_options(ENCODERS[wildcards.encoder]["options"])


# ---------------------------------------------------------------- datasets


@lru_cache(maxsize=None)
def dataset_fingerprints(dataset):
    """split -> digest of what the dataset's loader reads (see pipeline_config), with
    each file's path as prepare's manifests (in results/manifests/<dataset>) hold it."""
    return pipeline_config.dataset_fingerprints(
        DATASETS[dataset]["loader"],
        DATASETS[dataset]["options"],
        manifests=f"results/manifests/{dataset}",
    )


def dataset_fingerprint(wildcards):
    """A param of `prepare`: new data (CSV, images) reruns it, an untouched tree nothing."""
    return dataset_fingerprints(wildcards.dataset)


def split_fingerprint(wildcards):
    """A param of `prepare_split`: the split's own data (the other split's reruns nothing)."""
    return dataset_fingerprints(wildcards.dataset)[wildcards.split]


def names_pattern(names):
    """A wildcard constraint matching exactly `names` (none: nothing)."""
    return "|".join(map(re.escape, names)) or "(?!)"


# Datasets whose splits come from separate data (one CSV, folder or list file each) are
# prepared one split per job, so new data in one split re-encodes that split alone; the
# others (demos, seeded splits of one tree, tree loaders) in one job for both splits.
SPLIT_DATASETS = [
    name
    for name, dataset in DATASETS.items()
    if pipeline_config.splits_apart(dataset["loader"], dataset["options"])
]
JOINT_DATASETS = [name for name in DATASETS if name not in SPLIT_DATASETS]


def dataset_value(key):
    """A param function giving datasets.{dataset}.{key}."""
    return lambda wildcards: DATASETS[wildcards.dataset][key]


def dataset_options(wildcards):
    """The loader options as JSON; the manifest loader checks the dataset's protocol."""
    dataset = DATASETS[wildcards.dataset]
    options = dict(dataset["options"])
    if dataset["loader"] == "manifest":
        options.setdefault("protocol", dataset["protocol"])
    return json.dumps(options, sort_keys=True)


_PROTOCOL_OPTIONS = {
    option.name: option.default
    for option in (
        rankwise_options.GAP_FRAMES,
        rankwise_options.QUERY_STRIDE,
        rankwise_options.JUNK_LABELS,
        rankwise_options.EXCLUDE_SAME_CAMERA,
        rankwise_options.MULTI_QUERY,
        rankwise_options.SINGLE_GALLERY_SHOT,
        rankwise_options.SHOT_REPEATS,
        rankwise_options.SHOT_SEED,
    )
}


def protocol_option(dataset, key):
    """datasets.{dataset}.{key} where the dataset's protocol takes that option
    (shot_repeats, shot_seed: with single_gallery_shot on), else its default: an option
    the protocol ignores changes no param, so setting it reruns nothing."""
    entry = DATASETS[dataset]
    taken = key in get_protocol(entry["protocol"]).options
    if key in ("shot_repeats", "shot_seed"):
        taken = taken and entry["single_gallery_shot"]
    return entry[key] if taken else _PROTOCOL_OPTIONS[key]


def protocol_value(key):
    """A param function giving :func:`protocol_option` (lists joined by commas)."""

    def value(wildcards):
        option = protocol_option(wildcards.dataset, key)
        return ",".join(map(str, option)) if isinstance(option, (list, tuple)) else option

    return value


def quoted(value):
    """A param function giving ``value(wildcards)`` shell-quoted, also when empty: for
    an empty value Snakemake's ``{x:q}`` writes nothing, so ``--junk-labels {x:q}``
    would take the next flag for its value (``junk_labels: []`` ran with the junk
    label ``--keep-same-camera``).  A value that needs no quotes is unchanged."""
    return lambda wildcards: shlex.quote(str(value(wildcards)))


def same_camera_flag(wildcards):
    """The reid camera rule of the dataset as a `rankwise rank` flag."""
    if protocol_option(wildcards.dataset, "exclude_same_camera"):
        return "--exclude-same-camera"
    return "--keep-same-camera"


def single_shot_flag(wildcards):
    """The reid single-gallery-shot CMC of the dataset as a `rankwise rank` flag."""
    if protocol_option(wildcards.dataset, "single_gallery_shot"):
        return "--single-gallery-shot"
    return "--all-gallery-shots"
def rerank_flags(wildcards):
    """The dataset's query expansion and re-ranking as `rankwise rank` flags ("" = none)."""
    return pipeline_config.rerank_flags(DATASETS[wildcards.dataset])


def verification_pairs(pattern):
    """`pattern` formatted for every (dataset, encoder) pair whose dataset asks for
    verification metrics (`verification:` not null)."""
    return [
        pattern.format(dataset=d, encoder=e)
        for d in DATASETS
        if DATASETS[d]["verification"] is not None
        for e in dataset_encoders(d)
    ]


def verification_value(key):
    """A param function giving datasets.{dataset}.verification.{key} (lists comma-joined)."""

    def value(wildcards):
        item = DATASETS[wildcards.dataset]["verification"][key]
        return ",".join(map(str, item)) if isinstance(item, (list, tuple)) else item

    return value


def verification_flags(wildcards, input):
    """`--verification FILE` for each verification result the report reads."""
    return " ".join(f"--verification {shlex.quote(str(p))}" for p in input.verification)


def comma_list(key):
    """A param function giving datasets.{dataset}.{key} joined by commas (ks, junk_labels)."""
    return lambda wildcards: ",".join(map(str, DATASETS[wildcards.dataset][key]))


def engine_args(wildcards, threads):
    """Tiling/parallelism flags for `rankwise rank`. They do not change any number, so
    this param takes `threads`: Snakemake then leaves it out of the rerun checks."""
    args = (
        f"--query-block {ENGINE['query_block']} --gallery-chunk {ENGINE['gallery_chunk']}"
        f" --workers {threads} --device {ENGINE['device']}"
    )
    if ENGINE["scheduler"]:
        # quoted: an address with a space or `;` split the shell command
        args += f" --scheduler {shlex.quote(str(ENGINE['scheduler']))}"
    return args
