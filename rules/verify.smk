# Verification: TPR@FPR, the ROC curve and the positive/negative distance histograms over
# every valid query-gallery pair (rankwise.verification: exact, two passes over float32
# tiles, never the pair list). Only for datasets with `verification:` set; it reads the
# embeddings (the encoder's own distances, before any query expansion or re-ranking).


rule verify:
    input:
        query="results/manifests/{dataset}/query.csv",
        gallery="results/manifests/{dataset}/gallery.csv",
        query_embeddings="results/embeddings/{dataset}/{encoder}/query.zarr",
        gallery_embeddings="results/embeddings/{dataset}/{encoder}/gallery.zarr",
    output:
        json="results/verification/{dataset}/{encoder}.json",
    log:
        "logs/verification/{dataset}/{encoder}.log",
    benchmark:
        "results/benchmarks/verification/{dataset}/{encoder}.tsv"
    params:
        **by_name(
            protocol=dataset_value("protocol"),
            distance=dataset_value("distance"),
            junk_labels=quoted(protocol_value("junk_labels")),
            same_camera=same_camera_flag,
            fprs=verification_value("fprs"),
            bins=verification_value("bins"),
        ),
        # tiling and threads never change a number: a param taking `threads` is left out
        # of Snakemake's rerun checks
        engine=lambda wildcards, threads: (
            f"--query-block {ENGINE['query_block']} --gallery-chunk {ENGINE['gallery_chunk']}"
            f" --workers {threads}"
        ),
        **output_version("verify"),
    threads: ENGINE["threads"]
    conda:
        CONDA_ENV
    resources:
        mem_mb=4000,
    shell:
        "rankwise verify --query {input.query:q} --gallery {input.gallery:q}"
        " --query-embeddings {input.query_embeddings:q}"
        " --gallery-embeddings {input.gallery_embeddings:q}"
        " --protocol {params.protocol} --distance {params.distance}"
        " --junk-labels {params.junk_labels} {params.same_camera}"
        " --fprs {params.fprs} --bins {params.bins} {params.engine}"
        " --output {output.json:q} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }}"
