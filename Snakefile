# rankwise: reproducible retrieval / person re-ID evaluation.
#
#   snakemake --cores 4                       # the demos in config/config.yaml
#   snakemake --cores 4 --configfile my.yaml --replace-workflow-config
#
# Stages (rules/*.smk; prepare sits with encode), each one `rankwise` command you can run:
#   prepare  -> results/manifests/{dataset}/{query,gallery}.csv (prepare_split: one split)
#   encode   -> results/embeddings/{dataset}/{encoder}/{split}.zarr
#   rank     -> results/ranks/{dataset}/{encoder}.zarr
#   metrics  -> results/metrics/{dataset}/{encoder}.{json,txt}
#   report   -> results/report.{html,md,json,csv,tex}, results/figures/

import os

from snakemake.utils import min_version

from rankwise.errors import RankwiseError
from rankwise.pipeline_config import load_yaml, refuse

min_version("9.0")

# Snakemake's loader names neither file nor line for a YAML syntax error: read it first.
try:
    if os.path.isfile("config/config.yaml"):
        load_yaml("config/config.yaml")
except RankwiseError as _error:
    refuse(_error)


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/encode.smk"
include: "rules/rank.smk"
include: "rules/metrics.smk"
include: "rules/verify.smk"
include: "rules/report.smk"


localrules:
    all,
    report,


rule all:
    default_target: True
    input:
        rules.report.output,
