"""`rankwise report --figures DIR`: every chart of the report as SVG and PDF for a paper
column: one file per chart kind present, parseable, 3.4 in wide, text at 7-8 pt and never
rasterised, listed in report.json, linked from the HTML and Markdown, the same bytes on
every run (whatever the process's hash seed); `--figure-formats` writes one format only.

The report covers every kind of chart: a recall dataset (three unordered encoders:
metrics as points, CMC), a progressive one (also the completion curve), a checkpoint
sweep (metrics as lines over the epochs) and a dataset with one encoder (metrics as bars).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import unquote

import pytest
from test_report import invoke, results  # noqa: F401  (the results fixture)

from rankwise.errors import RankwiseError
from rankwise.report import build_report, write_figures

SVG = "{http://www.w3.org/2000/svg}"
# dataset -> the chart kinds it must have
KINDS = {
    "toy": ["metrics", "cmc"],
    "sketchy": ["metrics", "cmc", "progressive"],
    "sweep": ["metrics", "cmc"],
    "single": ["metrics", "cmc"],
}


@pytest.fixture(scope="module")
def metrics(results):  # noqa: F811
    """The report fixture's metrics files, plus a sweep and a one-encoder dataset made
    of copies of toy's (the file stem names the encoder, the folder the dataset)."""
    root, files = results
    toy = [f for f in files if f.parent.name == "toy"]
    extra = []
    for epoch, source in zip((1, 5, 9), toy, strict=True):
        extra.append(root / "metrics/sweep" / f"r50@epoch_{epoch}.json")
        extra[-1].parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, extra[-1])
    extra.append(root / "metrics/single/enc-a.json")
    extra[-1].parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(toy[0], extra[-1])
    return [str(f) for f in files + extra]


def report_args(metrics: list[str], out: Path, figures: Path) -> list:
    return [
        "report",
        *metrics,
        "--out-dir",
        out,
        "--resamples",
        "50",
        "--worst-queries",
        "0",
        "--figures",
        figures,
    ]


