"""The LaTeX rendering of the report document: a standalone ``article`` with one
booktabs table per dataset (values with their interval, best in bold) and, below it,
the paired differences with their significance marks; the caption states the protocol,
distance, units, skipped queries and the statistics.  Cells and words come from
:mod:`.view`; needs the ``booktabs`` package (TeX Live: texlive-latex-recommended) and
``graphicx`` (texlive-latex-base).

Every tabular fits :data:`TABLE_WIDTH_PT` (17 cm, about a two-column paper's text
width): the metric columns are split over as many tabulars as it takes, stacked in the
table, by widths estimated from the cells' characters; a tabular still wider than the
line (a very long encoder name) is scaled down to it (the ``rankwisefit`` environment
of the preamble), never set past the margin.
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
    "|": r"\textbar{}",  # OT1 text mode would print an em dash
    '"': r"{\ttfamily\char34}",  # and a closing double quote
    "\u2212": "$-$",
    "\u00a0": "~",
    "\u00ad": "",
}

#: Characters pdflatex typesets from UTF-8 with the default OT1 fonts (checked
#: character by character with TeX Live's pdflatex): Latin-1 and Latin Extended-A but
#: for those needing T1 glyphs (guillemets, eth, thorn, ogonek letters, ...), and common
#: punctuation (dashes, curly quotes, daggers, bullet, ellipsis, per mille, euro, TM).
_NEEDS_T1 = (0xAB, 0xBB, 0xD0, 0xDE, 0xF0, 0xFE, 0x104, 0x105, 0x110, 0x111, 0x118, 0x119)
_NEEDS_T1 += (0x126, 0x127, 0x12E, 0x12F, 0x138, 0x13F, 0x140, 0x149, 0x14A, 0x14B)
_NEEDS_T1 += (0x166, 0x167, 0x172, 0x173, 0x17F)
_PUNCTUATION = (0x2013, 0x2014, 0x2018, 0x2019, 0x201C, 0x201D, 0x2020, 0x2021, 0x2022)
_PUNCTUATION += (0x2026, 0x2030, 0x20AC, 0x2122)
_TEXT = {chr(c) for c in range(0xA1, 0x180) if c not in _NEEDS_T1} | set(map(chr, _PUNCTUATION))

#: Greek letters and a few symbols, set in math mode (text-mode Greek needs other fonts).
_GREEK = [
    *(r"\alpha", r"\beta", r"\gamma", r"\delta", r"\varepsilon", r"\zeta", r"\eta"),
    *(r"\theta", r"\iota", r"\kappa", r"\lambda", r"\mu", r"\nu", r"\xi", "o", r"\pi"),
    *(r"\rho", r"\varsigma", r"\sigma", r"\tau", r"\upsilon", r"\varphi", r"\chi"),
    *(r"\psi", r"\omega"),
]
_MATH = {chr(0x3B1 + i): name for i, name in enumerate(_GREEK)}  # alpha .. omega
_MATH.update(
    {
        "\u0393": r"\Gamma",
        "\u0394": r"\Delta",
        "\u0398": r"\Theta",
        "\u039b": r"\Lambda",
        "\u039e": r"\Xi",
        "\u03a0": r"\Pi",
        "\u03a3": r"\Sigma",
        "\u03a5": r"\Upsilon",
        "\u03a6": r"\Phi",
        "\u03a8": r"\Psi",
        "\u03a9": r"\Omega",
        "\u2264": r"\leq",
        "\u2265": r"\geq",
        "\u2260": r"\neq",
        "\u2248": r"\approx",
        "\u221e": r"\infty",
        "\u2192": r"\rightarrow",
        "\u2190": r"\leftarrow",
        "\u2032": "'",
        "\u2033": "''",
    }
)


def _char(c: str) -> str:
    if c in _SPECIAL:
        return _SPECIAL[c]
    if " " <= c <= "~" or c in _TEXT:
        return c
    if c in _MATH:
        return rf"\ensuremath{{{_MATH[c]}}}"
    # anything else (CJK, emoji, other scripts) has no glyph here: its code point, so
    # the document compiles and says what was there
    return rf"\texttt{{[U+{ord(c):04X}]}}"


def _tex(text: Any) -> str:
    """``text`` for LaTeX text mode: specials escaped; characters the default fonts
    lack in math mode (Greek) or as their code point (``[U+6A21]``)."""
    return "".join(_char(c) for c in str(text))


#: The width (pt) every tabular is laid out to fit: 17 cm, the text of a portrait A4 or
#: letter page between 2 cm margins and about a two-column paper's (table*).
TABLE_WIDTH_PT = 480.0
#: Space around each column (LaTeX's \tabcolsep, 6 pt on each side).
_COLUMN_SEP_PT = 12.0
#: Font sizes (pt) of the article class at 10 pt: the overview's, the dataset tables',
#: and the intervals'.
_FOOTNOTESIZE, _SMALL, _SCRIPTSIZE = 8.0, 9.0, 7.0


#: Widths (em) of Computer Modern Roman's narrow and wide characters; digits and an
#: average lower-case letter are 0.5 em, capitals and the rest about 0.75.
_EM = {**dict.fromkeys(".,:;'|!il", 0.28), **dict.fromkeys("[]()- fjrt", 0.39)}
_EM.update({**dict.fromkeys("0123456789abcdeghknopqsuvxyz_", 0.5), "m": 0.83, "w": 0.72})


def _text_pt(text: str, size: float, bold: bool = False) -> float:
    """A generous estimate (10 % over) of the width of ``text`` set at ``size`` pt in
    Computer Modern (bold: 15 % wider)."""
    em = sum(_EM.get(c, 0.75) for c in text)
    return 1.1 * em * size * (1.15 if bold else 1.0)


def _value_pt(cell: view.ValueCell, size: float) -> float:
    width = _text_pt(cell.text, size, cell.best)
    return width + (size / 3 + _text_pt(view.fmt_ci(cell.ci), _SCRIPTSIZE) if cell.ci else 0)


def _packed(first_pt: float, units: list[tuple[list[int], float]]) -> list[list[int]]:
    """Consecutive units of columns ``(columns, width)`` in as few groups as fit
    :data:`TABLE_WIDTH_PT` beside the first column (``first_pt`` wide; a unit wider than
    that alone is a group of its own), the widest group as narrow as can be (6 columns
    in two groups: 3 and 3, not 5 and 1) while every group of two units or more fits."""
    room = TABLE_WIDTH_PT - first_pt - _COLUMN_SEP_PT
    count, width = 0, room  # how many groups the greedy packing needs
    for _, unit_pt in units:
        if count and width + unit_pt <= room:
            width += unit_pt
        else:
            count, width = count + 1, unit_pt
    n = len(units)
    # widest[g][i]: the narrowest widest group of units i.. in g groups, every group of
    # two or more units within the room (the greedy packing is such a split, so one
    # exists); cut: its first cut
    inf = float("inf")
    widest = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[n] * (n + 1) for _ in range(count + 1)]
    widest[0][n] = 0.0
    for g in range(1, count + 1):
        for i in range(n - 1, -1, -1):
            group = 0.0
            for j in range(i + 1, n + 1):
                group += units[j - 1][1]
                if j > i + 1 and group > room:
                    break  # and so is every longer group from i
                w = max(group, widest[g - 1][j])
                if w < widest[g][i]:
                    widest[g][i], cut[g][i] = w, j
    groups, i = [], 0
    for g in range(count, 0, -1):
        j = cut[g][i]
        groups.append([c for columns, _ in units[i:j] for c in columns])
        i = j
    return groups


def _column_pt(name: str, cells_pt: list[float], size: float) -> float:
    """The width of a column headed ``name`` whose cells are ``cells_pt`` wide, with its
    space around."""
    return _COLUMN_SEP_PT + max([_text_pt(name, size), *cells_pt])


def _column_groups(first: list[str], header: list[str], cells: list[list[float]], size: float):
    """Groups of the columns of a table whose first column holds ``first`` (header
    included) and whose column ``j`` has the header ``header[j]`` and cells of the
    widths ``cells[i][j]`` (pt), each group fitting :data:`TABLE_WIDTH_PT`."""
    first_pt = max(_text_pt(text, size) for text in first)
    units = [
        ([j], _column_pt(name, [row[j] for row in cells], size)) for j, name in enumerate(header)
    ]
    return _packed(first_pt, units)


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
    r"""A booktabs tabular; ``groups``: ``(title, span)`` headings over the value columns.

    Each row starts with ``{}``: after ``\\`` or a rule, a first cell starting with
    ``[`` was read as an optional argument (pdflatex failed) and one starting with
    ``*`` as ``\\*`` (the ``*`` vanished)."""

    def line(cells: list[str]) -> str:
        return "{}" + " & ".join(cells) + r" \\"

    top = []
    if groups:
        spans, cmids, start = [], [], 2
        for title, span in groups:
            spans.append(rf"\multicolumn{{{span}}}{{c}}{{{title}}}")
            cmids.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
            start += span
        top = [line([""] + spans), " ".join(cmids)]
    return [
        r"\begin{rankwisefit}",
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        *top,
        line(header),
        r"\midrule",
        *(line(row) for row in rows),
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{rankwisefit}",
    ]


def _split(
    first: str, header: list[str], rows: list[tuple[str, list[str]]], groups: list[list[int]]
) -> list[str]:
    """One tabular per group of columns, stacked: each with the first column."""
    out: list[str] = []
    for k, columns in enumerate(groups):
        out += [r"\par\medskip"] if k else []
        out += _tabular(
            [first] + [header[j] for j in columns],
            [[name] + [cells[j] for j in columns] for name, cells in rows],
        )
    return out


def _caption(
    doc: dict[str, Any], dataset: str, rows: list[dict[str, Any]], differences: bool
) -> str:
    first = rows[0]
    text = (
        f"{dataset}: protocol {first['protocol']}, distance {view.distance(rows)}, "
        f"{view.counts(rows)}. "
        f"Percentages; best per column in bold"
    )
    if view.has_intervals(rows):
        text += f", [low, high] its {view.confidence_label(doc)} interval"
    text += ". "
    if differences:
        text += (
            f"Below: differences b - a in percentage points, {view.SIGNIFICANT_MARK} "
            f"significant ({view.significance_rule(doc)}). "
        )
    # the notes Markdown and HTML print under the dataset's header, in their order
    notes = [view.dropped_rows_note(rows), view.missing_metrics_note(rows)]
    notes += [view.no_statistics_note(doc, dataset)]
    notes += [view.not_compared_note(doc, dataset)]
    notes += [view.unattainable_note(doc, dataset) if differences else None]
    return _tex(" ".join([text + view.stats_sentence(doc, rows), *filter(None, notes)]))


def render_latex(doc: dict[str, Any]) -> str:
    """A standalone LaTeX document (``pdflatex report.tex``); copy its tables into a paper."""
    # the default OT1 fonts: Type 1 Computer Modern in every TeX Live (T1 needs cm-super
    # or lmodern, else bitmap fonts); hence "<" and ">" in math mode
    out = [
        r"\documentclass{article}",
        r"\usepackage[utf8]{inputenc}",
        r"\usepackage{booktabs}",
        r"\usepackage{graphicx}",
        r"\usepackage[margin=2cm]{geometry}",
        "% a tabular wider than the line is scaled down to it (copy these lines with a table)",
        r"\newsavebox{\rankwisebox}",
        r"\newenvironment{rankwisefit}{\begin{lrbox}{\rankwisebox}}{\end{lrbox}%",
        r"  \ifdim\wd\rankwisebox>\linewidth\resizebox{\linewidth}{!}{\usebox{\rankwisebox}}%",
        r"  \else\usebox{\rankwisebox}\fi}",
        r"\begin{document}",
        rf"\section*{{{_tex(doc['title'])}}}",
        "",
    ]
    header, body = view.overview(doc)
    out += [r"\begin{table}[htbp]", r"\centering", r"\footnotesize"]
    # whole datasets side by side, as many as fit
    first_pt = max(_text_pt(t, _FOOTNOTESIZE) for t in ["encoder"] + [e for e, _ in body])
    units = []
    for dataset in dict.fromkeys(d for d, _ in header):
        columns = [j for j, (d, _) in enumerate(header) if d == dataset]
        widths = [
            _column_pt(
                header[j][1], [_value_pt(c[j], _FOOTNOTESIZE) for _, c in body], _FOOTNOTESIZE
            )
            for j in columns
        ]
        units.append((columns, max(sum(widths), _text_pt(dataset, _FOOTNOTESIZE))))
    for k, columns in enumerate(_packed(first_pt, units)):
        datasets = list(dict.fromkeys(header[j][0] for j in columns))
        out += [r"\par\medskip"] if k else []
        out += _tabular(
            ["encoder"] + [_tex(header[j][1]) for j in columns],
            [[_tex(e)] + [_value(cells[j]) for j in columns] for e, cells in body],
            [(_tex(d), sum(header[j][0] == d for j in columns)) for d in datasets],
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
        groups = _column_groups(
            ["encoder"] + [e for e, _ in table],
            names,
            [[_value_pt(c, _SMALL) for c in cells] for _, cells in table],
            _SMALL,
        )
        rows_tex = [(_tex(e), [_value(c) for c in cells]) for e, cells in table]
        out += _split("encoder", [_tex(n) for n in names], rows_tex, groups)
        if comparisons:
            pairs = view.differences(comparisons, names)
            groups = _column_groups(
                ["b - a"] + [f"{b} - {a}" for a, b, _ in pairs],
                names,
                [[_text_pt(c.text if c else "--", _SMALL) for c in cells] for _, _, cells in pairs],
                _SMALL,
            )
            rows_tex = [(_tex(f"{b} - {a}"), [_diff(c) for c in cells]) for a, b, cells in pairs]
            out += [r"\par\medskip"]
            out += _split("b - a", [_tex(n) for n in names], rows_tex, groups)
        out += [
            rf"\caption{{{_caption(doc, dataset, rows, bool(comparisons))}}}",
            rf"\label{{tab:rankwise-{number}}}",
            r"\end{table}",
            "",
        ]
    out += [r"\end{document}", ""]
    return "\n".join(out)
