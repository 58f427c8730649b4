"""The pipeline is never silently stale (issue #13): real Snakemake runs in temporary folders.

- data drive reruns: a new image in a Market-1501 tree, an edited manifest CSV, an image
  rewritten under the same name rerun exactly that dataset's jobs; untouched data nothing;
- a path the config names that does not exist stops the run before any job, in one line;
- a failed job's one-line error reaches the terminal; config errors are one line with the
  key path and a did-you-mean; YAML syntax errors name file and line; duplicated keys fail;
- the default profile keeps the output compact; logs hold no stale progress bars.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import helpers
import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import planned_jobs
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "Snakefile"

CONFIG = {
    "datasets": {
        # a Market-1501 tree of our own, and the user's own CSVs with their images
        "mk": {
            "loader": "market1501",
            "options": {"root": "data/market"},
            "protocol": "reid",
            "ks": [1],
        },
        "own": {
            "loader": "manifest",
            "options": {"query": "data/own/query.csv", "gallery": "data/own/gallery.csv"},
            "ks": [1],
        },
        "demo": {
            "loader": "demo-progressive",
            "options": {"seed": 0, "targets": 6, "sketches": 3, "steps": 2, "scale": 1},
            "protocol": "progressive",
            "ks": [1],
        },
    },
    "encoders": {"pixels": {"kind": "pixels", "options": {"size": [8, 4]}}},
    "engine": {"threads": 1},
    "report": {"resamples": 0, "worst_queries": 0},
}
# new data in one split of a dataset whose splits are apart (a folder, a CSV each)
ONE_SPLIT = {"prepare_split": 1, "encode": 1, "rank": 1, "metrics": 1, "report": 1, "all": 1}


def write_image(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(value).integers(0, 256, size=(16, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def write_data(root: Path) -> None:
    """A 4-person Market-1501 tree, and a 3-label manifest dataset with its images."""
    for pid in range(1, 5):
        write_image(root / f"data/market/query/{pid:04d}_c1s1_{pid:06d}_00.png", pid)
        for cam in (2, 3):
            write_image(
                root / f"data/market/bounding_box_test/{pid:04d}_c{cam}s1_{pid:06d}_00.png",
                10 * pid + cam,
            )
    own = root / "data/own"
    for i in range(6):
        write_image(own / f"img/{i}.png", 100 + i)
    # the query CSV as Excel's "CSV UTF-8" writes it: a byte-order mark, then `path` first
    (own / "query.csv").write_text(
        "\ufeffpath,id,label\nimg/0.png,q0,a\nimg/1.png,q1,b\n", encoding="utf-8"
    )
    (own / "gallery.csv").write_text(
        "id,label,path\ng2,a,img/2.png\ng3,b,img/3.png\ng4,c,img/4.png\ng5,c,img/5.png\n"
    )


def snakemake(workdir: Path, config: dict | None, *args: str, profile: bool = False):
    """Run Snakemake in `workdir` on `config` (None: the workdir's config/config.yaml)."""
    return helpers.snakemake(workdir, config, *args, profile=profile)


def run_ok(workdir: Path, config: dict | None, *args: str) -> str:
    proc = snakemake(workdir, config, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def planned(workdir: Path, config: dict = CONFIG) -> dict[str, int]:
    return planned_jobs(run_ok(workdir, config, "--dry-run"))


def error_lines(proc) -> list[str]:
    """The non-empty output lines of a failed run."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("trust")
    write_data(path)
    proc = snakemake(path, CONFIG, profile=True)  # as a user runs it: the default profile
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path / "first-run.txt").write_text(proc.stdout + proc.stderr)
    return path


# ---------------------------------------------------------------- data drive reruns


def test_untouched_data_reruns_nothing(workdir):
    assert (workdir / "results/report.json").is_file()
    assert planned(workdir) == {}


# the jobs of CONFIG's 3 datasets x 1 encoder from a stage down
FROM_REPORT = {"report": 1, "all": 1}
FROM_RANK = {"rank": 3, "metrics": 3, **FROM_REPORT}
# prepare: the demo (both splits, one job); prepare_split: mk's and own's, a job per split
FROM_PREPARE = {"prepare": 1, "prepare_split": 4, "encode": 6, **FROM_RANK}


@pytest.mark.parametrize(
    "stage, expected",
    [
        (None, {}),
        ("prepare", FROM_PREPARE),
        ("encode", {k: v for k, v in FROM_PREPARE.items() if not k.startswith("prepare")}),
        ("rank", FROM_RANK),
        ("metrics", {"metrics": 3, **FROM_REPORT}),
        ("report", FROM_REPORT),
    ],
)
def test_a_stage_output_version_reruns_that_stage_and_downstream(
    workdir, tmp_path, stage, expected
):
    """A release whose fix changes a stage's output bumps its number in OUTPUT_VERSIONS
    (rules/common.smk): the jobs written before rerun, with what depends on them.  At 0
    (this release) nothing reruns: upgrading to it costs nothing."""
    import shutil

    copy = tmp_path / "workflow"
    for name in ("rules", "config", "envs", "profiles"):
        shutil.copytree(ROOT / name, copy / name)
    shutil.copy(SNAKEFILE, copy / "Snakefile")
    common = copy / "rules" / "common.smk"
    text = common.read_text()
    assert '"rank": 0' in text
    if stage is not None:
        common.write_text(text.replace(f'"{stage}": 0', f'"{stage}": 1'))
    proc = helpers.snakemake(workdir, CONFIG, "--dry-run", snakefile=copy / "Snakefile")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert planned_jobs(proc.stdout + proc.stderr) == expected
    if stage is not None:
        assert "Params have changed" in proc.stdout + proc.stderr


def test_a_value_another_param_already_has_reruns(workdir):
    """Snakemake compares the set of a job's param values, not their names: `worst_queries:
    0` -> `10` beside `seed: 0` and `top_k: 10` left the set {0, 10, ...} as it was, and
    the report without its worst queries stayed, "Nothing to be done"."""
    config = copy.deepcopy(CONFIG)
    config["report"]["worst_queries"] = 10
    assert planned(workdir, config) == FROM_REPORT


def test_a_protocol_option_set_to_another_options_value_reruns_rank(tmp_path):
    """`gap_frames: 1` -> `10` beside `query_stride: 1` and the `shot_repeats: 10` every
    rank job carries: stale ranks, exit 0, before the params went by name."""
    config = {
        "datasets": {
            "re": {
                "loader": "demo-reassociation",
                "options": {"seed": 0, "sequences": 1},
                "protocol": "reassociation",
                "gap_frames": 1,
                "query_stride": 1,
                "ks": [1],
            }
        },
        "encoders": {"pixels": {"kind": "pixels", "options": {"size": [4, 4]}}},
        "engine": {"threads": 1},
        "report": {"resamples": 0, "worst_queries": 0},
    }
    proc = helpers.snakemake(tmp_path, config, replace=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config["datasets"]["re"]["gap_frames"] = 10
    proc = helpers.snakemake(tmp_path, config, "--dry-run", replace=True)
    assert planned_jobs(proc.stdout + proc.stderr) == {"rank": 1, "metrics": 1, **FROM_REPORT}


@pytest.mark.parametrize("folder", ["query", "bounding_box_test"])
def test_a_new_image_in_a_market_tree_reruns_that_split_only(workdir, folder):
    image = workdir / f"data/market/{folder}/0002_c1s1_000099_00.png"
    write_image(image, 7)
    try:
        assert planned(workdir) == ONE_SPLIT
    finally:
        image.unlink()
    # the tree as it was recorded: nothing again
    assert planned(workdir) == {}


def test_an_edited_manifest_csv_reruns_that_split_only(workdir):
    gallery = workdir / "data/own/gallery.csv"
    original = gallery.read_text()
    gallery.write_text(original.replace("g5,c,", "g5,b,"))
    try:
        assert planned(workdir) == ONE_SPLIT
    finally:
        gallery.write_text(original)  # same bytes, new mtime: the content decides
    assert planned(workdir) == {}


def test_new_data_and_a_new_encoder_option_in_one_run_re_encode_both_splits(tmp_path):
    """A guard for any attempt to reuse the unchanged split's store (ancient() manifests):
    Snakemake 9 skips the own triggers of a job downstream of one that reruns when its
    links to it are ancient() (snakemake/snakemake#4166), so a new query image and an
    encoder option changed in the same run re-encoded the query alone: the report mixed
    two encoder settings, exit 0 (b6fc6bc, reverted)."""
    config = {**CONFIG, "datasets": {"mk": CONFIG["datasets"]["mk"]}}
    write_data(tmp_path)
    run_ok(tmp_path, config)
    changed = copy.deepcopy(config)
    changed["encoders"]["pixels"]["options"]["size"] = [4, 8]  # the same dimension
    write_image(tmp_path / "data/market/query/0005_c1s1_000005_00.png", 5)
    assert planned(tmp_path, changed) == {**ONE_SPLIT, "encode": 2}
    run_ok(tmp_path, changed)
    for split in ("query", "gallery"):
        meta = tmp_path / f"results/embeddings/mk/pixels/{split}.zarr/zarr.json"
        encoder = json.loads(meta.read_text())["attributes"]["encoder"]
        assert encoder["options"]["size"] == [4, 8], split


def _store_files(store: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(f.relative_to(store)): (f.read_bytes(), f.stat().st_mtime_ns)
        for f in sorted(store.rglob("*"))
        if f.is_file()
    }


@pytest.mark.parametrize("split, folder", [("query", "query"), ("gallery", "bounding_box_test")])
def test_new_data_in_one_split_leaves_the_other_splits_store_and_gives_fresh_numbers(
    tmp_path, split, folder
):
    """Only the split whose data changed is prepared and encoded again: the other
    split's manifest and store keep their bytes and mtimes (at Market scale a new query
    image re-encoded ~19.7k gallery images per checkpoint), and the numbers equal a
    run from scratch on the new data (--forceall), the ranks store byte for byte."""
    config = {**CONFIG, "datasets": {"mk": CONFIG["datasets"]["mk"]}}
    write_data(tmp_path)
    run_ok(tmp_path, config)
    other = "gallery" if split == "query" else "query"
    kept = {
        "store": tmp_path / f"results/embeddings/mk/pixels/{other}.zarr",
        "manifest": tmp_path / f"results/manifests/mk/{other}.csv",
    }

    def snapshot() -> dict:
        return {
            name: _store_files(path) if path.is_dir() else path.stat().st_mtime_ns
            for name, path in kept.items()
        }

    before = snapshot()
    # a fifth person: a query with a gallery match, or a gallery distractor with none
    write_image(tmp_path / f"data/market/{folder}/0005_c4s1_000005_00.png", 55)
    assert planned_jobs(run_ok(tmp_path, config)) == ONE_SPLIT
    assert planned(tmp_path, config) == {}
    assert snapshot() == before
    rows = (tmp_path / f"results/manifests/mk/{split}.csv").read_text().splitlines()
    assert any(line.startswith("0005_c4s1_000005_00,") for line in rows)
    metrics = tmp_path / "results/metrics/mk/pixels.json"
    ranks = tmp_path / "results/ranks/mk/pixels.zarr"
    incremental = (json.loads(metrics.read_text())["metrics"], _store_files(ranks))
    run_ok(tmp_path, config, "--forceall")
    scratch = (json.loads(metrics.read_text())["metrics"], _store_files(ranks))
    assert incremental[0] == scratch[0]
    assert {k: v[0] for k, v in incremental[1].items()} == {k: v[0] for k, v in scratch[1].items()}


def test_options_a_protocol_ignores_rerun_nothing(workdir):
    """gap_frames on a reid dataset, a single-shot seed with single-shot off, junk labels
    under recall: accepted (a config may set them for every dataset) and no job reruns;
    the same key where the protocol takes it does rerun."""
    config = copy.deepcopy(CONFIG)
    config["datasets"]["mk"].update(gap_frames=5, query_stride=2, shot_seed=9)
    config["datasets"]["own"].update(junk_labels=["a"], exclude_same_camera=False)
    assert planned(workdir, config) == {}
    config["datasets"]["mk"]["exclude_same_camera"] = False
    assert planned(workdir, config) == {"rank": 1, "metrics": 1, "report": 1, "all": 1}


def test_a_new_config_file_mtime_with_the_same_data_reruns_nothing(workdir):
    csv = workdir / "data/own/query.csv"
    csv.write_text(csv.read_text())
    assert planned(workdir) == {}


@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_the_fingerprint_follows_the_images_of_a_csv_with_a_byte_order_mark(tmp_path, bom):
    """No Snakemake needed: the fingerprint is what reruns encode. With a BOM, the first
    header cell must still read `path` (it read "\\ufeffpath": images never counted)."""
    from rankwise.pipeline_config import dataset_fingerprints

    write_image(tmp_path / "img/0.png", 0)
    (tmp_path / "q.csv").write_text(f"{bom}path,id,label\nimg/0.png,q0,a\n", encoding="utf-8")
    options = {"query": str(tmp_path / "q.csv"), "gallery": str(tmp_path / "q.csv")}
    before = dataset_fingerprints("manifest", options)["query"]
    Image.new("RGB", (3, 5)).save(tmp_path / "img/0.png")  # another size, same name
    assert dataset_fingerprints("manifest", options)["query"] != before


def test_a_link_pointed_at_a_copy_changes_the_fingerprint(tmp_path):
    """The manifests hold real paths: a dataset root that is a link, pointed at a copy
    with the same names, sizes and mtimes (cp -a), gives other manifests."""
    import shutil

    from rankwise.pipeline_config import dataset_fingerprints

    write_data(tmp_path)
    shutil.copytree(tmp_path / "data/market", tmp_path / "copy")  # copy2: mtimes kept
    (tmp_path / "link").symlink_to(tmp_path / "data/market")
    before = dataset_fingerprints("market1501", {"root": str(tmp_path / "link")})
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "copy")
    after = dataset_fingerprints("market1501", {"root": str(tmp_path / "link")})
    assert all(after[split] != before[split] for split in ("query", "gallery"))


@pytest.mark.parametrize("loader", ["folder", "dukemtmc", "identity-folders", "veri776"])
def test_a_link_pointed_at_a_copy_changes_a_joint_datasets_fingerprint(tmp_path, loader):
    """Where one listing makes both splits, the manifests hold real paths too: a root
    (or a sub-folder) that is a link, pointed at a copy with the same names, sizes and
    mtimes, must change both splits' digests (it changed none: the old paths were kept)."""
    import shutil

    from rankwise.pipeline_config import dataset_fingerprints

    data = tmp_path / "v1"
    names = {
        "folder": ["a/0.png", "a/1.png", "b/0.png", "b/1.png"],
        "dukemtmc": ["query/0005_c2_f0046985.png", "bounding_box_test/0005_c5_f0051781.png"],
        "identity-folders": ["0001/0.png", "0001/1.png", "0002/0.png", "0002/1.png"],
        "veri776": ["image_query/0002_c002_00030600_0.jpg", "image_test/0002_c003_0003_1.jpg"],
    }[loader]
    for i, name in enumerate(names):
        write_image(data / name, i)
    shutil.copytree(data, tmp_path / "v2")  # copy2: names, sizes and mtimes kept
    (tmp_path / "root").symlink_to("v1")
    options = {"root": str(tmp_path / "root")}
    before = dataset_fingerprints(loader, options)
    _repoint(tmp_path / "root", "v2")
    after = dataset_fingerprints(loader, options)
    assert after["query"] != before["query"] and after["gallery"] != before["gallery"]
    # a linked sub-folder (walk_files follows it) re-pointed the same way
    first = names[0].split("/")[0]
    shutil.move(tmp_path / "v2" / first, tmp_path / "sub-v1")
    shutil.copytree(tmp_path / "sub-v1", tmp_path / "sub-v2")
    (tmp_path / "v2" / first).symlink_to(tmp_path / "sub-v1")
    before = dataset_fingerprints(loader, options)
    _repoint(tmp_path / "v2" / first, str(tmp_path / "sub-v2"))
    assert dataset_fingerprints(loader, options)["query"] != before["query"]


def test_a_folder_root_link_pointed_at_a_copy_reruns_prepare(tmp_path):
    """The pipeline: a `folder` dataset (seeded split of one tree) whose root is a link,
    pointed at a copy and the old tree deleted, prepares again (the old manifests name
    deleted images: a new encoder's job failed on them) and gives --forceall's numbers."""
    import shutil

    for label in "abc":
        for i in range(3):
            write_image(tmp_path / f"data/v1/{label}/{i}.png", 10 * i + ord(label))
    shutil.copytree(tmp_path / "data/v1", tmp_path / "data/v2")
    (tmp_path / "data/tree").symlink_to("v1")
    config = {
        **CONFIG,
        "datasets": {"d": {"loader": "folder", "options": {"root": "data/tree"}, "ks": [1]}},
    }
    run_ok(tmp_path, config)
    _repoint(tmp_path / "data/tree", "v2")
    shutil.rmtree(tmp_path / "data/v1")
    expected = {"prepare": 1, "encode": 2, "rank": 1, "metrics": 1, "report": 1, "all": 1}
    assert planned(tmp_path, config) == expected
    run_ok(tmp_path, config)
    manifest = (tmp_path / "results/manifests/d/query.csv").read_text()
    assert "v2/" in manifest and "v1/" not in manifest
    metrics = tmp_path / "results/metrics/d/pixels.json"
    incremental = json.loads(metrics.read_text())["metrics"]
    run_ok(tmp_path, config, "--forceall")
    assert incremental == json.loads(metrics.read_text())["metrics"]


def _with_tree(config: dict, root: str) -> dict:
    """``config`` and a `folder` dataset (a seeded split of one tree) at ``root``."""
    tree = {"loader": "folder", "options": {"root": root}, "ks": [1]}
    return {**config, "datasets": {**config["datasets"], "tree": tree}}


def _write_tree(root: Path) -> None:
    for label in "abc":
        for i in range(2):
            write_image(root / f"{label}/{i}.png", 10 * i + ord(label))


def test_a_project_moved_with_its_data_reruns_nothing(tmp_path):
    """The fingerprints hold each file's path as the manifests do (relative to their
    folder): a project moved, to another depth too, with its data inside has the same
    manifests, so nothing reruns (a review found every split and joint dataset prepared
    and encoded again: the fingerprints held absolute real paths)."""
    project = tmp_path / "a"
    write_data(project)
    _write_tree(project / "data/tree")
    config = _with_tree(CONFIG, "data/tree")
    run_ok(project, config)
    (tmp_path / "b").mkdir()
    moved = project.rename(tmp_path / "b/a")
    assert planned(moved, config) == {}


def test_a_project_moved_away_from_its_data_prepares_again(tmp_path):
    """Data outside the project (absolute roots): a copy at another depth has other
    relative paths to it, so its manifests change; its prepare jobs must rerun (they
    did not: the old manifests' paths named files that are not there, or others)."""
    import shutil

    write_data(tmp_path / "ext")
    _write_tree(tmp_path / "ext/data/tree")
    datasets = {
        "mk": {**CONFIG["datasets"]["mk"], "options": {"root": str(tmp_path / "ext/data/market")}}
    }
    config = _with_tree({**CONFIG, "datasets": datasets}, str(tmp_path / "ext/data/tree"))
    (tmp_path / "p").mkdir()
    run_ok(tmp_path / "p", config)
    copy = tmp_path / "deep/x/p"
    shutil.copytree(tmp_path / "p", copy, symlinks=True)
    expected = {"prepare": 1, "prepare_split": 2, "encode": 4, "rank": 2, "metrics": 2}
    assert planned(copy, config) == {**expected, "report": 1, "all": 1}
    run_ok(copy, config)
    for dataset in ("mk", "tree"):
        manifest = copy / f"results/manifests/{dataset}/query.csv"
        paths = pd.read_csv(manifest, dtype=str)["path"]
        assert all((manifest.parent / path).is_file() for path in paths)


def test_editing_a_module_factory_in_the_project_reruns_its_encodes(tmp_path):
    """A ``python`` encoder named ``module:function`` (found in the project folder):
    editing the module reruns its encode jobs and what follows, as editing a
    ``file.py:function`` factory does. It reran nothing: the report kept the numbers of
    the code before the edit, where a fresh run gave others."""
    write_data(tmp_path)
    factory = tmp_path / "nets/f.py"
    factory.parent.mkdir()
    code = (
        "import numpy as np\n"
        "def build():\n"
        "    return lambda images: np.stack([np.asarray(i, np.float32).reshape(-1)[:8]"
        " * SCALE for i in images])\n"
    )
    factory.write_text(code.replace("SCALE", "1.0"))
    config = {
        "datasets": {"own": CONFIG["datasets"]["own"]},
        "encoders": {"mod": {"kind": "python", "options": {"factory": "nets.f:build"}}},
        "engine": {"threads": 1},
        "report": {"resamples": 0, "worst_queries": 0},
    }
    run_ok(tmp_path, config)
    assert planned(tmp_path, config) == {}
    factory.write_text(code.replace("SCALE", "np.arange(8)"))
    assert planned(tmp_path, config) == {
        "encode": 2,
        "rank": 1,
        "metrics": 1,
        "report": 1,
        "all": 1,
    }


def test_a_project_moved_from_images_its_csv_names_by_absolute_paths_reruns_nothing(
    tmp_path,
):
    """A manifest CSV naming its images by absolute paths: prepare keeps them as
    written, so a copy of the project at another depth has the same manifests and
    reruns nothing (its fingerprint held the images' paths relative to the manifests'
    folder, and every split was prepared and encoded again)."""
    import shutil

    write_data(tmp_path / "ext")
    own = tmp_path / "p/data/own"
    own.mkdir(parents=True)
    for split in ("query", "gallery"):
        text = (tmp_path / f"ext/data/own/{split}.csv").read_text(encoding="utf-8-sig")
        (own / f"{split}.csv").write_text(text.replace("img/", f"{tmp_path}/ext/data/own/img/"))
    config = {**CONFIG, "datasets": {"own": CONFIG["datasets"]["own"]}}
    run_ok(tmp_path / "p", config)
    copy = tmp_path / "deep/x/p"
    shutil.copytree(tmp_path / "p", copy, symlinks=True)
    assert planned(copy, config) == {}


def _repoint(link: Path, target: str) -> None:
    link.unlink()
    link.symlink_to(target)


@pytest.mark.parametrize("case", ["label folder", "image file", "manifest's image folder"])
def test_a_link_below_a_splits_folder_pointed_at_a_copy_changes_its_fingerprint(tmp_path, case):
    """Manifests hold each image's real path: a link anywhere on the way (a label folder,
    an image, a CSV's image folder) pointed at a copy with the same names, sizes and
    mtimes gave other manifests under the same fingerprint (found by review: the old
    copy deleted, the next encoder's job failed on files that were all in place)."""
    import shutil

    from rankwise.pipeline_config import dataset_fingerprints

    write_data(tmp_path)
    if case == "label folder":  # folder with query_dir/gallery_dir, label folders linked
        for label in "ab":
            write_image(tmp_path / f"v1/{label}/0.png", ord(label))
            write_image(tmp_path / f"gal/{label}/0.png", ord(label) + 1)
        shutil.copytree(tmp_path / "v1", tmp_path / "v2")
        for label in "ab":
            (tmp_path / "q").mkdir(exist_ok=True)
            (tmp_path / f"q/{label}").symlink_to(tmp_path / f"v1/{label}")
        loader, options = (
            "folder",
            {"query_dir": str(tmp_path / "q"), "gallery_dir": str(tmp_path / "gal")},
        )
        links = {tmp_path / f"q/{label}": str(tmp_path / f"v2/{label}") for label in "ab"}
    elif case == "image file":  # a Market-1501 query image that is a link
        image = tmp_path / "data/market/query/0001_c1s1_000001_00.png"
        shutil.copy2(image, tmp_path / "store-v1.png")
        shutil.copy2(image, tmp_path / "store-v2.png")
        image.unlink()
        image.symlink_to(tmp_path / "store-v1.png")
        loader, options = "market1501", {"root": str(tmp_path / "data/market")}
        links = {image: str(tmp_path / "store-v2.png")}
    else:  # a manifest CSV whose img/ folder is a link
        own = tmp_path / "data/own"
        own.joinpath("img").rename(own / "img-v1")
        shutil.copytree(own / "img-v1", own / "img-v2")
        (own / "img").symlink_to("img-v1")
        loader = "manifest"
        options = {"query": str(own / "query.csv"), "gallery": str(own / "gallery.csv")}
        links = {own / "img": "img-v2"}
    before = dataset_fingerprints(loader, options)
    for link, target in links.items():
        _repoint(link, target)
    after = dataset_fingerprints(loader, options)
    split = "gallery" if case == "manifest's image folder" else "query"
    assert after[split] != before[split]
    if case != "manifest's image folder":  # the gallery's folder has no link
        assert after["gallery"] == before["gallery"]


def test_the_msmt17_fingerprint_reads_a_list_with_a_byte_order_mark(tmp_path):
    """The loader reads list files as utf-8-sig; the fingerprint kept the mark, so the
    first line's image was "\ufeff0000/..." (always missing) and rewriting it reran
    nothing: the old mAP, exit 0 (found by review)."""
    from rankwise.pipeline_config import dataset_fingerprints

    name = "0000_000_01_0303morning_0015_0.jpg"
    write_image(tmp_path / "test/0000" / name, 1)
    (tmp_path / "list_query.txt").write_text(f"\ufeff0000/{name} 0\n", encoding="utf-8")
    (tmp_path / "list_gallery.txt").write_text(f"0000/{name} 0\n")
    before = dataset_fingerprints("msmt17", {"root": str(tmp_path)})
    write_image(tmp_path / "test/0000" / name, 2)  # other pixels, other size or mtime
    after = dataset_fingerprints("msmt17", {"root": str(tmp_path)})
    assert after["query"] != before["query"] and after["gallery"] != before["gallery"]


def test_a_manifest_path_under_a_folder_named_tilde_counts_as_prepare_reads_it(tmp_path):
    # prepare reads `~/0.png` below the CSV's folder, not the home folder
    from rankwise.pipeline_config import dataset_fingerprints

    write_image(tmp_path / "~/0.png", 1)
    (tmp_path / "q.csv").write_text("id,label,path\nq0,a,~/0.png\n")
    options = {"query": str(tmp_path / "q.csv"), "gallery": str(tmp_path / "q.csv")}
    before = dataset_fingerprints("manifest", options)
    write_image(tmp_path / "~/0.png", 2)
    assert dataset_fingerprints("manifest", options)["query"] != before["query"]


def test_a_query_dir_link_pointed_at_the_gallery_dir_reruns_both_splits(tmp_path):
    """`folder` prefixes ids with query/ and gallery/ unless the two folders are one
    (links resolved): pointing the query link at the gallery folder changed the
    gallery's ids too, but only the query's split reran (prepare_split), so its stale
    gallery ids never matched a query's own: recall@1 100.0 where a fresh run gives
    16.7, exit 0 (found by review)."""
    for version in ("v1", "v2"):
        for label in "abc":
            for i in range(2):
                write_image(
                    tmp_path / f"data/{version}/{label}/{i}.png", len(version) * i + ord(label)
                )
    (tmp_path / "data/q").symlink_to("v1")
    config = {
        **CONFIG,
        "datasets": {
            "d": {"loader": "folder", "options": {"query_dir": "data/q", "gallery_dir": "data/v2"}}
        },
    }
    run_ok(tmp_path, config)
    (tmp_path / "data/q").unlink()
    (tmp_path / "data/q").symlink_to("v2")  # leave-one-out on the gallery folder
    assert planned(tmp_path, config) == {**ONE_SPLIT, "prepare_split": 2, "encode": 2}
    run_ok(tmp_path, config)
    metrics = tmp_path / "results/metrics/d/pixels.json"
    incremental = json.loads(metrics.read_text())["metrics"]
    run_ok(tmp_path, config, "--forceall")
    assert incremental == json.loads(metrics.read_text())["metrics"]
    assert incremental["recall@1"] < 100.0  # no query found itself


def test_the_msmt17_fingerprint_follows_the_image_folder_auto_picks(tmp_path):
    """`images: auto` reads test/ (V1) or mask_test_v2/ (V2), whichever exists, and the
    manifests name it: the same files moved from one to the other (a rename keeps sizes
    and mtimes) must change each split's digest, else its manifest kept the old paths."""
    from rankwise.pipeline_config import dataset_fingerprints

    for split, name in (
        ("query", "0001_000_01_0303morning_0015_0.jpg"),
        ("gallery", "0001_001_02_0303morning_0016_0.jpg"),
    ):
        write_image(tmp_path / "mask_test_v2/0001" / name, len(split))
        (tmp_path / f"list_{split}.txt").write_text(f"0001/{name} 1\n")
    before = dataset_fingerprints("msmt17", {"root": str(tmp_path)})
    (tmp_path / "mask_test_v2").rename(tmp_path / "test")
    after = dataset_fingerprints("msmt17", {"root": str(tmp_path)})
    assert all(after[split] != before[split] for split in ("query", "gallery"))


def test_a_demo_option_reruns_encode_even_after_a_run_stopped_after_prepare(tmp_path):
    """A generated dataset's data is a function of its options: a new noise level gives
    other images and the same manifest CSVs. Prepare reran (its options), but when the
    run stopped right after it (Ctrl-C, another job failing) the next run saw nothing to
    do and the report kept the old images' numbers, exit 0: the fingerprint encode reads
    was a constant for generated data; now it is the options' digest."""
    config = {**CONFIG, "datasets": {"demo": CONFIG["datasets"]["demo"]}}
    run_ok(tmp_path, config)
    assert planned(tmp_path, config) == {}
    noisy = copy.deepcopy(config)
    noisy["datasets"]["demo"]["options"]["noise"] = 0.9
    csvs = [tmp_path / f"results/manifests/demo/{s}.csv" for s in ("query", "gallery")]
    before = [csv.read_bytes() for csv in csvs]
    run_ok(tmp_path, noisy, "results/manifests/demo/query.csv")  # stops after prepare
    assert [csv.read_bytes() for csv in csvs] == before  # same manifests, other images
    assert planned(tmp_path, noisy) == {"encode": 2, "rank": 1, "metrics": 1, "report": 1, "all": 1}


# ---------------------------------------------------------------- missing paths fail loudly


@pytest.mark.parametrize(
    "name, entry, message",
    [
        (
            "new",
            {"kind": "onnx", "options": {"model": "checkpoints/typo.onnx"}},
            "encoders.new.options.model: checkpoints/typo.onnx not found",
        ),
        (
            "pre",
            {"kind": "precomputed", "options": {"query": "missing/q.npy", "gallery": "q.npy"}},
            "encoders.pre.options.query: missing/q.npy not found",
        ),
    ],
)
def test_a_missing_encoder_file_fails_before_any_job(workdir, name, entry, message):
    report = workdir / "results/report.json"
    before = (report.read_bytes(), report.stat().st_mtime_ns)
    config = copy.deepcopy(CONFIG)
    config["encoders"][name] = entry
    lines = error_lines(snakemake(workdir, config))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {workdir / 'my.yaml'}:")
    assert message in lines[0] and "Nothing to be done" not in lines[0]
    assert (report.read_bytes(), report.stat().st_mtime_ns) == before


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"root": "data/Market-1501"},
            "datasets.mk.options.root: folder data/Market-1501 not found",
        ),
    ],
)
def test_a_missing_dataset_root_fails_before_any_job(workdir, options, message):
    config = copy.deepcopy(CONFIG)
    config["datasets"]["mk"]["options"] = options
    lines = error_lines(snakemake(workdir, config, "--dry-run"))
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize(
    "options, message",
    [
        ({"root": ""}, "missing option root (or query_dir and gallery_dir)"),
        ({}, "missing option root (or query_dir and gallery_dir)"),
        ({"query_dir": "data/own/img"}, "options query_dir and gallery_dir go together"),
        (
            {"root": "data/own", "gallery_dir": "data/own/img"},
            "give either {query_dir, gallery_dir} or {root, query_fraction, seed}, not both",
        ),
    ],
)
def test_a_folder_dataset_without_its_layout_fails_before_any_job(workdir, options, message):
    # it was a traceback from the DAG build (the fingerprint of a query_dir of None)
    config = copy.deepcopy(CONFIG)
    config["datasets"]["fo"] = {"loader": "folder", "options": options}
    proc = snakemake(workdir, config, "--dry-run")
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1, lines
    assert f"datasets.fo.options: folder: {message}" in lines[0]


def test_a_missing_manifest_csv_fails_before_any_job(workdir):
    config = copy.deepcopy(CONFIG)
    config["datasets"]["own"]["options"]["gallery"] = "data/own/galery.csv"
    lines = error_lines(snakemake(workdir, config, "--dry-run"))
    assert len(lines) == 1, lines
    assert "datasets.own.options.gallery: file data/own/galery.csv not found" in lines[0]


def test_a_missing_image_of_a_manifest_csv_fails_before_any_job(tmp_path):
    """It failed in the encode jobs of that split, after prepare and other encodes had
    run, naming the pipeline's copy of the CSV (results/manifests/own/gallery.csv) and a
    path rebased there (../../../data/own/img/3.png)."""
    write_data(tmp_path)
    (tmp_path / "data/own/img/3.png").unlink()
    proc = snakemake(tmp_path, CONFIG)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = error_lines(proc)
    assert lines == [
        f"error: {tmp_path / 'my.yaml'}:13: datasets.own.options.gallery: "
        "data/own/gallery.csv: row 3 (id 'g3'): image 'img/3.png' not found (looked for "
        "data/own/img/3.png); fix the 'path' column or restore the file"
    ], lines
    assert not (tmp_path / "results").exists()  # no job ran


# ---------------------------------------------------------------- errors on the terminal


def test_a_failed_jobs_one_line_error_is_on_the_terminal(tmp_path):
    write_data(tmp_path)
    write_image(tmp_path / "data/market/query/0001-c1.png", 3)  # not a Market-1501 name
    config = {**CONFIG, "datasets": {"mk": CONFIG["datasets"]["mk"]}}
    proc = snakemake(tmp_path, config)
    assert proc.returncode != 0
    logs = sorted((tmp_path / "logs/manifests/mk").glob("*.log"))  # a job per split
    assert logs
    for path in logs:
        log = path.read_text().strip().splitlines()[-1]
        assert "file name does not follow the Market-1501 convention" in log
        assert log in proc.stderr  # the log's last line, verbatim, on the terminal
    assert not (tmp_path / "results/manifests/mk/query.csv").exists()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda c: c["datasets"]["mk"].update(protocl="reid"),
            "datasets.mk.protocl: unknown key 'protocl'; did you mean 'protocol'?",
        ),
        (
            lambda c: c["datasets"]["own"].update(loader="manifests"),
            "datasets.own.loader: 'manifests' is not allowed; did you mean 'manifest'?",
        ),
        (
            lambda c: c["encoders"]["pixels"].update(kind="pixel"),
            "encoders.pixels.kind: 'pixel' is not allowed; did you mean 'pixels'?",
        ),
        # a dataset's list form one level up: was an AttributeError traceback, exit 1
        (lambda c: c.update(encoders=["pixels"]), "encoders: expected object, got ['pixels']"),
        # an encoder per epoch named `20:`: was "encoders: expected string, got 20" at the
        # line of `encoders:`, without the fix
        (
            lambda c: c["encoders"].update({20: {"kind": "hog"}}),
            "encoders.20: the name 20 is read by YAML as a number, not as text; write it in "
            "quotes ('20':)",
        ),
    ],
)
def test_config_errors_are_one_line_with_key_path_and_suggestion(tmp_path, mutate, expected):
    config = copy.deepcopy(CONFIG)
    mutate(config)
    proc = snakemake(tmp_path, config, "--dry-run", profile=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # as the commands' bad input
    lines = error_lines(proc)
    lines = [line for line in lines if not line.startswith("Using workflow specific profile")]
    assert len(lines) <= 3, lines
    assert lines[0].startswith(f"error: {tmp_path / 'my.yaml'}:") and expected in lines[0]


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "report={worst_queries: -1}",
            "error: --config: report.worst_queries: -1 is less than the minimum of 0",
        ),
        (
            "datasets={mk: {protocl: reid}}",
            "error: --config: datasets.mk.protocl: unknown key 'protocl'; did you mean 'protocol'?",
        ),
        ("report={resamples: many}", "error: --config: report.resamples: expected integer"),
    ],
)
def test_a_bad_config_override_is_named_as_such(tmp_path, override, expected):
    """A value `--config` set is named `--config`, not a line of the file whose value it
    replaced (my.yaml sets `report.resamples: 0`: the message named that line)."""
    proc = snakemake(tmp_path, CONFIG, "--dry-run", "--config", override)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and lines[0].startswith(expected), lines


@pytest.mark.parametrize(
    "override, jobs",
    [
        # Snakemake reads values inside a --config mapping as text ('200', '1', 'false'):
        # they failed the schema ("expected integer, got '200'") and named my.yaml's line
        ("report={resamples: 200}", {"metrics": 3, "report": 1, "all": 1}),
        ("datasets={mk: {ks: [1, 5]}}", {"metrics": 1, "report": 1, "all": 1}),
        (
            "datasets={mk: {exclude_same_camera: false}}",
            {"rank": 1, "metrics": 1, "report": 1, "all": 1},
        ),
    ],
)
def test_config_overrides_are_read_as_the_schema_wants(workdir, override, jobs):
    proc = snakemake(workdir, CONFIG, "--dry-run", "--config", override)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert planned_jobs(proc.stdout + proc.stderr) == jobs


def test_a_duplicated_yaml_key_is_an_error(tmp_path):
    text = yaml.safe_dump(CONFIG, sort_keys=False).replace(
        "encoders:\n", "encoders:\n  pixels:\n    kind: hog\n", 1
    )
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(text)
    proc = snakemake(tmp_path, None, "--dry-run")
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1, lines
    assert "config/config.yaml:" in lines[0] and "key 'pixels' given twice" in lines[0]


def test_a_yaml_syntax_error_names_file_and_line(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(
        "datasets:\n  d:\n    loader: digits\n   protocol: recall\n"
    )
    lines = error_lines(snakemake(tmp_path, None, "--dry-run"))
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: config/config.yaml:4:4: YAML syntax error")


BROKEN = "datasets:\n  d:\n    loader: digits\n    ks: [1, 5\n    protocol: recall\n"


@pytest.mark.parametrize("flag", ["--configfile", "--configfiles"])
def test_a_yaml_syntax_error_in_a_configfile_names_file_and_line(tmp_path, flag):
    """Snakemake parses --configfile before the workflow runs and names neither file nor
    line; the default profile's logger plugin adds the line that does (the first broken
    file of several)."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    proc = snakemake(tmp_path, None, "--dry-run", flag, str(good), str(bad), profile=True)
    lines = [line for line in error_lines(proc) if not line.startswith("Using workflow")]
    assert len(lines) <= 3, lines
    assert any(line.startswith(f"error: {bad}:5:13: YAML syntax error") for line in lines), lines


def test_without_the_profile_snakemake_alone_names_no_file(tmp_path):
    """What the plugin adds: without it (--workflow-profile none) Snakemake's two lines
    are all there is (README: the same `rankwise` line comes from the default profile)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    lines = error_lines(snakemake(tmp_path, None, "--dry-run", "--configfile", str(bad)))
    assert any("not valid JSON or YAML" in line for line in lines), lines
    assert not any(str(bad) in line for line in lines), lines


@pytest.mark.parametrize("folder", [False, True])
def test_a_missing_configfile_is_one_line_not_a_traceback(tmp_path, folder):
    """Snakemake logs a 25-line traceback ending in FileNotFoundError for a --configfile
    typo; the default profile's plugin makes it one line naming the path."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    missing = tmp_path / ("a-folder" if folder else "my.yml")
    if folder:
        missing.mkdir()
    proc = snakemake(
        tmp_path, None, "--dry-run", "--configfile", str(good), str(missing), profile=True
    )
    lines = [line for line in error_lines(proc) if not line.startswith("Using workflow")]
    what = "is a folder, not a config file" if folder else "config file not found"
    assert lines == [
        f"error: {missing}: {what}; pass the path of an existing YAML file to --configfile"
    ], lines


def test_a_configfile_not_in_utf8_is_one_line_not_a_traceback(tmp_path):
    """Snakemake's traceback ending in UnicodeDecodeError becomes the plugin's line."""
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"# caf\xe9\n" + yaml.safe_dump(CONFIG, sort_keys=False).encode())
    proc = snakemake(tmp_path, None, "--dry-run", "--configfile", str(latin1), profile=True)
    lines = [line for line in error_lines(proc) if not line.startswith("Using workflow")]
    assert len(lines) == 1 and "Traceback" not in proc.stdout + proc.stderr, lines
    assert lines[0].startswith(f"error: {latin1}: not a readable config file: line 1 is not")


@pytest.mark.parametrize(
    ("text", "what"),
    [("", "is empty"), ("# nothing yet\n", "is empty"), ("- a\n- b\n", "holds a list"),
     ("7\n", "holds a number"), ("[1, 2]", "holds a list")],  # the last one: JSON
)  # fmt: skip
def test_a_configfile_without_top_level_keys_is_named(tmp_path, text, what):
    """Snakemake's "must be given as JSON or YAML with keys at top level" names no file;
    the default profile's plugin adds one line that does (the first such file)."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = snakemake(tmp_path, None, "--dry-run", "--configfile", str(good), str(bad), profile=True)
    assert proc.returncode != 0
    lines = [line for line in error_lines(proc) if not line.startswith("Using workflow")]
    assert len(lines) <= 3, lines
    assert lines[-1] == (
        f"error: {bad}: the config file {what}, not a mapping of keys; write top-level keys "
        "such as 'datasets:' and 'encoders:' (config/config.yaml)"
    ), lines


def test_the_logger_plugin_is_silent_on_good_configs_and_other_errors(tmp_path):
    from snakemake_logger_plugin_rankwise import (
        command_line_configfiles,
        not_a_mapping,
        syntax_error,
    )

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    as_json = tmp_path / "c.json"
    as_json.write_text('{"report": {"title": "t"}}')
    assert syntax_error([str(good), str(as_json), str(tmp_path / "missing.yaml")]) is None
    assert not_a_mapping([str(good), str(as_json), str(tmp_path / "missing.yaml")]) is None
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    assert syntax_error([str(good), str(bad)]).startswith(f"error: {bad}:5:13: YAML syntax")
    # Snakemake's own parser: several files, other options around them (`--config`
    # shares the prefix)
    argv = ["-n", "--configfiles", "a.yaml", "b.yaml", "--config", "x=1", "--cores", "2"]
    assert command_line_configfiles(argv) == ["a.yaml", "b.yaml"]
    assert command_line_configfiles(["--no-such-option"]) == []


# ---------------------------------------------------------------- quiet


def test_default_profile_is_compact(workdir):
    config = copy.deepcopy(CONFIG)
    config["report"]["title"] = "retitled"  # reruns only the report
    proc = snakemake(workdir, config, "--dry-run", profile=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert planned_jobs(out) == {"report": 1, "all": 1}
    assert "input:" not in out and "reason:" not in out
    verbose = run_ok(workdir, config, "--dry-run")
    assert "input:" in verbose  # --workflow-profile none: Snakemake's full descriptions


def test_finished_jobs_are_named_by_their_wildcards(workdir):
    """The quiet output shows no job descriptions; the profile's logger plugin adds each
    job's wildcards to Snakemake's "Finished jobid" line (a job without any: unchanged)."""
    import re

    out = (workdir / "first-run.txt").read_text()
    finished = [line for line in out.splitlines() if line.startswith("Finished jobid:")]
    # prepare (demo) + prepare_split (mk, own), encode, rank, metrics, report, all
    assert len(finished) == 1 + 4 + 6 + 3 + 3 + 1 + 1
    for rule, name in [
        ("prepare", "dataset=demo"),
        ("prepare_split", "dataset=own, split=query"),
        ("encode", "dataset=mk, encoder=pixels, split=gallery"),
        ("rank", "dataset=demo, encoder=pixels"),
    ]:
        assert any(
            re.fullmatch(rf"Finished jobid: \d+ \(Rule: {rule}; {name}\)", f) for f in finished
        )
    assert any(re.fullmatch(r"Finished jobid: \d+ \(Rule: report\)", f) for f in finished)
    assert "input:" not in out


def test_logs_hold_no_progress_bars(workdir):
    logs = list((workdir / "logs").rglob("*.log"))
    assert len(logs) >= 10
    for log in logs:
        assert "0%|" not in log.read_text() and "it/s]" not in log.read_text(), log


# ---------------------------------------------------------------- last: mutates the workdir


def test_an_image_rewritten_under_its_name_reruns_encode(workdir):
    """The manifest CSV stays byte-identical; the split's fingerprint file changes (also
    when the user's CSV starts with a byte-order mark and names `path` first)."""
    manifest = workdir / "results/manifests/own/query.csv"
    before = manifest.read_bytes()
    write_image(workdir / "data/own/img/1.png", 55)
    # only prepare runs now (e.g. an interrupted run); encode must still see the change
    run_ok(workdir, CONFIG, "results/manifests/own/query.csv")
    assert manifest.read_bytes() == before
    assert planned(workdir) == {"encode": 1, "rank": 1, "metrics": 1, "report": 1, "all": 1}
    run_ok(workdir, CONFIG)
    assert planned(workdir) == {}


def test_reading_a_snakemake_ranks_store_is_silent(tmp_path):
    """Snakemake leaves `.snakemake_timestamp` inside directory() outputs such as the
    ranks stores; reading one lists no group members, so zarr never warns about that
    file (the warning reached the jobs' logs and the test summary)."""
    import warnings

    import pandas as pd

    from rankwise.store import read_ranks

    rng = np.random.default_rng(0)
    query = pd.DataFrame({"id": ["q0", "q1"], "label": ["a", "b"], "camera": [0, 0]})
    gallery = pd.DataFrame({"id": [f"g{i}" for i in range(6)], "label": list("ababab")})
    gallery["camera"] = 1
    args = helpers.write_inputs(
        tmp_path,
        query,
        gallery,
        rng.standard_normal((2, 4)).astype(np.float32),
        rng.standard_normal((6, 4)).astype(np.float32),
    )
    store = tmp_path / "ranks.zarr"
    proc = helpers.run_rankwise("rank", *args, "--protocol", "reid", "--out", str(store))
    assert proc.returncode == 0, proc.stderr
    (store / ".snakemake_timestamp").touch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arrays, attrs = read_ranks(store)
    assert [str(w.message) for w in caught] == []
    assert attrs["kind"] == "ranks" and len(arrays["offsets"]) == 3


def test_zarr_rewritten_in_place_and_encoders_reordered_rerun(tmp_path):
    """A precomputed Zarr store whose chunks are rewritten in place (the folder's mtime
    stays) reruns that encoder's jobs; reordering the encoders (beyond four, the tests
    pair each with the previous one in config order) reruns the report; a title with
    braces is text, not a wildcard."""
    import zarr

    write_data(tmp_path)
    rng = np.random.default_rng(0)
    names = [f"e{i}" for i in range(5)]
    for name in names:
        for split, rows in (("query", 2), ("gallery", 4)):
            group = zarr.open_group(str(tmp_path / f"feats/{name}_{split}.zarr"), mode="w")
            group.create_array("embeddings", data=rng.normal(size=(rows, 3)).astype("f4"))
    encoders = {
        name: {
            "kind": "precomputed",
            "options": {
                "query": f"feats/{name}_query.zarr",
                "gallery": f"feats/{name}_gallery.zarr",
            },
        }
        for name in names
    }
    config = {
        "datasets": {"own": CONFIG["datasets"]["own"]},
        "encoders": encoders,
        "engine": {"threads": 1},
        "report": {"resamples": 20, "worst_queries": 0, "title": "runs {a,b}"},
    }
    run_ok(tmp_path, config)
    assert planned(tmp_path, config) == {}
    store = tmp_path / "feats/e2_gallery.zarr"
    folder_mtime = store.stat().st_mtime_ns
    array = zarr.open_array(str(store / "embeddings"), mode="r+")
    array[...] = rng.normal(size=(4, 3)).astype("f4")
    assert store.stat().st_mtime_ns == folder_mtime
    assert planned(tmp_path, config) == {
        "encode": 1,
        "rank": 1,
        "metrics": 1,
        "report": 1,
        "all": 1,
    }
    run_ok(tmp_path, config)
    reordered = copy.deepcopy(config)
    reordered["encoders"] = {name: encoders[name] for name in reversed(names)}
    assert planned(tmp_path, reordered) == {"report": 1, "all": 1}
    assert "runs {a,b}" in (tmp_path / "results/report.md").read_text()


# ---------------------------------------------------------------- values reach the jobs


def _own_reid_data(root: Path) -> None:
    """A re-ID manifest dataset with precomputed embeddings: 8 queries, 24 gallery rows
    over two cameras, gallery label -1 on four rows (junk by default, a distractor
    without junk labels)."""
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(4, 6))
    q_labels, g_labels = np.arange(8) % 4, np.arange(24) % 4
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    np.save(data / "q.npy", (centres[q_labels] + rng.normal(size=(8, 6))).astype("f4"))
    np.save(data / "g.npy", (centres[g_labels] + rng.normal(size=(24, 6))).astype("f4"))
    (data / "query.csv").write_text(
        "id,label,camera\n" + "".join(f"q{i},{q_labels[i]},0\n" for i in range(8))
    )
    (data / "gallery.csv").write_text(
        "id,label,camera\n"
        + "".join(f"g{i},{-1 if i < 4 else g_labels[i]},{i % 2}\n" for i in range(24))
    )


def test_an_empty_junk_list_and_an_empty_title_reach_the_jobs(tmp_path):
    """``junk_labels: []`` was an empty unquoted word (Snakemake's ``{x:q}`` leaves an
    empty value unquoted), so ``--junk-labels --keep-same-camera`` ran with the junk
    label "--keep-same-camera" and the same-camera rule on: wrong numbers, exit 0. The
    pipeline's numbers must be the CLI's with the same options."""
    _own_reid_data(tmp_path)
    config = {
        "datasets": {
            "own": {
                "loader": "manifest",
                "options": {"query": "data/query.csv", "gallery": "data/gallery.csv"},
                "protocol": "reid",
                "ks": [1, 5],
                "junk_labels": [],
                "exclude_same_camera": False,
                "verification": {"fprs": [0.1], "bins": 10},
            }
        },
        "encoders": {
            "pre": {
                "kind": "precomputed",
                "options": {"query": "data/q.npy", "gallery": "data/g.npy"},
            }
        },
        "engine": {"threads": 1},
        "report": {"resamples": 0, "worst_queries": 0, "title": ""},
    }
    run_ok(tmp_path, config, "--replace-workflow-config")
    data = tmp_path / "data"
    common = [
        *("--query", data / "query.csv", "--gallery", data / "gallery.csv"),
        *("--query-embeddings", data / "q.npy", "--gallery-embeddings", data / "g.npy"),
        *("--protocol", "reid", "--junk-labels", "", "--keep-same-camera"),
    ]
    results = {}
    for command, extra, produced in (
        ("evaluate", ["--ks", "1,5"], "results/metrics/own/pre.json"),
        ("verify", ["--fprs", "0.1", "--bins", "10"], "results/verification/own/pre.json"),
    ):
        expected = tmp_path / f"cli-{command}.json"
        proc = helpers.run_rankwise(command, *common, *extra, "--output", expected)
        assert proc.returncode == 0, proc.stderr
        want = json.loads(expected.read_text())
        got = results[command] = json.loads((tmp_path / produced).read_text())
        for key in set(want) - {"provenance", "inputs"}:
            assert got[key] == want[key], (command, key)
    # every row of the gallery counts: the four label -1 rows are not junk, and the
    # same-camera matches are kept (5 matches of each query, 3 of them on camera 0)
    evaluation = results["evaluate"]
    assert evaluation["protocol_options"] == {"exclude_same_camera": False, "junk_labels": []}
    assert (evaluation["num_queries"], evaluation["num_skipped"]) == (8, 0)
    assert results["verify"]["num_positive_pairs"] == 8 * 5
    assert json.loads((tmp_path / "results/report.json").read_text())["title"] == ""
