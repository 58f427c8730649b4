# Report: every dataset x encoder in one self-contained HTML page, Markdown, JSON, a tidy
# CSV, LaTeX tables and paper figures (SVG, PDF), with bootstrap intervals, paired tests,
# CMC curves and the worst queries. The intervals, CMC curves and per-query values come
# from the metrics jobs' statistics summaries; the paired tests are cached per pair
# (results/cache/pairs). For the worst queries' nearest items it reads what the
# provenance names: the ranks stores, the manifests (and their images) and the embeddings.


rule report:
    input:
        metrics=all_pairs("results/metrics/{dataset}/{encoder}.json"),
        stats=all_pairs("results/metrics/{dataset}/{encoder}.stats.npz"),
        ranks=all_pairs("results/ranks/{dataset}/{encoder}.zarr"),
        manifests=list(
            dict.fromkeys(
                all_pairs("results/manifests/{dataset}/query.csv")
                + all_pairs("results/manifests/{dataset}/gallery.csv")
            )
        ),
        embeddings=all_pairs("results/embeddings/{dataset}/{encoder}/query.zarr")
        + all_pairs("results/embeddings/{dataset}/{encoder}/gallery.zarr"),
        # TPR@FPR, ROC curves and distance histograms (datasets with `verification:`)
        verification=verification_pairs("results/verification/{dataset}/{encoder}.json"),
    output:
        html="results/report.html",
        md="results/report.md",
        json="results/report.json",
        csv="results/report.csv",
        tex="results/report.tex",
        # every chart as SVG and PDF for a paper column: <dataset>-<metrics|cmc|progressive>
        figures=directory("results/figures"),
    log:
        "logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    params:
        **by_name(
            # a function: Snakemake would read braces in a plain string as wildcards
            title=quoted(lambda wildcards: config["report"]["title"]),
            # the config order decides the paired tests beyond four encoders (each against the
            # previous one): reordering reruns the report, though no input changed
            order=all_pairs("{dataset}/{encoder}"),
            cmc_max_rank=config["report"]["cmc_max_rank"],
            resamples=config["report"]["resamples"],
            seed=config["report"]["seed"],
            by=config["report"]["by"],
            worst_queries=config["report"]["worst_queries"],
            worst_encoders=config["report"]["worst_encoders"],
            top_k=config["report"]["top_k"],
            # each paired test, keyed by both evaluations' content (safe to delete)
            cache="results/cache/pairs",
            figure_formats=config["report"]["figure_formats"],
        ),
        verification=verification_flags,
        **output_version("report"),
    # two: the paper figures are drawn in a second process beside the documents (the
    # report is the last job, so nothing waits for the second core)
    threads: 2
    conda:
        CONDA_ENV
    resources:
        mem_mb=2000,
    shell:
        "rankwise report {input.metrics:q} --title {params.title}"
        " --cmc-max-rank {params.cmc_max_rank} --resamples {params.resamples}"
        " --seed {params.seed} --by {params.by} --worst-queries {params.worst_queries}"
        " --worst-encoders {params.worst_encoders} --top-k {params.top_k}"
        " --html {output.html:q} --md {output.md:q} --json {output.json:q}"
        " --csv {output.csv:q} --tex {output.tex:q} --figures {output.figures:q}"
        " --figure-formats {params.figure_formats} --cache {params.cache:q}"
        " --workers {threads}"
        " {params.verification} > {log:q} 2>&1"
        " || {{ s=$?; tail -n 1 {log:q} >&2; exit $s; }}"
