"""Offline demo data: small, seeded, real files in the layouts users bring.

Each generator takes its options (declared in :data:`OPTIONS`, checked and completed
by :func:`rankwise.datasets.prepare_dataset`) and a folder for its images, writes the
images there, and returns ``{"query": table, "gallery": table}``
whose ``path`` column is relative to that folder.  The same options always give the
same files and tables.  :func:`rankwise.datasets.prepare_dataset` calls them.

``digits``
    scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits, no download),
    upscaled ``scale`` times and saved as PNG; a seeded ``query_fraction`` of each
    digit's images are queries. Protocol ``recall``.
``demo-market``
    A Market-1501 tree (``query/``, ``bounding_box_test/``, names
    ``PPPP_cCsS_FFFFFF_BB.jpg``) of coloured person-like images: identity-dependent
    clothes colours, camera-dependent lighting, noise and jitter, plus distractors
    (``0000``) and junk (``-1``). Loaded with the ``market1501`` loader. Protocol ``reid``.
``demo-reassociation``
    Tracks: ``people`` persons in each of ``sequences`` sequences over ``frames``
    frames (each present in a frame with probability ``presence``). Query and gallery
    are the same detections. Protocol ``reassociation``.
``demo-progressive``
    ``targets`` digits form the gallery (label = the target); ``sketches`` of them are
    redrawn (noise and a small shift) and revealed progressively: step t of ``steps``
    shows the first t/steps of the drawing's ink pixels, in a seeded top-to-bottom
    drawing order. Protocol ``progressive``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from .errors import RankwiseError
from .extras import require
from .options import Option, OptionSet

_SEED = Option("seed", "integer", 0, minimum=0, help="seeds everything generated")
_SCALE = Option("scale", "integer", 4, minimum=1, help="each 8x8 digit is upscaled this many times")
# Person crops keep Market-1501's 2:1 aspect at their smallest (16 x 8): below 16 rows
# the head, torso and legs get one or two rows each and a junk fragment (a third of the
# height, blown up) is a smear.
_HEIGHT = Option("height", "integer", 64, minimum=16, help="image height in pixels")
_WIDTH = Option("width", "integer", 32, minimum=8, help="image width in pixels")

#: loader name -> its options (the config schema's ``loader_<name>`` fragments).
OPTIONS: dict[str, OptionSet] = {
    "digits": OptionSet(
        "digits",
        (
            _SEED,
            Option(
                "query_fraction",
                "number",
                0.2,
                above=0,
                below=1,
                help="fraction of each digit's images used as queries",
            ),
            _SCALE,
        ),
    ),
    "demo-market": OptionSet(
        "demo-market",
        (
            _SEED,
            Option(
                "identities",
                "integer",
                60,
                minimum=1,
                maximum=1501,
                help="persons (Market-1501 ids are 1..1501)",
            ),
            Option("cameras", "integer", 6, minimum=2, help="cameras (each person is seen by 2+)"),
            Option(
                "images_per_camera",
                "integer",
                3,
                minimum=1,
                help="gallery images per person and camera",
            ),
            Option(
                "queries_per_identity",
                "integer",
                2,
                minimum=1,
                help="query images per person (each from another camera)",
            ),
            Option("distractors", "integer", 60, minimum=0, help="gallery images of label 0"),
            Option("junk", "integer", 40, minimum=0, help="gallery images of label -1"),
            _HEIGHT,
            _WIDTH,
        ),
    ),
    "demo-reassociation": OptionSet(
        "demo-reassociation",
        (
            _SEED,
            Option("sequences", "integer", 3, minimum=1, help="tracked sequences"),
            Option(
                "frames",
                "integer",
                20,
                minimum=2,
                help="frames per sequence (a query needs a next frame)",
            ),
            Option(
                "people",
                "integer",
                6,
                minimum=2,
                help="persons per sequence (a query needs 2+ candidates)",
            ),
            Option(
                "presence",
                "number",
                0.9,
                above=0,
                maximum=1,
                help="probability that a person is in a frame",
            ),
            _HEIGHT,
            _WIDTH,
        ),
    ),
    "demo-progressive": OptionSet(
        "demo-progressive",
        (
            _SEED,
            Option(
                "targets",
                "integer",
                200,
                minimum=2,
                help="gallery digits (at most 1,797; 2+ so that ranking means something)",
            ),
            Option("sketches", "integer", 100, minimum=1, help="query drawings (at most targets)"),
            Option("steps", "integer", 5, minimum=1, help="partial renderings per drawing"),
            _SCALE,
            Option(
                "noise",
                "number",
                0.15,
                minimum=0,
                help="ink noise, as a fraction of full intensity",
            ),
        ),
    ),
}
#: loader name -> its option defaults.
DEFAULTS: dict[str, dict[str, Any]] = {name: spec.defaults for name, spec in OPTIONS.items()}


def _digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 scikit-learn digits as uint8 ``(n, 8, 8)`` images and their labels."""
    load_digits = require("sklearn.datasets", "the digits demos").load_digits
    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return images, digits.target.astype(int)


