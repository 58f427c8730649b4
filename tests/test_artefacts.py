"""rankwise's own files read back broken: one line, exit status 2, or recomputed.

Every command that reads what another rankwise command wrote -- a ranks store, an
embedding store, a statistics summary, a metrics or verification JSON -- is run on a
copy made by the real commands and then broken the way a hand edit, another tool or a
cut-short copy breaks it (a key missing, a value of another type, an unknown protocol,
an array of another dtype or length, an empty or truncated file).  Each must end as
one line naming the file and the key, with the command that writes the file again, and
exit status 2: never a traceback, never numbers computed from the wrong thing.

The report's cache (paired tests, worst queries) is rankwise's own and recomputable: a
broken entry is computed again, and the report is the one a fresh cache gives.

Cases run in forked children of one server process (see test_errors.py).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_errors import _fork_server, assert_one_line_error, run  # noqa: F401 (fixture)

REPORT = ["report", "m/toy/enc.json", "m/toy/enc2.json", "--resamples", "20"]
INPUTS = ["--query", "q.csv", "--gallery", "g.csv", "--query-embeddings", "q.zarr"]
RANK = ["rank", "--protocol", "reid", *INPUTS]


def _ok(*argv, cwd: Path) -> None:
    proc = run(*argv, cwd=cwd)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Every artefact, written by the real commands with relative paths (so a copy of
    the folder is a working set): embedding stores q.zarr / g.zarr, ranks stores
    r.zarr / r2.zarr, metrics JSON with statistics summaries m/toy/enc{,2}.json, a
    verification JSON v/toy/enc.json and a report cache."""
    root = tmp_path_factory.mktemp("artefacts")
    rng = np.random.default_rng(0)
    n_query, n_gallery = 6, 12
    pd.DataFrame(
        {"id": [f"q{i}" for i in range(n_query)], "label": [i // 2 for i in range(n_query)]}
    ).assign(camera=1).to_csv(root / "q.csv", index=False)
    pd.DataFrame(
        {"id": [f"g{i}" for i in range(n_gallery)], "label": [i % 3 for i in range(n_gallery)]}
    ).assign(camera=2).to_csv(root / "g.csv", index=False)
    np.save(root / "q.npy", rng.normal(size=(n_query, 8)).astype(np.float32))
    np.save(root / "g.npy", rng.normal(size=(n_gallery, 8)).astype(np.float32))
    for split in ("q", "g"):
        _ok(
            "encode", "--manifest", f"{split}.csv", "--kind", "precomputed",
            "--options", json.dumps({"path": f"{split}.npy"}), "--out", f"{split}.zarr",
            "--no-progress", cwd=root,
        )  # fmt: skip
    for name, gallery in (("enc", "g.zarr"), ("enc2", "g.npy")):
        store = "r.zarr" if name == "enc" else "r2.zarr"
        _ok(*RANK, "--gallery-embeddings", gallery, "--out", store, cwd=root)
        _ok(
            "metrics", store, "--output", f"m/toy/{name}.json",
            "--stats-output", f"m/toy/{name}.stats.npz", "--resamples", "20", cwd=root,
        )  # fmt: skip
    _ok(
        "verify", *INPUTS, "--gallery-embeddings", "g.zarr", "--output", "v/toy/enc.json",
        cwd=root,
    )  # fmt: skip
    _ok(*REPORT, "--cache", "cache", "--json", "report.json", cwd=root)
    return root


@pytest.fixture
def work(base, tmp_path) -> Path:
    """A copy of ``base`` to break."""
    shutil.copytree(base, tmp_path / "w")
    return tmp_path / "w"


def _attrs(store: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    """Edit a Zarr group's attributes in its zarr.json, as a hand edit does."""

    def apply(work: Path) -> None:
        meta_path = work / store / "zarr.json"
        meta = json.loads(meta_path.read_text())
        change(meta["attributes"])
        meta_path.write_text(json.dumps(meta))

    return apply


def _rehome(work: Path) -> None:
    """The copy as if ranked where it lies: the ranks stores and metrics files name it
    as their working directory (else the report finds the intact originals there, which
    are the ones ranked, and reads those)."""
    for store in ("r.zarr", "r2.zarr"):
        _attrs(store, lambda a: a.update(working_directory=str(work)))(work)
    for name in ("enc", "enc2"):
        _json(f"m/toy/{name}.json", lambda d: d["provenance"].update(working_directory=str(work)))(
            work
        )


def _array(store: str, name: str, change: Callable[[np.ndarray | None], np.ndarray]):
    """Replace (or add) array ``name`` of a Zarr group with ``change(old)``."""

    def apply(work: Path) -> None:
        import zarr

        group = zarr.open_group(str(work / store), mode="r+")
        old = np.asarray(group[name][...]) if name in group else None
        if old is not None:
            del group[name]
        group.create_array(name, data=np.asarray(change(old)))

    return apply


def _json(path: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(work: Path) -> None:
        data = json.loads((work / path).read_text())
        change(data)
        (work / path).write_text(json.dumps(data))

    return apply


def _text(path: str, text: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(work: Path) -> None:
        (work / path).write_text(text((work / path).read_text()))

    return apply


def _assert_refused(work: Path, argv: list[str], path: str, key: str, fix: str) -> None:
    proc = run(*argv, cwd=work)
    line = assert_one_line_error(proc, rf"^error: {re.escape(path)}: ")
    assert key in line, f"{line!r} does not name {key!r}"
    assert fix in line, f"{line!r} does not say {fix!r}"


# ---------------------------------------------------------------------------
# ranks stores (`rankwise rank`): every command that reads one
# ---------------------------------------------------------------------------

_CI = ["ci", "r.zarr", "--resamples", "20"]
# (id, break, command, key named)
RANKS_CASES = [
    ("no-protocol", _attrs("r.zarr", lambda a: a.pop("protocol")), ["metrics", "r.zarr"],
     "'protocol' is missing"),
    ("no-num_gallery", _attrs("r.zarr", lambda a: a.pop("num_gallery")), ["metrics", "r.zarr"],
     "'num_gallery' is missing"),
    ("num_gallery-string", _attrs("r.zarr", lambda a: a.update(num_gallery="twelve")),
     ["metrics", "r.zarr"], "'num_gallery' must be a non-negative integer"),
    ("unknown-protocol", _attrs("r.zarr", lambda a: a.update(protocol="market")),
     ["scores", "r.zarr"], "'protocol' must be one of recall, reid"),
    ("protocol_options-list", _attrs("r.zarr", lambda a: a.update(protocol_options=[1])),
     ["compare", "r2.zarr", "r.zarr", "--resamples", "20"], "'protocol_options' must be an object"),
    ("id_alignment-list",
     _attrs("r.zarr", lambda a: a["query_embeddings"].update(id_alignment=[1])),
     [*_CI, "--by", "identity"], "'query_embeddings.id_alignment' must be an object"),
    ("offsets-float", _array("r.zarr", "offsets", lambda a: a.astype(np.float64)),
     ["scores", "r.zarr"], "array 'offsets' holds float64"),
    ("ranks-2d", _array("r.zarr", "ranks", lambda a: a[:, None]), _CI, "array 'ranks' has shape"),
    ("unit_key-short", _array("r.zarr", "unit_key", lambda a: a[:-1]), _CI,
     "array 'unit_key' has 5 rows, not 6"),
    ("shot_pmf-alone", _array("r.zarr", "shot_pmf", lambda a: np.ones(3)), _CI,
     "'shot_pmf' is there without 'shot_offsets'"),
    ("query_index-negative", _array("r.zarr", "query_index", lambda a: a - 10), _CI,
     "a negative query row"),
    ("through-the-report", _attrs("r.zarr", lambda a: a.pop("distance")), REPORT,
     "'distance' is missing"),
    # a newer layout is refused, not misread (rankwise.schema.STORE_FORMAT)
    ("format-newer", _attrs("r.zarr", lambda a: a.update(rankwise_format=2)),
     ["metrics", "r.zarr"], "written by a newer rankwise (store format 2; this version reads "
     "format 1 and older), whose layout it could misread; upgrade rankwise"),
    ("format-string", _attrs("r.zarr", lambda a: a.update(rankwise_format="1")), REPORT,
     "'rankwise_format' must be a positive integer, found '1'"),
]  # fmt: skip


@pytest.mark.parametrize("name, change, argv, key", RANKS_CASES, ids=[c[0] for c in RANKS_CASES])
def test_broken_ranks_store(work, name, change, argv, key):
    change(work)
    _assert_refused(work, argv, "r.zarr", key, "run `rankwise rank` again")


def test_another_tools_zarr_group_attributes_are_not_a_rankwise_stores(work):
    """`rankwise rank` copies the attributes of the Zarr group it ranks into the ranks
    store; another tool's group may use the same names for its own values ('num_rows' as
    text).  The store, its metrics JSON and the report are read: they were refused, with
    the advice to rank again, which wrote the same attributes again."""
    import zarr

    group = zarr.open_group(str(work / "f.zarr"), mode="w")
    group.create_array("embeddings", data=np.load(work / "q.npy"))
    group.attrs.update(num_rows="6", preprocessing="resize 256x128")
    _ok(*RANK[:3], "--query", "q.csv", "--gallery", "g.csv", "--query-embeddings", "f.zarr",
        "--gallery-embeddings", "g.zarr", "--out", "f-ranks.zarr", cwd=work)  # fmt: skip
    _ok("metrics", "f-ranks.zarr", "--output", "m/toy/f.json", cwd=work)
    _ok("report", "m/toy/f.json", "--resamples", "20", cwd=work)


# ---------------------------------------------------------------------------
# embedding stores (`rankwise encode`): rank, verify, encode --kind precomputed, report
# ---------------------------------------------------------------------------

_RANK_G = [*RANK, "--gallery-embeddings", "g.zarr", "--out", "new.zarr"]
_SHA = "manifest_csv_sha256"
EMBEDDING_CASES = [
    ("sha256-integer", _attrs("g.zarr", lambda a: a.update({_SHA: 5})), _RANK_G,
     f"'{_SHA}' must be a string"),
    ("manifest-list", _attrs("g.zarr", lambda a: a.update({_SHA: "ab" * 32, "manifest": ["g"]})),
     ["verify", *INPUTS, "--gallery-embeddings", "g.zarr"], "'manifest' must be a path"),
    ("id_alignment-list", _attrs("g.zarr", lambda a: a.update(id_alignment=[1])),
     ["encode", "--manifest", "g.csv", "--kind", "precomputed", "--options",
      '{"path": "g.zarr"}', "--out", "new.zarr", "--no-progress"],
     "'id_alignment' must be an object"),
    ("manifest_row-float",
     lambda w: (_array("g.zarr", "manifest_row", lambda _: np.arange(12) + 0.5)(w),
                _attrs("g.zarr", lambda a: a.update(id_alignment={"manifest_rows": 12}))(w)),
     _RANK_G, "'manifest_row' array does not match"),
    ("complete-mark-string", _attrs("g.zarr", lambda a: a.update(complete="false")), _RANK_G,
     "incomplete embedding store"),
    ("array-metadata-empty", _text("g.zarr/embeddings/zarr.json", lambda _: ""), _RANK_G,
     "array 'embeddings' of the Zarr store cannot be read"),
    ("through-the-report",
     lambda w: (_rehome(w), _attrs("q.zarr", lambda a: a.update(num_rows="6"))(w)), REPORT,
     "'num_rows' must be a non-negative integer"),
    ("format-newer", _attrs("g.zarr", lambda a: a.update(rankwise_format=3)), _RANK_G,
     "written by a newer rankwise (store format 3;"),
]  # fmt: skip


def test_stores_of_before_the_format_number_are_format_1(work):
    """Stores written before ``rankwise_format`` existed have none: read as format 1."""
    for store in ("r.zarr", "g.zarr", "q.zarr"):
        _attrs(store, lambda a: a.pop("rankwise_format"))(work)
    _ok(*_RANK_G, cwd=work)
    _ok("metrics", "r.zarr", cwd=work)


@pytest.mark.parametrize(
    "name, change, argv, key", EMBEDDING_CASES, ids=[c[0] for c in EMBEDDING_CASES]
)
def test_broken_embedding_store(work, name, change, argv, key):
    change(work)
    store = "q.zarr" if name == "through-the-report" else "g.zarr"
    fix = "write the store again" if "metadata" in name else "encode again"
    _assert_refused(work, argv, store, key, fix)
    assert not (work / "new.zarr").exists()


# ---------------------------------------------------------------------------
# statistics summaries (`rankwise metrics --stats-output`), read by the report
# ---------------------------------------------------------------------------

_STATS = "m/toy/enc.stats.npz"


def _summary(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """Edit a summary's arrays and its meta (a dict here) and save it again."""

    def apply(work: Path) -> None:
        with np.load(work / _STATS) as data:
            content = {k: data[k] for k in data.files}
        content["meta"] = json.loads(str(content["meta"]))
        change(content)
        content["meta"] = np.array(json.dumps(content["meta"]))
        with open(work / _STATS, "wb") as file:
            np.savez(file, **content)

    return apply


def _cut(path: str, keep: int) -> Callable[[Path], None]:
    def apply(work: Path) -> None:
        (work / path).write_bytes((work / path).read_bytes()[:keep])

    return apply


SUMMARY_CASES = [
    ("empty-file", _cut(_STATS, 0), "not a statistics summary"),
    ("truncated", _cut(_STATS, 300), "not a statistics summary"),
    ("settings-list", _summary(lambda c: c["meta"].update(settings=[1])),
     "'settings' must be an object"),
    ("ci95-list", _summary(lambda c: c["meta"].update(ci95=[1])), "'ci95' must be an object"),
    ("ci95-interval-short", _summary(lambda c: c["meta"]["ci95"].update(map=[1.0])),
     "'ci95.map' must be a [low, high] pair"),
    ("cmc-short", _summary(lambda c: c["meta"].update(cmc=[1.0])), "'cmc' has 1 items"),
    ("meta-not-an-object", _summary(lambda c: c.update(meta="x")), "'meta' has no integer"),
]  # fmt: skip


@pytest.mark.parametrize("name, change, key", SUMMARY_CASES, ids=[c[0] for c in SUMMARY_CASES])
def test_broken_statistics_summary(work, name, change, key):
    change(work)
    _assert_refused(work, REPORT, _STATS, key, "run `rankwise metrics --stats-output` again")


# ---------------------------------------------------------------------------
# metrics JSON (`rankwise metrics`) and verification JSON (`rankwise verify`), read by
# the report (more metrics JSON cases: test_report.py::test_bad_metrics_file)
# ---------------------------------------------------------------------------

_METRICS = "m/toy/enc.json"


def _provenance(change: Callable[[dict], None]) -> Callable[[Path], None]:
    return _json(_METRICS, lambda d: change(d["provenance"]))


METRICS_CASES = [
    ("manifest_sha256-integer", _provenance(lambda p: p.update(query_manifest_sha256=5)),
     "'provenance.query_manifest_sha256' must be a string"),
    ("id_alignment-list",
     _provenance(lambda p: p["query_embeddings"].update(id_alignment=[1])),
     "'provenance.query_embeddings.id_alignment' must be an object"),
    ("unknown-ap", _provenance(lambda p: p.update(ap="weird")),
     "'provenance.ap' must be one of standard, trapezoid"),
    ("protocol_options-list", _provenance(lambda p: p.update(protocol_options=[1])),
     "'provenance.protocol_options' must be an object"),
    ("ks-string", _provenance(lambda p: p.update(ks="1,5")), "'provenance.ks' must be a list"),
]  # fmt: skip


@pytest.mark.parametrize("name, change, key", METRICS_CASES, ids=[c[0] for c in METRICS_CASES])
def test_broken_metrics_json(work, name, change, key):
    change(work)
    _assert_refused(work, REPORT, _METRICS, key, "pass the --output of `rankwise metrics`")


_VERIFY = "v/toy/enc.json"
VERIFICATION_CASES = [
    ("truncated", _text(_VERIFY, lambda t: t[:100]), "not a JSON file"),
    ("no-roc", _json(_VERIFY, lambda d: d.pop("roc")), "'roc' is missing"),
    ("tpr-string", _json(_VERIFY, lambda d: d["tpr@fpr"].update({"0.01": "x"})),
     "'tpr@fpr.0.01' must be a number"),
    ("histogram-short", _json(_VERIFY, lambda d: d["histogram"].update(positive=[1, 2])),
     "'histogram.positive' has 2 items"),
    ("pairs-string", _json(_VERIFY, lambda d: d.update(num_positive_pairs="24")),
     "'num_positive_pairs' must be a non-negative integer"),
    ("inputs-list", _json(_VERIFY, lambda d: d.update(inputs=[1])), "'inputs' must be an object"),
    ("no-distance", _json(_VERIFY, lambda d: d.pop("distance")), "'distance' is missing"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, change, key", VERIFICATION_CASES, ids=[c[0] for c in VERIFICATION_CASES]
)
def test_broken_verification_json(work, name, change, key):
    change(work)
    argv = [*REPORT, "--verification", _VERIFY, "--json", "out.json"]
    _assert_refused(work, argv, _VERIFY, key, "pass the --output of `rankwise verify`")
    assert not (work / "out.json").exists()


# ---------------------------------------------------------------------------
# the report's cache (paired tests, worst queries): rankwise's own, recomputed
# ---------------------------------------------------------------------------


def _entry(kind: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    """Edit the cache's paired-test entry (``kind`` "pair") or worst-queries entry."""

    def apply(work: Path) -> None:
        for path in sorted((work / "cache").glob("*.json")):
            entry = json.loads(path.read_text())
            if ("value" in entry) == (kind == "worst"):
                change(entry)
                path.write_text(json.dumps(entry))
                return
        raise AssertionError(f"no {kind} entry in the cache")

    return apply


CACHE_CASES = [
    ("pvalues-short", _entry("pair", lambda e: e.update(pvalues=[1.0]))),
    ("unknown-test", _entry("pair", lambda e: e.update(test="t"))),
    # extended from 10 flips: the short hits broadcast into wrong p-values
    ("sign-flip-hits-short",
     _entry("pair", lambda e: e.update(test="sign-flip", flips=10, hits=[0]))),
    ("worst-queries-list", _entry("worst", lambda e: e.update(value=[1]))),
    ("worst-query-without-top", _entry("worst", lambda e: e["value"]["queries"][0].pop("top"))),
]  # fmt: skip


@pytest.mark.parametrize("name, change", CACHE_CASES, ids=[c[0] for c in CACHE_CASES])
def test_broken_cache_entry_is_recomputed(work, name, change):
    change(work)
    proc = run(*REPORT, "--cache", "cache", "--json", "out.json", cwd=work)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (work / "out.json").read_text() == (work / "report.json").read_text()
    again = run(*REPORT, "--cache", "cache", "--json", "out.json", cwd=work)
    assert "paired tests: 0 computed, 0 extended, 1 reused" in again.stdout  # rewritten
