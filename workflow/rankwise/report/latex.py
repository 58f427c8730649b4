"""The LaTeX rendering of the report document: a standalone ``article`` with one
booktabs table per dataset (values with their interval, best in bold) and, below it,
the paired differences with their significance marks; the caption states the protocol,
distance, units, skipped queries and the statistics.  Cells and words come from
:mod:`.view`; needs the ``booktabs`` package (TeX Live: texlive-latex-recommended).
"""

from __future__ import annotations

from typing import Any

from . import view

#: LaTeX's special characters in text mode.
_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": "$<$",
    ">": "$>$",
    "\u2212": "$-$",
}


def _tex(text: Any) -> str:
    return "".join(_SPECIAL.get(c, c) for c in str(text))


def _value(cell: view.ValueCell) -> str:
    text = rf"\textbf{{{cell.text}}}" if cell.best else cell.text
    return text + (rf" {{\scriptsize {_tex(view.fmt_ci(cell.ci))}}}" if cell.ci else "")


def _diff(cell: view.DiffCell | None) -> str:
    if cell is None:
        return "--"
    text = _tex(view.fmt_diff(cell.comparison["diff"]))
    return text + (rf"$^{{{view.SIGNIFICANT_MARK}}}$" if cell.significant else "")


def _tabular(
    header: list[str], rows: list[list[str]], groups: list[tuple[str, int]] = ()
) -> list[str]:
    """A booktabs tabular; ``groups``: ``(title, span)`` headings over the value columns."""
    top = []
    if groups:
        spans, cmids, start = [], [], 2
        for title, span in groups:
            spans.append(rf"\multicolumn{{{span}}}{{c}}{{{title}}}")
            cmids.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
            start += span
        top = [" & ".join([""] + spans) + r" \\", " ".join(cmids)]
    return [
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        *top,
        " & ".join(header) + r" \\",
        r"\midrule",
        *(" & ".join(row) + r" \\" for row in rows),
        r"\bottomrule",
        r"\end{tabular}",
    ]


def _caption(doc: dict[str, Any], dataset: str, first: dict[str, Any], differences: bool) -> str:
    text = (
        f"{dataset}: protocol {first['protocol']}, distance {first['distance']}, "
        f"{first['num_queries']} {view.units_name(first['protocol'])} "
        f"({first['num_skipped']} skipped), {first['num_gallery']} gallery items. "
        f"Percentages; best per column in bold"
    )
    if doc["statistics"]["resamples"]:
        text += f", [low, high] its {view.confidence_label(doc)} interval"
    text += ". "
    if differences:
        text += (
            f"Below: differences b - a in percentage points, {view.SIGNIFICANT_MARK} "
            f"significant ({view.significance_rule(doc)}). "
        )
    return _tex(text + view.stats_sentence(doc))


def render_latex(doc: dict[str, Any]) -> str:
    """A standalone LaTeX document (``pdflatex report.tex``); copy its tables into a paper."""
    # the default OT1 fonts: Type 1 Computer Modern in every TeX Live (T1 needs cm-super
    # or lmodern, else bitmap fonts); hence "<" and ">" in math mode
    out = [
        r"\documentclass{article}",
        r"\usepackage[utf8]{inputenc}",
        r"\usepackage{booktabs}",
        r"\usepackage[margin=2cm,landscape]{geometry}",
        r"\begin{document}",
        rf"\section*{{{_tex(doc['title'])}}}",
        "",
    ]
    header, body = view.overview(doc)
    out += [r"\begin{table}[htbp]", r"\centering", r"\footnotesize"]
    datasets = list(dict.fromkeys(d for d, _ in header))
    out += _tabular(
        ["encoder"] + [_tex(h) for _, h in header],
        [[_tex(e)] + [_value(c) for c in cells] for e, cells in body],
        [(_tex(d), sum(d == x for x, _ in header)) for d in datasets],
    )
    best = "; ".join(f"{d}: {e} ({what})" for d, e, what in view.best_checkpoints(doc))
    out += [
        rf"\caption{{Overview: each dataset's headline metrics. Best checkpoint per "
        rf"dataset: {_tex(best)}.}}",
        r"\label{tab:rankwise-overview}",
        r"\end{table}",
        "",
    ]
    for number, (dataset, rows) in enumerate(view.by_dataset(doc), 1):
        names, table = view.metrics_table(rows)
        comparisons = view.dataset_comparisons(doc, dataset)
        out += [r"\begin{table}[htbp]", r"\centering", r"\small"]
        out += _tabular(
            ["encoder"] + [_tex(n) for n in names],
            [[_tex(e)] + [_value(c) for c in cells] for e, cells in table],
        )
        if comparisons:
            out += [r"\par\medskip"]
            out += _tabular(
                ["b - a"] + [_tex(n) for n in names],
                [
                    [_tex(f"{b} - {a}")] + [_diff(c) for c in cells]
                    for a, b, cells in view.differences(comparisons, names)
                ],
            )
        out += [
            rf"\caption{{{_caption(doc, dataset, rows[0], bool(comparisons))}}}",
            rf"\label{{tab:rankwise-{number}}}",
            r"\end{table}",
            "",
        ]
    out += [r"\end{document}", ""]
    return "\n".join(out)
