# rankwise: reproducible retrieval / person re-ID evaluation.
#
#   snakemake --cores 4                       # the demos in config/config.yaml
#   snakemake --cores 4 --configfile my.yaml --replace-workflow-config
#
# Stages (rules/*.smk; prepare sits with encode), each one `rankwise` command you can run:
#   prepare  -> results/manifests/{dataset}/{query,gallery}.csv
#   encode   -> results/embeddings/{dataset}/{encoder}/{split}.zarr
#   rank     -> results/ranks/{dataset}/{encoder}.zarr
#   metrics  -> results/metrics/{dataset}/{encoder}.{json,txt}
#   report   -> results/report.{html,md,json}

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/encode.smk"
include: "rules/rank.smk"
include: "rules/metrics.smk"
include: "rules/report.smk"


localrules:
    all,
    report,


rule all:
    default_target: True
    input:
        rules.report.output,