@pytest.fixture(scope="module")
def written(metrics, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    invoke(*report_args(metrics, out / "report", out / "report/figures"))
    return out / "report"


def test_one_svg_and_pdf_per_chart_kind(written):
    expected = {
        f"{d}-{k}.{fmt}" for d, kinds in KINDS.items() for k in kinds for fmt in ("svg", "pdf")
    }
    assert {p.name for p in (written / "figures").iterdir()} == expected
    doc = json.loads((written / "report.json").read_text())
    assert [(f["dataset"], f["kind"]) for f in doc["figures"]] == [
        (d, k) for d, kinds in KINDS.items() for k in kinds
    ]
    for entry in doc["figures"]:
        for fmt in ("svg", "pdf"):
            name = f"{entry['dataset']}-{entry['kind']}.{fmt}"
            assert entry[fmt] == str(written / "figures" / name)
        assert entry["caption"]


def _svg_checks(path: Path) -> None:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    width, height = (float(root.get(a).removesuffix("pt")) / 72 for a in ("width", "height"))
    assert 3.3 <= width <= 3.5 and 1.8 <= height <= 3.0, (path.name, width, height)
    assert not list(root.iter(f"{SVG}image")), "nothing rasterised"
    assert not list(root.iter(f"{SVG}text")), "text is drawn as outlines"
    # text-as-path glyphs are scaled by size / 100: every label is 7-8 pt
    sizes = {
        round(100 * float(s), 6) for s in re.findall(r"scale\(([\d.]+) -\1\)", path.read_text())
    }
    assert sizes and sizes <= {7.0, 8.0}, (path.name, sizes)


def _pdf_checks(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    (box,) = re.findall(rb"/MediaBox \[ 0 0 ([\d.]+) ([\d.]+) \]", data)
    width, height = (float(v) / 72 for v in box)
    assert 3.3 <= width <= 3.5 and 1.8 <= height <= 3.0, (path.name, width, height)
    assert b"/Subtype /Image" not in data, "nothing rasterised"
    assert b"/Type3" not in data and b"/FontFile2" in data  # embedded TrueType text
    assert b"/CreationDate" not in data and b"Matplotlib" not in data


@pytest.mark.parametrize("fmt", ["svg", "pdf"])
def test_files_are_vector_figures_one_column_wide(written, fmt):
    check = _svg_checks if fmt == "svg" else _pdf_checks
    for path in sorted((written / "figures").glob(f"*.{fmt}")):
        check(path)


def test_pdf_figures_go_into_a_latex_paper_column(written, tmp_path):
    """pdflatex reads every PDF figure, at its natural size, in an IEEE-sized column
    (3.5 in) without an overfull box: the figure fits the column unscaled."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (Debian: texlive-latex-base)")
    figures = sorted(p.name for p in (written / "figures").glob("*.pdf"))
    body = "\n".join(f"\\noindent\\includegraphics{{{name}}}\\par" for name in figures)
    (tmp_path / "paper.tex").write_text(
        "\\documentclass{article}\n\\usepackage{graphicx}\n"
        "\\setlength{\\textwidth}{3.5in}\\setlength{\\hfuzz}{0pt}\n"
        f"\\begin{{document}}\n{body}\n\\end{{document}}\n"
    )
    for name in figures:
        shutil.copy(written / "figures" / name, tmp_path / name)
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    log = (tmp_path / "paper.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log, log[-2000:]
    assert log.count("<use ") == len(figures)  # each figure read (pdfTeX logs its file)


def test_paper_charts_use_paper_fonts(written):
    """Every text artist of every paper chart (not only those in the SVG glyph check)."""
    from matplotlib.text import Text

    from rankwise.report import view
    from rankwise.report.plots import PAPER, dataset_plots

    doc = json.loads((written / "report.json").read_text())
    for _, rows in view.by_dataset(doc):
        for plot in dataset_plots(doc, rows):
            fig = plot.draw(PAPER)
            assert tuple(fig.get_size_inches()) == (PAPER.width, PAPER.height)
            texts = [t for t in fig.findobj(Text) if t.get_text()]
            assert texts and {t.get_fontsize() for t in texts} <= {7.0, 8.0}, plot.kind


def test_names_are_plain_text_and_every_encoder_is_in_the_legend(written, tmp_path):
    """A name with ``$...$`` was read as mathtext (``$\\alpha_{1}$`` set as math,
    ``$\\x$`` a traceback); a name starting with ``_`` was left out of the legend."""
    import warnings

    from matplotlib.legend import Legend

    from rankwise.report import view
    from rankwise.report.plots import SCREEN, dataset_plots, png

    names = {"enc-a": "$\\x$ a", "enc-b": "_b", "enc-c": "c$1", "toy": "$\\y$"}
    text = (written / "report.json").read_text()
    for old, new in names.items():
        text = text.replace(json.dumps(old), json.dumps(new))
    doc = json.loads(text)
    shown = {"$\\x$ a", "_b", "c$1"}
    for dataset, rows in view.by_dataset(doc):
        for plot in dataset_plots(doc, rows):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a missing glyph would warn
                fig = plot.draw(SCREEN)
                png(fig)  # drawn: mathtext is parsed here
            if plot.kind not in ("cmc", "progressive") or dataset not in ("$\\y$", "sketchy"):
                continue
            (legend,) = fig.findobj(Legend)
            texts = {t.get_text() for t in legend.get_texts()}
            # as drawn: the zero-width space dropped, "\$" a literal "$"
            assert {t.lstrip("\u200b").replace("\\$", "$") for t in texts} == shown, plot.kind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_figures(doc, tmp_path / "figs")


def _links(text: str, pattern: str) -> list[str]:
    return re.findall(pattern, text)


def test_html_and_markdown_link_every_figure(metrics, tmp_path):
    """Links are relative to each file's own folder, wherever the figures go, and
    percent-encoded (a space ended the Markdown link, a '#' began a fragment)."""
    figures = tmp_path / "paper figs#2 (x)/figs"
    invoke(
        "report",
        *metrics,
        "--html",
        tmp_path / "web/r.html",
        "--md",
        tmp_path / "r.md",
        "--json",
        tmp_path / "r.json",
        "--resamples",
        "0",
        "--worst-queries",
        "0",
        "--figures",
        figures,
    )
    files = {p.resolve() for p in figures.iterdir()}
    html = _links((tmp_path / "web/r.html").read_text(), r'<a href="([^"]+)">')
    assert {(tmp_path / "web" / unquote(link)).resolve() for link in html} == files
    md = _links((tmp_path / "r.md").read_text(), r"\]\(([^)]+\.(?:svg|pdf))\)")
    assert {(tmp_path / unquote(link)).resolve() for link in md} == files
    assert all(not Path(link).is_absolute() for link in html + md)
    assert not any(c in link for link in html + md for c in " #()"), html + md


def test_without_figures_nothing_is_linked(metrics, tmp_path):
    invoke("report", *metrics[:2], "--out-dir", tmp_path, "--resamples", "0")
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["figures"] == []
    assert "<a href" not in (tmp_path / "report.html").read_text()
    assert ".svg" not in (tmp_path / "report.md").read_text()


def test_same_bytes_on_every_run(metrics, written, tmp_path):
    """A second run in a fresh process, with another hash seed, writes the same bytes
    (the paths inside report.json are the same because the folder names are)."""
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    args = [str(a) for a in report_args(metrics, out, out / "figures")]
    code = "import sys; from rankwise.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (written / "figures").iterdir())
    assert names == sorted(p.name for p in (out / "figures").iterdir())
    for name in names:
        assert (written / "figures" / name).read_bytes() == (out / "figures" / name).read_bytes()
    for name in ("report.html", "report.md"):
        assert (written / name).read_bytes() == (out / name).read_bytes()


def test_dataset_names_are_made_safe_for_file_names(metrics, tmp_path):
    """A dataset folder name with a space becomes `_` in the file name; two names that
    would collide are an error naming both, and nothing is written."""
    from rankwise.report.figures import figure_stem

    assert figure_stem("my data/x", "cmc") == "my_data_x-cmc"
    doc = build_report(metrics[:1], resamples=0, worst_queries=0)
    twin = json.loads(json.dumps(doc))
    twin["datasets"] = ["a b", "a_b"]
    twin["results"] = [dict(doc["results"][0], dataset=d) for d in twin["datasets"]]
    with pytest.raises(RankwiseError, match=r"datasets 'a b' and 'a_b' would write the same"):
        write_figures(twin, tmp_path / "figs")
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("formats", ["svg", "pdf"])
def test_one_format_only(metrics, tmp_path, formats):
    invoke(
        "report",
        *metrics[:3],
        "--out-dir",
        tmp_path,
        "--resamples",
        "0",
        "--figures",
        tmp_path / "figures",
        "--figure-formats",
        formats,
    )
    assert {p.suffix for p in (tmp_path / "figures").iterdir()} == {f".{formats}"}
    doc = json.loads((tmp_path / "report.json").read_text())
    other = "pdf" if formats == "svg" else "svg"
    assert doc["figures"] and all(f[other] is None and f[formats] for f in doc["figures"])
    html = _links((tmp_path / "report.html").read_text(), r'<a href="([^"]+)">')
    md = _links((tmp_path / "report.md").read_text(), r"\]\(([^)]+)\)")
    assert (
        sorted(html)
        == sorted(md)
        == sorted(f"figures/{p.name}" for p in (tmp_path / "figures").iterdir())
    )


def test_bad_formats(metrics, tmp_path):
    from click.testing import CliRunner

    from rankwise.cli import main

    args = ["report", metrics[0], "--figures", str(tmp_path / "f"), "--figure-formats", "png"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--figure-formats" in result.output
    doc = build_report(metrics[:1], resamples=0, worst_queries=0)
    with pytest.raises(RankwiseError, match="formats must be some of svg, pdf, got png"):
        write_figures(doc, tmp_path / "f", ("png",))
    assert not (tmp_path / "f").exists()


def _write(metrics, folder: Path, workers: int) -> dict:
    """write_report into ``folder`` with relative paths (so report.json is comparable)."""
    from rankwise.report import write_report

    folder.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return write_report(
            metrics,
            html_path="report.html",
            md_path="report.md",
            json_path="report.json",
            csv_path="report.csv",
            tex_path="report.tex",
            figures_dir="figures",
            workers=workers,
            resamples=50,
            worst_queries=0,
        )
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("split", ["shared", "all by the child", "all by this process"])
def test_figures_drawn_beside_the_documents_are_the_same_files(
    metrics, tmp_path, monkeypatch, split
):
    """workers=2 draws the figures in a forked process, begun once the results have
    their statistics, while this one adds the tests and renders the documents, then
    takes the figures the other has not begun: every file has the same bytes as with
    one process, however the figures fall to the two."""
    from rankwise.report import figures

    one = _write(metrics, tmp_path / "one", 1)
    if split == "all by the child":
        monkeypatch.setattr(figures.DrawInBackground, "draw_rest", lambda self: None)
    elif split == "all by this process":
        take = figures.DrawInBackground._take
        monkeypatch.setattr(
            figures.DrawInBackground,
            "_take",
            lambda self, front: None if front else take(self, front=front),
        )
    two = _write(metrics, tmp_path / "two", 2)
    assert one["figures"] == two["figures"] and len(one["figures"]) >= 3
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*"))
    assert files == sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*"))
    for rel in files:
        if (tmp_path / "one" / rel).is_file():
            assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes()


def test_charts_read_only_what_the_document_has_when_its_statistics_are_in(metrics):
    """build_report's on_statistics (where the figure process starts) gets the document
    before the worst queries and the tests: every chart drawn from it has the bytes of
    the chart drawn from the finished document, and the hook changes nothing in it."""
    import copy

    from rankwise.report import view
    from rankwise.report.figures import _vector
    from rankwise.report.plots import PAPER, dataset_plots

    early: list[dict] = []
    options = {"resamples": 50, "worst_queries": 2, "worst_encoders": "all"}
    doc = build_report(metrics, **options, on_statistics=lambda d: early.append(copy.deepcopy(d)))
    assert json.dumps(doc) == json.dumps(build_report(metrics, **options))
    (partial,) = early
    assert "comparisons" not in partial and not any(r["worst_queries"] for r in partial["results"])
    assert doc["comparisons"] and any(r["worst_queries"] for r in doc["results"])
    drawn = 0
    for (dataset, rows), (_, done) in zip(
        view.by_dataset(partial), view.by_dataset(doc), strict=True
    ):
        plots, final = dataset_plots(partial, rows), dataset_plots(doc, done)
        assert [(p.kind, p.caption) for p in plots] == [(p.kind, p.caption) for p in final]
        for plot, same in zip(plots, final, strict=True):
            assert _vector(plot.draw(PAPER), "svg") == _vector(same.draw(PAPER), "svg")
            drawn += 1
    assert drawn >= 8


@pytest.mark.parametrize("blocked", [0, -1])  # the child takes it / this process takes it
def test_a_figure_that_cannot_be_written_stops_the_report(metrics, tmp_path, blocked):
    """The first figure is the forked process's first, the last this process's first:
    either failing raises the error it met (as with one process) and no document is
    written."""
    doc = build_report(metrics, resamples=0, worst_queries=0)
    from rankwise.report.figures import plan_figures

    entry = plan_figures(doc, "figures", ("svg", "pdf"))[blocked][0]
    for workers in (1, 2):
        folder = tmp_path / f"w{workers}"
        (folder / entry["svg"]).mkdir(parents=True)  # a folder where the file should go
        with pytest.raises(IsADirectoryError):
            _write(metrics, folder, workers)
        assert not (folder / "report.html").exists() and not (folder / "report.json").exists()


def _pdfs(doc, folder: Path, fonts=None) -> dict[str, bytes]:
    """Every chart of ``doc`` drawn as PDF into ``folder``: name -> bytes."""
    from rankwise.report.figures import draw_figures, plan_figures

    draw_figures(plan_figures(doc, folder, ("pdf",)), fonts=fonts)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def subsetting(monkeypatch):
    """Counts matplotlib's own font subsetting (what the kept subsets save)."""
    from matplotlib.backends import _backend_pdf_ps as internals

    calls = []
    original = internals.get_glyphs_subset

    def counted(fontfile, glyphs):
        calls.append(sorted(glyphs))
        return original(fontfile, glyphs)

    monkeypatch.setattr(internals, "get_glyphs_subset", counted)
    return calls


def test_pdf_font_subsets_are_kept_and_give_the_same_files(metrics, tmp_path, subsetting):
    """The TrueType subsets a PDF embeds are kept in the report's cache: a second drawing
    cuts none and writes the same bytes as drawing without the cache."""
    from rankwise.report.pairs import PairCache

    doc = build_report(metrics, resamples=0, worst_queries=0)
    plain = _pdfs(doc, tmp_path / "plain")
    assert len(plain) >= 8 and len(subsetting) >= len(plain)  # one font or more each
    cache = tmp_path / "cache"
    subsetting.clear()
    first = _pdfs(doc, tmp_path / "first", PairCache(cache))
    kept = sorted(cache.iterdir())
    # a subset per distinct set of glyphs, each cut once (the same glyphs: read back)
    assert 1 <= len(kept) == len({tuple(g) for g in subsetting}) <= len(subsetting)
    subsetting.clear()
    again = _pdfs(doc, tmp_path / "again", PairCache(cache))
    assert subsetting == [] and sorted(cache.iterdir()) == kept
    assert first == plain and again == plain


def test_kept_font_subsets_are_keyed_by_versions_and_font_file(
    metrics, tmp_path, subsetting, monkeypatch
):
    """Another matplotlib or fontTools version, or a font file with other bytes, cuts
    the subsets again (a kept one would be another's bytes); a damaged entry too."""
    import fontTools
    import matplotlib

    from rankwise.report import figures
    from rankwise.report.pairs import PairCache

    doc = build_report(metrics[:3], resamples=0, worst_queries=0)
    plain = _pdfs(doc, tmp_path / "plain")
    cache = PairCache(tmp_path / "cache")
    _pdfs(doc, tmp_path / "kept", cache)
    changes = [
        (matplotlib, "__version__", matplotlib.__version__ + ".post1"),
        (fontTools, "version", fontTools.version + ".post1"),
        (figures, "_file_sha256", lambda path: "0" * 64),
    ]
    for n, (module, name, value) in enumerate(changes):
        with monkeypatch.context() as patch:
            patch.setattr(module, name, value)
            subsetting.clear()
            assert _pdfs(doc, tmp_path / f"changed{n}", cache) == plain
            assert subsetting  # cut again
    for entry in (tmp_path / "cache").iterdir():
        entry.write_text('{"value": {"font": 3}, "format": 3}')
    subsetting.clear()
    assert _pdfs(doc, tmp_path / "damaged", cache) == plain and subsetting


@pytest.mark.parametrize("damage", ["font not base64", "glyph map of other glyphs"])
def test_a_damaged_font_subset_under_its_own_key_is_cut_again(
    metrics, tmp_path, subsetting, damage
):
    """An entry with its key but bytes that are not base64, or a glyph map lacking the
    glyphs asked for, was a traceback (binascii.Error, KeyError) from the report."""
    import json

    from rankwise.report.pairs import PairCache

    doc = build_report(metrics[:3], resamples=0, worst_queries=0)
    plain = _pdfs(doc, tmp_path / "plain")
    _pdfs(doc, tmp_path / "kept", PairCache(tmp_path / "cache"))
    for path in (tmp_path / "cache").iterdir():
        entry = json.loads(path.read_text())
        if damage == "font not base64":
            entry["value"]["font"] = "not base64!"
        else:
            entry["value"]["glyph_index_map"] = [[100000, 1]]
        path.write_text(json.dumps(entry))
    subsetting.clear()
    assert _pdfs(doc, tmp_path / "damaged", PairCache(tmp_path / "cache")) == plain
    assert subsetting  # cut again


def test_file_digest_follows_the_file(tmp_path):
    from rankwise.report.figures import _file_sha256

    path = tmp_path / "font.ttf"
    path.write_bytes(b"glyphs")
    first = _file_sha256(path)
    path.write_bytes(b"glyphs, other ones")
    assert _file_sha256(path) != first and len(first) == 64


def test_other_matplotlib_internals_subset_as_usual(metrics, tmp_path, monkeypatch):
    """A matplotlib whose subsetting is not the one the kept subsets stand in for (the
    3.8-3.10 signature) subsets as usual: nothing is kept, the same files."""
    from matplotlib.backends import _backend_pdf_ps as internals

    from rankwise.report.pairs import PairCache

    doc = build_report(metrics[:3], resamples=0, worst_queries=0)
    plain = _pdfs(doc, tmp_path / "plain")
    original = internals.get_glyphs_subset

    def older(fontfile, characters):
        return original(fontfile, characters)

    monkeypatch.setattr(internals, "get_glyphs_subset", older)
    assert _pdfs(doc, tmp_path / "older", PairCache(tmp_path / "cache")) == plain
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_blas_on_one_thread_only_while_the_figure_process_draws(metrics, tmp_path, workers):
    """Beside the figure process the paired tests' products run on one BLAS thread (two
    threads on the second process's core took 1.5-2.3x as long), and the limit is lifted
    when the report is written; with one process BLAS keeps its threads."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from rankwise.report import document

    def blas_threads() -> set[int]:
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

    seen = []
    compare = document.compare_encoders

    def spied(*args, **kwargs):
        seen.append(blas_threads())
        return compare(*args, **kwargs)

    with threadpool_limits(2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("no BLAS with two threads here")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(document, "compare_encoders", spied)
            _write(metrics, tmp_path, workers)
        assert seen == ([{1}] if workers == 2 else [{2}])
        assert blas_threads() == {2}
