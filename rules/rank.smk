# Ranks: for each query, the ranks of its relevant gallery items (never a Q x G matrix).
# Depends on the protocol options (query expansion and re-ranking included) only; `ks` and
# `ap` belong to the metrics stage.


rule rank:
    input:
        query="results/manifests/{dataset}/query.csv",
        gallery="results/manifests/{dataset}/gallery.csv",
        query_embeddings="results/embeddings/{dataset}/{encoder}/query.zarr",
        gallery_embeddings="results/embeddings/{dataset}/{encoder}/gallery.zarr",
    output:
        ranks=directory("results/ranks/{dataset}/{encoder}.zarr"),
    log:
        "logs/ranks/{dataset}/{encoder}.log",
    benchmark:
        "results/benchmarks/ranks/{dataset}/{encoder}.tsv"
    params:
        **by_name(
            protocol=dataset_value("protocol"),
            distance=dataset_value("distance"),
            gap_frames=protocol_value("gap_frames"),
            query_stride=protocol_value("query_stride"),
            junk_labels=quoted(protocol_value("junk_labels")),
            same_camera=same_camera_flag,
            multi_query=protocol_value("multi_query"),
            single_shot=single_shot_flag,
            shot_repeats=protocol_value("shot_repeats"),
            shot_seed=protocol_value("shot_seed"),
            rerank=rerank_flags,
        ),
        engine=engine_args,
        **output_version("rank"),
    threads: ENGINE["threads"]
    conda:
        CONDA_ENV
    resources:
        mem_mb=8000,
    shell:
        "rankwise rank --query {input.query:q} --gallery {input.gallery:q}"
        " --query-embeddings {input.query_embeddings:q}"
        " --gallery-embeddings {input.gallery_embeddings:q}"
        " --protocol {params.protocol} --distance {params.distance}"
        " --gap-frames {params.gap_frames} --query-stride {params.query_stride}"
        " --junk-labels {params.junk_labels} {params.same_camera} {params.rerank}"
        " --multi-query {params.multi_query} {params.single_shot}"
        " --shot-repeats {params.shot_repeats} --shot-seed {params.shot_seed}"
        " {params.engine} --out {output.ranks:q} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }}"