def _save_gray(image: np.ndarray, scale: int, path: Path) -> None:
    big = np.kron(image, np.ones((scale, scale), dtype=np.uint8)) if scale > 1 else image
    Image.fromarray(big).save(path, optimize=False)


# ---------------------------------------------------------------- digits


def digits(opts: dict[str, Any], images_dir: Path) -> dict[str, pd.DataFrame]:
    """Real handwritten digits split per class into query / gallery (protocol recall)."""
    from .datasets import seeded_split

    scale, fraction = opts["scale"], opts["query_fraction"]
    images, targets = _digit_images()
    folder = images_dir / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (image, target) in enumerate(zip(images, targets, strict=True)):
        name = f"{i:04d}.png"
        _save_gray(image, scale, folder / name)
        rows.append({"id": f"digit{i:04d}", "label": str(target), "path": f"digits/{name}"})
    table = pd.DataFrame(rows)
    is_query = seeded_split(table["label"].tolist(), fraction, int(opts["seed"]))
    return {"query": table[is_query].copy(), "gallery": table[~is_query].copy()}


# ---------------------------------------------------------------- person-like images


def _person(
    rng: np.random.Generator,
    height: int,
    width: int,
    upper: np.ndarray,
    lower: np.ndarray,
    skin: np.ndarray,
    background: np.ndarray,
    light: np.ndarray,
    noise: float = 10.0,
) -> np.ndarray:
    """A ``(height, width, 3)`` uint8 pedestrian: head, torso, legs on a background."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    dy = rng.uniform(-0.04, 0.04) * height
    dx = rng.uniform(-0.08, 0.08) * width
    yn, xn = (y - dy) / height, (x - dx) / width
    image = np.empty((height, width, 3), np.float32)
    # the scene varies from crop to crop around the camera's background
    image[:] = background + rng.normal(0.0, 12.0, 3) + rng.normal(0.0, 25.0)
    head = ((yn - 0.11) / 0.09) ** 2 + ((xn - 0.5) / 0.2) ** 2 <= 1.0
    torso = (yn >= 0.19) & (yn < 0.55) & (np.abs(xn - 0.5) <= 0.40)
    legs = (yn >= 0.55) & (yn < 0.98) & (np.abs(xn - 0.5) <= 0.30) & (np.abs(xn - 0.5) >= 0.03)
    image[torso] = upper
    image[legs] = lower
    image[head] = skin
    image = image * light + rng.normal(0.0, noise, image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


# Clothes come from a small palette (plus a per-identity shade), so that different
# people often look alike and the demos are not trivially solved.
_PALETTE = np.array(
    [
        [30, 30, 35],
        [200, 200, 205],
        [40, 60, 140],
        [150, 30, 40],
        [50, 110, 60],
        [110, 80, 50],
        [200, 170, 60],
        [90, 90, 95],
        [120, 150, 200],
        [180, 90, 140],
    ],
    dtype=np.float32,
)


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    base = _PALETTE[rng.integers(len(_PALETTE))]
    return np.clip(base + rng.normal(0.0, 18.0, 3), 0, 255).astype(np.float32)


def _camera_looks(rng: np.random.Generator, cameras: int) -> tuple[np.ndarray, np.ndarray]:
    """Per camera: a greyish background colour and an RGB lighting gain."""
    grey = rng.uniform(80, 170, size=(cameras, 1))
    backgrounds = (grey + rng.normal(0.0, 15.0, size=(cameras, 3))).astype(np.float32)
    lights = rng.uniform(0.9, 1.1, size=(cameras, 3)).astype(np.float32)
    return backgrounds, lights


def _write_jpeg(image: np.ndarray, path: Path) -> None:
    Image.fromarray(image).save(path, quality=92)


def demo_market(opts: dict[str, Any], images_dir: Path) -> dict[str, pd.DataFrame]:
    """A small Market-1501-format tree, loaded with the ``market1501`` parser."""
    from .datasets import market1501_table

    n_ids, n_cams = opts["identities"], opts["cameras"]
    per_cam, q_per_id = opts["images_per_camera"], opts["queries_per_identity"]
    n_distractors, n_junk = opts["distractors"], opts["junk"]
    height, width = opts["height"], opts["width"]
    rng = np.random.default_rng(int(opts["seed"]))
    root = images_dir / "Market-1501-demo"
    qdir, gdir = root / "query", root / "bounding_box_test"
    qdir.mkdir(parents=True)
    gdir.mkdir(parents=True)
    backgrounds, lights = _camera_looks(rng, n_cams)
    frame = [0]

    def name(pid: int, cam: int, box: int) -> str:
        frame[0] += int(rng.integers(5, 60))
        seq = 1 + frame[0] // 20000  # Market sequences restart the frame count
        pid_text = "-1" if pid < 0 else f"{pid:04d}"
        return f"{pid_text}_c{cam}s{seq}_{frame[0]:06d}_{box:02d}.jpg"

    pids = np.sort(rng.choice(np.arange(1, 1502), size=n_ids, replace=False))
    for pid in pids:
        upper, lower = _random_colour(rng), _random_colour(rng)
        skin = rng.uniform([150, 100, 80], [235, 190, 160]).astype(np.float32)
        seen = np.sort(rng.choice(n_cams, size=int(rng.integers(2, n_cams + 1)), replace=False))
        query_cams = rng.choice(seen, size=min(q_per_id, len(seen)), replace=False)
        for cam in seen:
            # this person under this camera (bound now; called inside this loop only)
            def draw(cam=cam, upper=upper, lower=lower, skin=skin) -> np.ndarray:
                return _person(
                    rng, height, width, upper, lower, skin, backgrounds[cam], lights[cam]
                )

            for box in range(1, per_cam + 1):
                _write_jpeg(draw(), gdir / name(int(pid), int(cam) + 1, box))
            if cam in query_cams:
                _write_jpeg(draw(), qdir / name(int(pid), int(cam) + 1, 0))
    for _ in range(n_distractors):  # background clutter, label 0
        cam = int(rng.integers(n_cams))
        clutter = _person(
            rng,
            height,
            width,
            _random_colour(rng),
            backgrounds[cam],
            backgrounds[cam],
            backgrounds[cam],
            lights[cam],
            noise=30.0,
        )
        _write_jpeg(clutter, gdir / name(0, cam + 1, 1))
    for _ in range(n_junk):  # bad detections: a fragment of someone, blown up; label -1
        cam = int(rng.integers(n_cams))
        whole = _person(
            rng,
            height,
            width,
            _random_colour(rng),
            _random_colour(rng),
            _random_colour(rng),
            backgrounds[cam],
            lights[cam],
        )
        top = int(rng.integers(0, height // 2))
        part = Image.fromarray(whole[top : top + height // 3]).resize((width, height))
        _write_jpeg(np.asarray(part), gdir / name(-1, cam + 1, 1))
    tables = {"query": market1501_table(qdir), "gallery": market1501_table(gdir)}
    for table in tables.values():
        table["path"] = [
            Path(p).relative_to(images_dir.absolute()).as_posix() for p in table["path"]
        ]
    return tables


# ---------------------------------------------------------------- reassociation


def demo_reassociation(opts: dict[str, Any], images_dir: Path) -> dict[str, pd.DataFrame]:
    """Tracks of people over frames; query and gallery are the same detections."""
    loader = "demo-reassociation"
    n_seq, n_frames, n_people = opts["sequences"], opts["frames"], opts["people"]
    presence, height, width = opts["presence"], opts["height"], opts["width"]
    rng = np.random.default_rng(int(opts["seed"]))
    folder = images_dir / "tracks"
    folder.mkdir(parents=True)
    backgrounds, lights = _camera_looks(rng, n_seq)
    rows = []
    for s in range(n_seq):
        sequence = f"seq{s + 1:02d}"
        people = [
            (
                s * n_people + k,
                _random_colour(rng),
                _random_colour(rng),
                rng.uniform([150, 100, 80], [235, 190, 160]).astype(np.float32),
            )
            for k in range(n_people)
        ]
        for f in range(1, n_frames + 1):
            # lighting drifts slowly along the sequence
            light = lights[s] * (1.0 + 0.05 * np.sin(f / 4.0 + np.arange(3)))
            for label, upper, lower, skin in people:
                if rng.random() >= presence:
                    continue
                file = f"{sequence}_f{f:04d}_p{label:03d}.jpg"
                _write_jpeg(
                    _person(rng, height, width, upper, lower, skin, backgrounds[s], light),
                    folder / file,
                )
                rows.append(
                    {
                        "id": Path(file).stem,
                        "label": str(label),
                        "camera": s + 1,
                        "sequence": sequence,
                        "frame": f,
                        "path": f"tracks/{file}",
                    }
                )
    if not rows:
        raise RankwiseError(
            f"{loader}: no detections were generated; raise presence, people or frames"
        )
    table = pd.DataFrame(rows)
    return {"query": table.copy(), "gallery": table.copy()}


# ---------------------------------------------------------------- progressive


def demo_progressive(opts: dict[str, Any], images_dir: Path) -> dict[str, pd.DataFrame]:
    """Digits revealed step by step (queries) against the complete digits (gallery)."""
    loader = "demo-progressive"
    n_targets, n_sketches = opts["targets"], opts["sketches"]
    steps, scale, noise = opts["steps"], opts["scale"], opts["noise"]
    images, _ = _digit_images()
    if n_targets > len(images):
        raise RankwiseError(
            f"{loader}: option targets must be at most {len(images)}, got {n_targets}"
        )
    if n_sketches > n_targets:
        raise RankwiseError(
            f"{loader}: option sketches ({n_sketches}) must be at most targets ({n_targets})"
        )
    rng = np.random.default_rng(int(opts["seed"]))
    chosen = np.sort(rng.choice(len(images), size=n_targets, replace=False))
    gdir, qdir = images_dir / "targets", images_dir / "sketches"
    gdir.mkdir(parents=True)
    qdir.mkdir(parents=True)
    gallery = []
    for t, index in enumerate(chosen):
        _save_gray(images[index], scale, gdir / f"t{t:04d}.png")
        gallery.append({"id": f"t{t:04d}", "label": f"t{t:04d}", "path": f"targets/t{t:04d}.png"})
    query = []
    for k, t in enumerate(np.sort(rng.choice(n_targets, size=n_sketches, replace=False))):
        target = images[chosen[t]].astype(np.float32)
        drawing = target + rng.normal(0.0, noise * 255.0, target.shape) * (target > 0)
        drawing = np.clip(np.rint(drawing), 0, 255).astype(np.uint8)
        shift = rng.integers(-scale // 2, scale // 2 + 1, size=2) if scale > 1 else (0, 0)
        ink = np.flatnonzero(drawing.ravel() > 0)
        # drawing order: top to bottom, with a little randomness between nearby rows
        order = ink[np.argsort(ink // 8 + rng.uniform(0, 2.0, len(ink)), kind="stable")]
        sketch = f"s{k:04d}"
        for step in range(1, steps + 1):
            shown = order[: int(np.ceil(len(order) * step / steps))]
            partial = np.zeros(64, np.uint8)
            partial[shown] = drawing.ravel()[shown]
            big = np.kron(partial.reshape(8, 8), np.ones((scale, scale), np.uint8))
            big = np.roll(big, tuple(int(v) for v in shift), axis=(0, 1))
            file = f"{sketch}_step{step}.png"
            Image.fromarray(big).save(qdir / file)
            query.append(
                {
                    "id": f"{sketch}_step{step}",
                    "label": f"t{t:04d}",
                    "sketch": sketch,
                    "step": step,
                    "path": f"sketches/{file}",
                }
            )
    return {"query": pd.DataFrame(query), "gallery": pd.DataFrame(gallery)}


GENERATORS: dict[str, Callable[[dict[str, Any], Path], dict[str, pd.DataFrame]]] = {
    "digits": digits,
    "demo-market": demo_market,
    "demo-reassociation": demo_reassociation,
    "demo-progressive": demo_progressive,
}
