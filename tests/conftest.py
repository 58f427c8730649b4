"""Fixtures for the metric tests: synthetic evaluation cases and the `rankwise` CLI.

Embeddings are chosen so that float32 and float64 agree on every comparison:
``int`` = small integers (-3..3; euclidean distances are exact), ``sign`` = entries
in {-1, +1} with D = 16 (normalised entries are powers of two; cosine is exact),
``float`` = continuous float32 data whose distinct distances are far apart, plus a
few exact duplicate rows. Every case has ties, unsorted and ungrouped rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import RANKWISE, float32_settings, tf32_like_a_training_script
from reference import distance_matrix, protocol_masks


@dataclass
class Case:
    """One evaluation input: manifests, embeddings and protocol options."""

    query: pd.DataFrame
    gallery: pd.DataFrame
    query_emb: np.ndarray
    gallery_emb: np.ndarray
    protocol: str
    distance: str
    options: dict = field(default_factory=dict)  # ks, gap_frames, ...

    def kwargs(self, **extra) -> dict:
        """Keyword arguments for rankwise.evaluate / reference.evaluate_reference."""
        return {"protocol": self.protocol, "distance": self.distance, **self.options, **extra}

    def args(self):
        return (self.query, self.gallery, self.query_emb, self.gallery_emb)

    def write(self, folder: Path) -> dict:
        """Write q.csv, g.csv, q.npy, g.npy; return the CLI input options."""
        folder.mkdir(parents=True, exist_ok=True)
        self.query.to_csv(folder / "q.csv", index=False)
        self.gallery.to_csv(folder / "g.csv", index=False)
        np.save(folder / "q.npy", self.query_emb)
        np.save(folder / "g.npy", self.gallery_emb)
        return {
            "--query": folder / "q.csv",
            "--gallery": folder / "g.csv",
            "--query-embeddings": folder / "q.npy",
            "--gallery-embeddings": folder / "g.npy",
        }

    def permuted(self, seed: int, *, queries=True, gallery=True):
        """The same case with rows shuffled; returns (case, query_perm, gallery_perm)."""
        rng = np.random.default_rng(seed)
        qp = rng.permutation(len(self.query)) if queries else np.arange(len(self.query))
        gp = rng.permutation(len(self.gallery)) if gallery else np.arange(len(self.gallery))
        return (
            Case(
                self.query.iloc[qp].reset_index(drop=True),
                self.gallery.iloc[gp].reset_index(drop=True),
                self.query_emb[qp],
                self.gallery_emb[gp],
                self.protocol,
                self.distance,
                dict(self.options),
            ),
            qp,
            gp,
        )


# ---------------------------------------------------------------------------
# embedding families
# ---------------------------------------------------------------------------

DIMS = {"int": 10, "sign": 16, "float": 12}


def _centre(rng, kind):
    d = DIMS[kind]
    if kind == "int":
        return rng.integers(-2, 3, d).astype(np.float32)
    if kind == "sign":
        return rng.choice(np.array([-1.0, 1.0], np.float32), d)
    return rng.normal(size=d).astype(np.float32)


def _noisy(rng, centre, kind, strength=1.0):
    if kind == "int":
        lim = max(1, int(round(strength)))
        noise = rng.integers(-lim, lim + 1, centre.shape)
        return np.clip(centre + noise, -3, 3).astype(np.float32)
    if kind == "sign":
        flip = rng.random(centre.shape) < 0.2 * strength
        return np.where(flip, -centre, centre).astype(np.float32)
    return (centre + 0.6 * strength * rng.normal(size=centre.shape)).astype(np.float32)


def _check_separated(case: Case) -> None:
    """For continuous data: a relevant item's distance is either exactly equal to
    another valid item's or differs from it by far more than float32 error."""
    d = distance_matrix(case.query_emb, case.gallery_emb, case.distance)
    valid, relevant = protocol_masks(
        case.protocol, case.query, case.gallery, gap_frames=case.options.get("gap_frames", 1)
    )
    for row, v, r in zip(d, valid, relevant, strict=True):
        for dj in row[r]:
            gaps = np.abs(row[v] - dj)
            gaps = gaps[gaps > 0]
            assert gaps.size == 0 or gaps.min() > 1e-5, "near-tie in float data; pick another seed"


