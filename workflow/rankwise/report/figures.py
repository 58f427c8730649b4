"""The report's charts as paper figures: SVG and PDF files one paper column wide.

For each dataset and each of its charts (:func:`.plots.dataset_plots`, the charts of the
HTML page), in the folder given (``rankwise report --figures DIR``; the pipeline's
``results/figures``), as SVG and PDF or one of them (``--figure-formats``)::

    <dataset>-metrics.{svg,pdf}      every metric across the encoders (bars for one encoder)
    <dataset>-cmc.{svg,pdf}          the CMC curves
    <dataset>-progressive.{svg,pdf}  the target's mean 1/rank against sketch completion

(``<dataset>`` with any character outside ``A-Za-z0-9_.+-`` replaced by ``_``).  The names
do not depend on the number of encoders, so a paper's ``\\includegraphics`` keeps working
when a checkpoint is added.  Each figure is :data:`.plots.PAPER`: 3.4 x 2.5 in, text at
7-8 pt, vector throughout (text as paths in SVG; TrueType fonts embedded in PDF, no
Type 3).  The same inputs give the same bytes: no date or software version in the files,
SVG ids from a fixed salt.  ``doc["figures"]`` lists the files written (paths as given,
relative to the working directory like the provenance's).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import RankwiseError

FORMATS = ("svg", "pdf")

# No date, and no software version (a matplotlib upgrade alone would change the bytes).
_METADATA: dict[str, dict[str, None]] = {
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
}
_RC = {
    "svg.hashsalt": "rankwise",  # clip-path and glyph ids: fixed, not random
    "svg.fonttype": "path",  # text drawn as outlines: the same in every viewer
    "pdf.fonttype": 42,  # embedded TrueType; Type 3 fonts are refused by some publishers
}


def figure_stem(dataset: str, kind: str) -> str:
    """``<dataset>-<kind>``, the dataset name made safe for a file name."""
    return f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', dataset)}-{kind}"


def _vector(fig, fmt: str, fonts=None) -> bytes:
    """The figure's bytes as ``fmt``; a PDF's font subsets kept in ``fonts`` (a
    :class:`.pairs.PairCache`, see :func:`_kept_font_subsets`)."""
    import matplotlib

    buffer = io.BytesIO()
    with matplotlib.rc_context(_RC), _kept_font_subsets(fonts if fmt == "pdf" else None):
        fig.savefig(buffer, format=fmt, metadata=_METADATA[fmt])
    return buffer.getvalue()


@contextlib.contextmanager
def _kept_font_subsets(cache) -> Iterator[None]:
    """While a PDF is written: the TrueType subsets matplotlib embeds (the glyphs the
    figure uses, cut from the font file by fontTools: ~60 ms a figure, half a PDF's
    time) remembered in ``cache`` (:meth:`.pairs.PairCache.remember`), keyed by all that
    makes their bytes: the font file's sha256 and face, the glyphs, and the versions of
    matplotlib (its subsetting options) and fontTools.  A new checkpoint's figures use
    the glyphs of the last report's (11 of 12 subsets in the demo).  The subset a hit
    gives is the bytes matplotlib wrote then, so the PDF is the same file.  Only for the
    matplotlib internals this was written against (3.11's ``get_glyphs_subset(fontfile,
    glyphs)``); with others, or no cache, matplotlib subsets as usual."""
    from matplotlib.backends import _backend_pdf_ps as internals

    original = internals.get_glyphs_subset
    if cache is None or cache.folder is None or not _subsets_as_known(internals):
        yield
        return

    def kept(fontfile, glyphs):
        import fontTools
        import matplotlib

        key = {
            "font": _file_sha256(fontfile.path),
            "face": int(fontfile.face_index),
            "glyphs": sorted(int(g) for g in glyphs),
            "matplotlib": matplotlib.__version__,
            "fonttools": fontTools.version,
        }

        def cut() -> dict[str, Any]:
            with original(fontfile, glyphs) as subset:
                data = internals.font_as_file(subset.font).getvalue()
                mapping = sorted((int(a), int(b)) for a, b in subset.glyph_index_map.items())
            return {"font": base64.b64encode(data).decode("ascii"), "glyph_index_map": mapping}

        def usable(value: Any) -> bool:
            return _is_font_subset(value, key["glyphs"])

        value = cache.remember("pdf_font_subset", key, cut, usable=usable)
        font = _SubsetBytes(base64.b64decode(value["font"]))
        mapping = {a: b for a, b in value["glyph_index_map"]}
        return internals.SubsetResults(font, mapping)._as_cm()

    internals.get_glyphs_subset = kept
    try:
        yield
    finally:
        internals.get_glyphs_subset = original


def _subsets_as_known(internals) -> bool:
    """Whether matplotlib's PDF font subsetting is the one :func:`_kept_font_subsets`
    stands in for."""
    import inspect

    try:
        params = list(inspect.signature(internals.get_glyphs_subset).parameters)
    except (TypeError, ValueError):
        return False
    return (
        params == ["fontfile", "glyphs"]
        and hasattr(internals, "SubsetResults")
        and hasattr(internals, "font_as_file")
    )


def _is_font_subset(value: Any, glyphs: list[int]) -> bool:
    """Whether ``value`` is a kept subset of ``glyphs``: base64 bytes, and a glyph map
    holding every one of them (a damaged entry was a traceback: it is cut again)."""
    if not (
        isinstance(value, dict)
        and isinstance(value.get("font"), str)
        and isinstance(value.get("glyph_index_map"), list)
        and all(
            isinstance(pair, list) and len(pair) == 2 and all(type(x) is int for x in pair)
            for pair in value["glyph_index_map"]
        )
    ):
        return False
    try:
        base64.b64decode(value["font"], validate=True)
    except ValueError:  # binascii.Error
        return False
    return set(glyphs) <= {pair[0] for pair in value["glyph_index_map"]}


class _SubsetBytes:
    """A remembered subset where matplotlib expects fontTools' font: it is only saved
    (``font_as_file``) and closed."""

    def __init__(self, data: bytes):
        self.data = data

    def save(self, file, reorderTables: bool = True) -> None:  # fontTools' signature
        file.write(self.data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


_SHA256: dict[tuple[str, int, int], str] = {}


def _file_sha256(path) -> str:
    """sha256 of a file (:func:`rankwise.hashing.file_sha256`), once per process and
    file size and mtime: a report asks for its font file's at every PDF it writes."""
    from ..hashing import file_sha256

    st = os.stat(path)
    key = (os.fspath(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA256:
        _SHA256[key] = file_sha256(path)
    return _SHA256[key]


def plan_figures(
    doc: dict[str, Any], folder: str | os.PathLike, formats: Sequence[str]
) -> list[tuple[dict[str, Any], Any]]:
    """Every chart of ``doc`` with its ``doc["figures"]`` entry, nothing drawn yet."""
    from . import view
    from .plots import dataset_plots

    if not formats or set(formats) - set(FORMATS):
        raise RankwiseError(
            f"formats must be some of {', '.join(FORMATS)}, got {', '.join(formats) or 'none'}"
        )
    stems: dict[str, str] = {}
    for dataset in doc["datasets"]:
        stem = figure_stem(dataset, "")
        if stem in stems:
            raise RankwiseError(
                f"datasets {stems[stem]!r} and {dataset!r} would write the same figure "
                f"files ({stem}*.svg) in {folder}: rename one of them"
            )
        stems[stem] = dataset
    plan = []
    for dataset, rows in view.by_dataset(doc):
        for plot in dataset_plots(doc, rows):
            entry: dict[str, Any] = {"dataset": dataset, "kind": plot.kind, "caption": plot.caption}
            for fmt in FORMATS:
                path = Path(folder) / f"{figure_stem(dataset, plot.kind)}.{fmt}"
                entry[fmt] = str(path) if fmt in formats else None
            plan.append((entry, plot))
    return plan


def draw_figures(plan: list[tuple[dict[str, Any], Any]], files=None, fonts=None) -> None:
    """Draw and write (atomically) the charts of a :func:`plan_figures` list; with
    ``files`` (a :class:`rankwise.store.StagedFiles`), staged there, written by its
    ``commit()``; a PDF's font subsets kept in ``fonts`` (:func:`_vector`)."""
    from ..store import StagedFiles
    from .plots import PAPER

    staged = files if files is not None else StagedFiles()
    for entry, plot in plan:
        fig = plot.draw(PAPER)
        for fmt in FORMATS:
            if entry[fmt]:
                staged.write(Path(entry[fmt]), _vector(fig, fmt, fonts))
    if files is None:
        staged.commit()


def planned_paths(plan: list[tuple[dict[str, Any], Any]]) -> list[str]:
    """The files :func:`draw_figures` writes for ``plan``."""
    return [entry[fmt] for entry, _ in plan for fmt in FORMATS if entry[fmt]]


def write_figures(
    doc: dict[str, Any], folder: str | os.PathLike, formats: Sequence[str] = FORMATS
) -> list[dict[str, Any]]:
    """Draw every chart of ``doc`` for a paper column and write it to ``folder`` in each
    of ``formats`` (``"svg"``, ``"pdf"``; each file atomically); return the list for
    ``doc["figures"]``: ``{"dataset", "kind", "caption", "svg", "pdf"}`` per chart (a
    format not written: ``None``)."""
    plan = plan_figures(doc, folder, formats)
    draw_figures(plan)
    return [entry for entry, _ in plan]


class DrawInBackground:
    """:func:`draw_figures` of ``plan`` shared between a forked child process and this
    one (drawing is pure Python under the GIL: a thread would not overlap).  The child
    starts at once and takes the figures one at a time from the front of the plan while
    the caller works on; :meth:`draw_rest` draws here, from the back, those the child has
    not taken; :meth:`wait` joins the child and raises, in this process, the exception
    that stopped it.  Each figure is drawn once, by whichever process takes it: the same
    bytes either way.  The files are staged in ``files`` (the child's under ``files``'
    names: :meth:`wait` ``expect()``s them, the caller commits)."""

    def __init__(self, plan: list[tuple[dict[str, Any], Any]], files, fonts=None):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self._plan, self._files, self._fonts = plan, files, fonts
        self._receive, send = ctx.Pipe(duplex=False)
        # [front, back): the figures no process has taken yet
        self._left = ctx.Array("q", [0, len(plan)])
        self._mine: list[int] = []  # drawn here
        self._listed = False  # the child's files are listed in ``files``

        def child() -> None:
            taken = []
            try:
                while (i := self._take(front=True)) is not None:
                    taken.append(i)
                    draw_figures([plan[i]], files, fonts)  # staged in ``files``' names
            except BaseException as exc:  # sent to the parent, re-raised there
                try:
                    send.send(exc)
                except Exception:  # an exception that does not pickle
                    send.send(RankwiseError(f"{type(exc).__name__}: {exc}"))
                os._exit(1)
            send.send(taken)
            os._exit(0)

        self._process = ctx.Process(target=child, daemon=True)
        self._process.start()
        send.close()

    def _take(self, *, front: bool) -> int | None:
        """The next figure no process has taken (from the front or the back), or None."""
        with self._left.get_lock():
            first, end = self._left[0], self._left[1]
            if first >= end:
                return None
            if front:
                self._left[0] = first + 1
                return first
            self._left[1] = end - 1
            return end - 1

    def draw_rest(self) -> None:
        """Draw here every figure the child has not taken (no more once it has failed:
        :meth:`wait` raises its error)."""
        while self._process.exitcode in (None, 0) and (i := self._take(front=False)) is not None:
            self._mine.append(i)
            draw_figures([self._plan[i]], self._files, self._fonts)

    def stop(self) -> None:
        """End the child now (the caller failed: its drawing is not wanted), and list in
        ``files`` whatever it may have staged, for the caller's ``discard()``."""
        self._process.terminate()
        self._process.join()
        if not self._listed:  # any figure not drawn here
            self._list([i for i in range(len(self._plan)) if i not in self._mine])

    def wait(self) -> None:
        """Join the child; its figures are then in ``files``."""
        self._process.join()
        code = self._process.exitcode
        message = self._receive.recv() if self._receive.poll() else None
        if code == 0 and isinstance(message, list):  # the figures it drew
            self._list(message)
            return
        if code == 1 and isinstance(message, BaseException):
            raise message
        raise RankwiseError(f"drawing the figures stopped (exit status {code})")

    def _list(self, figures: list[int]) -> None:
        """``expect()`` in ``files`` the files of the child's ``figures``."""
        for path in planned_paths([self._plan[i] for i in figures]):
            self._files.expect(path)
        self._listed = True


def figure_links(
    doc: dict[str, Any], dataset: str, kind: str, links_from: str | os.PathLike
) -> dict[str, str]:
    """Format -> link to the written file of one chart: its path relative to the folder
    ``links_from``, with ``/``, percent-encoded (a space ended a Markdown link, a ``#``
    began a fragment); empty when the report wrote no figures."""
    from urllib.parse import quote

    for entry in doc.get("figures", []):
        if entry["dataset"] == dataset and entry["kind"] == kind:
            return {
                fmt: quote(Path(os.path.relpath(entry[fmt], links_from)).as_posix())
                for fmt in FORMATS
                if entry[fmt]
            }
    return {}
