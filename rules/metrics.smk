# Metrics: a function of the ranks store alone, so changing `ks` or `ap` reruns only this.


rule metrics:
    input:
        ranks="results/ranks/{dataset}/{encoder}.zarr",
    output:
        json="results/metrics/{dataset}/{encoder}.json",
        text="results/metrics/{dataset}/{encoder}.txt",
    log:
        "logs/metrics/{dataset}/{encoder}.log",
    benchmark:
        "results/benchmarks/metrics/{dataset}/{encoder}.tsv"
    params:
        ks=comma_list("ks"),
        ap=dataset_value("ap"),
    threads: 1
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise metrics {input.ranks:q} --ks {params.ks} --ap {params.ap}"
        " --output {output.json:q} --text-output {output.text:q} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }}"
