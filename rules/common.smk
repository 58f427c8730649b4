# Config validation and the small functions the rules use. No computation here.

import json
import os
import re
import sys
from functools import lru_cache

from snakemake.utils import validate

# `rankwise` lives next to the Python running Snakemake (a venv's bin/): make the
# shell rules find it even when the venv is not activated.
os.environ.update(
    PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
)

# validate() inserts the schema's own `default: {}` object, so entries without `options:`
# would share one dict and mix their defaults: give each entry its own first.
for _entry in [*(config.get("datasets") or {}).values(), *(config.get("encoders") or {}).values()]:
    if isinstance(_entry, dict):
        _entry.setdefault("options", {})

# Software: every rule runs the `rankwise` CLI, found on PATH (above) by default; with
# `--sdm conda` in this environment (path relative to the rules/ files that name it).
CONDA_ENV = "../envs/rankwise.yaml"

# Once, here: fills every default, rejects unknown keys (additionalProperties: false).
validate(config, schema="../config/schema.yaml")

DATASETS = config["datasets"]
ENCODERS = config["encoders"]
ENGINE = config["engine"]

for _name, _dataset in DATASETS.items():
    _unknown = sorted(set(_dataset["encoders"] or []) - set(ENCODERS))
    if _unknown:
        raise ValueError(
            f"config: datasets.{_name}.encoders names {_unknown}, which are not under "
            f"`encoders:` (defined: {sorted(ENCODERS)}); define them or remove them"
        )


wildcard_constraints:
    dataset="|".join(map(re.escape, DATASETS)) or "(?!)",
    encoder="|".join(map(re.escape, ENCODERS)) or "(?!)",
    split="query|gallery",


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

    Files are ancient(): their mtime is ignored and `encoder_hash` (a param) reruns the
    job when their bytes change. A folder (a Zarr store) is tracked by its mtime.
    """
    kind, options = ENCODERS[wildcards.encoder]["kind"], ENCODERS[wildcards.encoder]["options"]
    if kind == "python":
        factory_file = options["factory"].rpartition(":")[0]
        paths = [options["checkpoint"], factory_file if factory_file.endswith(".py") else None]
    elif kind == "onnx":
        paths = [options["model"]]
    elif kind == "precomputed":
        paths = [options[wildcards.split], options["path"]]
    else:
        paths = []
    return [ancient(p) if os.path.isfile(p) else p for p in paths if p]


@lru_cache(maxsize=None)
def _sha256(path, size, mtime_ns):
    from rankwise.hashing import file_sha256

    return file_sha256(path)


def encoder_hash(wildcards):
    """sha256 of each file the encoder reads (cached by path, size and mtime)."""
    hashes = {}
    for path in map(str, encoder_files(wildcards)):
        if os.path.isfile(path):
            stat = os.stat(path)
            hashes[path] = _sha256(path, stat.st_size, stat.st_mtime_ns)
    return hashes


def encoder_options(wildcards):
    return json.dumps(ENCODERS[wildcards.encoder]["options"], sort_keys=True)


# ---------------------------------------------------------------- datasets


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


def comma_list(key):
    """A param function giving datasets.{dataset}.{key} joined by commas (ks, junk_labels)."""
    return lambda wildcards: ",".join(map(str, DATASETS[wildcards.dataset][key]))


def engine_args(wildcards, threads):
    """Tiling/parallelism flags for `rankwise rank`. They do not change any number, so
    this param takes `threads`: Snakemake then leaves it out of the rerun checks."""
    args = (
        f"--query-block {ENGINE['query_block']} --gallery-chunk {ENGINE['gallery_chunk']}"
        f" --workers {threads}"
    )
    if ENGINE["scheduler"]:
        args += f" --scheduler {ENGINE['scheduler']}"
    return args
