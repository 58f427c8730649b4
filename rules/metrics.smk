# Metrics: a function of the ranks store alone, so changing `ks` or `ap` reruns only this.
# The same job caches the evaluation's statistics for the report (intervals, CMC, the
# per-query values of the paired tests): the report job then only assembles, and adding
# one checkpoint computes one evaluation's statistics, not every one's again.


rule metrics:
    input:
        ranks="results/ranks/{dataset}/{encoder}.zarr",
    output:
        json="results/metrics/{dataset}/{encoder}.json",
        text="results/metrics/{dataset}/{encoder}.txt",
        stats="results/metrics/{dataset}/{encoder}.stats.npz",
    log:
        "logs/metrics/{dataset}/{encoder}.log",
    benchmark:
        "results/benchmarks/metrics/{dataset}/{encoder}.tsv"
    params:
        **by_name(
            ks=comma_list("ks"),
            ap=dataset_value("ap"),
            cmc_max_rank=config["report"]["cmc_max_rank"],
            resamples=config["report"]["resamples"],
            seed=config["report"]["seed"],
            by=config["report"]["by"],
        ),
        **output_version("metrics"),
    threads: 1
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise metrics {input.ranks:q} --ks {params.ks} --ap {params.ap}"
        " --output {output.json:q} --text-output {output.text:q}"
        " --stats-output {output.stats:q} --cmc-max-rank {params.cmc_max_rank}"
        " --resamples {params.resamples} --seed {params.seed} --by {params.by} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }}"