def _frame(rows) -> pd.DataFrame:
    """ids and labels as strings; camera, frame and step as integers."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        df[col] = df[col].astype(np.int64 if col in ("camera", "frame", "step") else str)
    return df


def _finish(rng, q_rows, g_rows, q_emb, g_emb, protocol, distance, kind, options):
    q, g = _frame(q_rows), _frame(g_rows)
    qe, ge = np.asarray(q_emb, np.float32), np.asarray(g_emb, np.float32)
    qp, gp = rng.permutation(len(q)), rng.permutation(len(g))  # unsorted, ungrouped rows
    case = Case(
        q.iloc[qp].reset_index(drop=True),
        g.iloc[gp].reset_index(drop=True),
        qe[qp],
        ge[gp],
        protocol,
        distance,
        options,
    )
    if kind == "float":
        _check_separated(case)
    return case


# ---------------------------------------------------------------------------
# cases per protocol
# ---------------------------------------------------------------------------


def recall_case(distance="cosine", kind="sign", seed=0) -> Case:
    """Classes "1".."10" + special queries; some queries are gallery items (same id)."""
    rng = np.random.default_rng(seed)
    q_rows, g_rows, q_emb, g_emb = [], [], [], []
    centres = {str(c): _centre(rng, kind) for c in range(1, 13)}
    for c in range(1, 11):
        lab = str(c)
        for _ in range(rng.integers(2, 9)):
            g_rows.append({"id": f"g{len(g_rows)}", "label": lab})
            g_emb.append(_noisy(rng, centres[lab], kind))
        for _ in range(rng.integers(1, 4)):
            q_rows.append({"id": f"q{len(q_rows)}", "label": lab})
            q_emb.append(_noisy(rng, centres[lab], kind))
    # queries that are gallery items themselves (same id): never their own match
    for gi in rng.choice(len(g_rows), 6, replace=False):
        q_rows.append(dict(g_rows[gi]))
        q_emb.append(g_emb[gi].copy())
    # label "11": its only gallery item is the query itself -> skipped
    g_rows.append({"id": "self11", "label": "11"})
    g_emb.append(_noisy(rng, centres["11"], kind))
    q_rows.append({"id": "self11", "label": "11"})
    q_emb.append(g_emb[-1].copy())
    # label "12": absent from the gallery -> skipped
    q_rows.append({"id": "absent12", "label": "12"})
    q_emb.append(_noisy(rng, centres["12"], kind))
    # exact duplicates with another label: ties between relevant and non-relevant
    for gi in rng.choice(len(g_rows) - 1, 5, replace=False):
        g_rows.append({"id": f"dup{gi}", "label": str(int(g_rows[gi]["label"]) % 10 + 1)})
        g_emb.append(g_emb[gi].copy())
    # a query equal to a gallery item of another label (distance-0 non-relevant tie)
    q_rows.append({"id": "qdup", "label": "3"})
    q_emb.append(g_emb[0].copy())
    return _finish(
        rng, q_rows, g_rows, q_emb, g_emb, "recall", distance, kind, {"ks": (1, 2, 5, 10)}
    )


def reid_case(distance="euclidean", kind="int", seed=0) -> Case:
    """Market-like: persons "1".."14", cameras 1..4, distractors "0", junk "-1"."""
    rng = np.random.default_rng(seed)
    q_rows, g_rows, q_emb, g_emb = [], [], [], []
    centres = {str(p): _centre(rng, kind) for p in range(1, 15)}

    def add_g(label, cam, emb):
        g_rows.append({"id": f"g{len(g_rows)}", "label": label, "camera": int(cam)})
        g_emb.append(emb)

    def add_q(label, cam, emb):
        q_rows.append({"id": f"q{len(q_rows)}", "label": label, "camera": int(cam)})
        q_emb.append(emb)

    for p in range(1, 13):
        lab = str(p)
        for _ in range(rng.integers(1, 7)):
            add_g(lab, rng.integers(1, 5), _noisy(rng, centres[lab], kind))
        for _ in range(rng.integers(1, 3)):
            add_q(lab, rng.integers(1, 5), _noisy(rng, centres[lab], kind))
    # person 13 is only seen by camera 1, and queried from camera 1 -> skipped
    for _ in range(3):
        add_g("13", 1, _noisy(rng, centres["13"], kind))
    add_q("13", 1, _noisy(rng, centres["13"], kind))
    # person 14 is absent from the gallery -> skipped
    add_q("14", 2, _noisy(rng, centres["14"], kind))
    # distractors (label 0): stay in the gallery as non-matches, some very close
    for _ in range(12):
        add_g("0", rng.integers(1, 5), _noisy(rng, _centre(rng, kind), kind))
    for qi in rng.choice(len(q_rows), 4, replace=False):
        add_g("0", rng.integers(1, 5), q_emb[qi].copy())  # distance-0 distractor
    # junk (label -1): copies of query embeddings, would be rank 1 if not removed
    for qi in rng.choice(len(q_rows), 8, replace=False):
        add_g("-1", q_rows[qi]["camera"] if qi % 2 else rng.integers(1, 5), q_emb[qi].copy())
    for _ in range(4):
        add_g("-1", rng.integers(1, 5), _noisy(rng, _centre(rng, kind), kind))
    # exact duplicates across persons (relevant / non-relevant ties)
    person_rows = [i for i, r in enumerate(g_rows) if r["label"] not in ("0", "-1")]
    for gi in rng.choice(person_rows, 6, replace=False):
        other = str(int(g_rows[gi]["label"]) % 12 + 1)
        add_g(other, rng.integers(1, 5), g_emb[gi].copy())
    return _finish(rng, q_rows, g_rows, q_emb, g_emb, "reid", distance, kind, {"ks": (1, 3, 5, 10)})


def reassociation_case(distance="euclidean", kind="int", seed=0, gap_frames=1) -> Case:
    """Sequences A, B, C of 8 frames; labels "1".."5" reused in every sequence.

    Query and gallery are the same detections. Frames with one person, and people
    missing at frame + gap, give skipped queries.
    """
    rng = np.random.default_rng(seed)
    rows, emb = [], []
    for seq in "ABC":
        centres = {str(p): _centre(rng, kind) for p in range(1, 6)}
        for frame in range(1, 9):
            n = 1 if frame == 4 else rng.integers(1, 6)
            for p in sorted(rng.choice(5, n, replace=False) + 1):
                rows.append(
                    {"id": f"{seq}{frame}_{p}", "label": str(p), "sequence": seq, "frame": frame}
                )
                emb.append(_noisy(rng, centres[str(p)], kind, strength=1.5))
    # exact duplicate of another person's detection in the same frame (tie)
    for i in rng.choice(len(rows), 3, replace=False):
        r = dict(rows[i])
        taken = {
            x["label"] for x in rows if x["sequence"] == r["sequence"] and x["frame"] == r["frame"]
        }
        free = [str(p) for p in range(1, 6) if str(p) not in taken]
        if free:
            r["id"] = r["id"] + "_dup"
            r["label"] = free[0]
            rows.append(r)
            emb.append(emb[i].copy())
    return _finish(
        rng,
        rows,
        [dict(r) for r in rows],
        emb,
        [e.copy() for e in emb],
        "reassociation",
        distance,
        kind,
        {"ks": (1, 2, 3), "gap_frames": gap_frames},
    )


def progressive_case(distance="euclidean", kind="int", seed=0) -> Case:
    """30 gallery items (10 targets "t1".."t10"), sketches of 2..5 renderings each."""
    rng = np.random.default_rng(seed)
    g_rows, g_emb, q_rows, q_emb = [], [], [], []
    for t in range(1, 11):
        g_rows.append({"id": f"g{len(g_rows)}", "label": f"t{t}"})
        g_emb.append(_centre(rng, kind))
    for o in range(18):
        g_rows.append({"id": f"g{len(g_rows)}", "label": f"o{o % 12}"})
        g_emb.append(_centre(rng, kind))
    for t in (3, 7):  # non-targets identical to targets: ties at the last steps
        g_rows.append({"id": f"g{len(g_rows)}", "label": "o99"})
        g_emb.append(g_emb[t - 1].copy())
    for s, t in enumerate([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3]):
        T = int(rng.integers(2, 6))
        for step in range(1, T + 1):
            strength = 3.0 * (T - step) / T
            e = g_emb[t - 1].copy() if strength == 0 else _noisy(rng, g_emb[t - 1], kind, strength)
            q_rows.append(
                {"id": f"s{s}_{step}", "label": f"t{t}", "sketch": f"sk{s}", "step": step}
            )
            q_emb.append(e)
    return _finish(
        rng, q_rows, g_rows, q_emb, g_emb, "progressive", distance, kind, {"ks": (1, 3, 5)}
    )


MAKERS = {
    "recall": recall_case,
    "reid": reid_case,
    "reassociation": reassociation_case,
    "progressive": progressive_case,
}


@pytest.fixture
def make_case():
    """``make_case(protocol, distance, kind, seed, **opts) -> Case``."""

    def make(protocol, distance="euclidean", kind="int", seed=0, **opts):
        return MAKERS[protocol](distance=distance, kind=kind, seed=seed, **opts)

    return make


# ---------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------


@pytest.fixture
def cli():
    """``cli(subcommand, *args, options=dict) -> CompletedProcess`` (never raises)."""
    exe = RANKWISE

    def run(*args, options=None):
        argv = [exe, *map(str, args)]
        for key, value in (options or {}).items():
            argv += [key, str(value)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    return run


def read_json(path) -> dict:
    with open(path) as fh:
        return json.load(fh)


@pytest.fixture
def tf32_on():
    """The process as a training script leaves it (TF32 on, through torch's legacy API);
    yields its :func:`helpers.float32_settings`, put back after with the legacy setters
    (the code under test must have put back exactly what it changed)."""
    torch = pytest.importorskip("torch")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    tf32_like_a_training_script(torch)
    yield float32_settings(torch)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    torch.set_float32_matmul_precision(precision)
