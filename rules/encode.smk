# Data and embeddings: manifests from a loader, then one embedding store per split.


rule prepare:
    # both splits in one job: their data are one (JOINT_DATASETS, rules/common.smk)
    wildcard_constraints:
        dataset=names_pattern(JOINT_DATASETS),
    output:
        query="results/manifests/{dataset}/query.csv",
        gallery="results/manifests/{dataset}/gallery.csv",
        # The digest of what the loader read for each split (images by name, size and
        # mtime): encode reruns when it changes even if the manifest's bytes did not.
        query_fingerprint="results/manifests/{dataset}/query.fingerprint",
        gallery_fingerprint="results/manifests/{dataset}/gallery.fingerprint",
    log:
        "logs/manifests/{dataset}/query+gallery.log",
    params:
        loader=dataset_value("loader"),
        options=dataset_options,
        fingerprint=dataset_fingerprint,
        out_dir=lambda wildcards, output: os.path.dirname(output.query),
        **output_version("prepare"),
    threads: 1
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise prepare --loader {params.loader} --options {params.options:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }};"
        " echo {params.fingerprint[query]} > {output.query_fingerprint:q};"
        " echo {params.fingerprint[gallery]} > {output.gallery_fingerprint:q}"


rule prepare_split:
    # one split per job (SPLIT_DATASETS): new data in one split leave the other's
    # manifest, fingerprint and so its embedding stores alone. The loader still reads
    # and checks both splits.
    wildcard_constraints:
        dataset=names_pattern(SPLIT_DATASETS),
    output:
        manifest="results/manifests/{dataset}/{split}.csv",
        fingerprint="results/manifests/{dataset}/{split}.fingerprint",
    log:
        # a folder per dataset: `{dataset}.{split}.log` was also dataset `x.query`'s log
        "logs/manifests/{dataset}/{split}.log",
    params:
        loader=dataset_value("loader"),
        options=dataset_options,
        fingerprint=split_fingerprint,
        out_dir=lambda wildcards, output: os.path.dirname(output.manifest),
        **output_version("prepare"),
    threads: 1
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise prepare --loader {params.loader} --options {params.options:q}"
        " --out-dir {params.out_dir:q} --split {wildcards.split} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }};"
        " echo {params.fingerprint} > {output.fingerprint:q}"


rule encode:
    input:
        manifest="results/manifests/{dataset}/{split}.csv",
        fingerprint="results/manifests/{dataset}/{split}.fingerprint",
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
        **output_version("encode"),
    threads: ENGINE["threads"]
    conda:
        CONDA_ENV
    resources:
        mem_mb=8000,
    shell:
        "rankwise encode --manifest {input.manifest:q} --kind {params.kind}"
        " --options {params.options:q} --out {output.store:q}"
        " --batch-size {params.batch_size} --threads {threads} --no-progress > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }}"
