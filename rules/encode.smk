# Data and embeddings: manifests from a loader, then one embedding store per split.


rule prepare:
    output:
        query="results/manifests/{dataset}/query.csv",
        gallery="results/manifests/{dataset}/gallery.csv",
    log:
        "logs/manifests/{dataset}.log",
    params:
        loader=dataset_value("loader"),
        options=dataset_options,
        out_dir=lambda wildcards, output: os.path.dirname(output.query),
    threads: 1
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise prepare --loader {params.loader} --options {params.options:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule encode:
    input:
        manifest="results/manifests/{dataset}/{split}.csv",
        files=encoder_files,
    output:
        store=directory("results/embeddings/{dataset}/{encoder}/{split}.zarr"),
    log:
        "logs/embeddings/{dataset}/{encoder}/{split}.log",
    benchmark:
        "results/benchmarks/embeddings/{dataset}/{encoder}/{split}.tsv"
    params:
        kind=lambda wildcards: ENCODERS[wildcards.encoder]["kind"],
        options=encoder_options,
        file_hashes=encoder_hash,
        batch_size=lambda wildcards, threads: ENGINE["batch_size"],
    threads: ENGINE["threads"]
    conda:
        CONDA_ENV
    resources:
        mem_mb=8000,
    shell:
        "rankwise encode --manifest {input.manifest:q} --kind {params.kind}"
        " --options {params.options:q} --out {output.store:q}"
        " --batch-size {params.batch_size} --threads {threads} --no-progress > {log:q} 2>&1"
