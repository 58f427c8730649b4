# Report: every dataset x encoder in one self-contained HTML page, Markdown and JSON.
# The CMC curves are read from the ranks store each metrics file names (input.ranks).


rule report:
    input:
        metrics=all_pairs("results/metrics/{dataset}/{encoder}.json"),
        ranks=all_pairs("results/ranks/{dataset}/{encoder}.zarr"),
    output:
        html="results/report.html",
        md="results/report.md",
        json="results/report.json",
    log:
        "logs/report.log",
    params:
        title=config["report"]["title"],
        cmc_max_rank=config["report"]["cmc_max_rank"],
    threads: 1
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise report {input.metrics:q} --title {params.title:q}"
        " --cmc-max-rank {params.cmc_max_rank} --html {output.html:q} --md {output.md:q}"
        " --json {output.json:q} > {log:q} 2>&1"
