"""rankwise.pipeline_config: the pipeline's config checks, sweeps and dataset fingerprints.

Pure functions, tested directly; tests/test_pipeline_trust.py runs them through Snakemake.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import yaml

from rankwise import RankwiseError
from rankwise import pipeline_config as pc

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())

CONFIG = {
    "datasets": {
        "market": {"loader": "demo-market", "options": {"seed": 0}, "protocol": "reid"},
    },
    "encoders": {
        "pixels": {"kind": "pixels", "options": {"size": [16, 8]}},
        "net": {"kind": "onnx", "options": {"model": "net.onnx"}},
    },
}


# ---------------------------------------------------------------- YAML


def test_duplicated_key_is_an_error_naming_both_lines(tmp_path):
    file = tmp_path / "my.yaml"
    file.write_text(
        "encoders:\n  e1:\n    kind: hog\n  e2:\n    kind: hog\n  e1:\n    kind: pixels\n"
    )
    with pytest.raises(
        RankwiseError, match=rf"^{file}:6: key 'e1' given twice \(first on line 2\)"
    ):
        pc.load_yaml(file)


def test_merge_keys_copy_an_entry_and_own_keys_override(tmp_path):
    """``<<: *base`` (YAML merge keys) load as PyYAML's safe_load reads them; a key the
    mapping sets itself overrides the merged one, and is not a duplicate."""
    file = tmp_path / "my.yaml"
    file.write_text(
        "encoders:\n  a: &base\n    kind: pixels\n    options: {size: [16, 8]}\n"
        "  b:\n    <<: *base\n    kind: hog\n  c: {<<: *base}\n"
    )
    assert pc.load_yaml(file) == yaml.safe_load(file.read_text())
    assert pc.load_yaml(file)["encoders"]["b"] == {"kind": "hog", "options": {"size": [16, 8]}}
    file.write_text("a: &b {k: 1}\nc:\n  <<: *b\n  k: 2\n  k: 3\n")
    with pytest.raises(RankwiseError, match=r":5: key 'k' given twice \(first on line 4\)"):
        pc.load_yaml(file)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.update(encoders={}), r"^config: encoders: none defined; add at least one"),
        (lambda c: c.pop("datasets"), r"^config: datasets: none defined; add at least one"),
    ],
)
def test_no_dataset_or_no_encoder_is_an_error(tmp_path, mutate, message):
    config = copy.deepcopy(CONFIG)
    mutate(config)
    with pytest.raises(RankwiseError, match=message):
        pc.check(config, ROOT / "config" / "schema.yaml")


def test_an_empty_encoder_list_is_an_error_not_every_encoder():
    with pytest.raises(RankwiseError, match=r"datasets\.d\.encoders: an empty list evaluates"):
        pc.check_dataset_encoders({"d": {"encoders": []}}, {"e": {}}, {})


def test_folder_digest_follows_files_rewritten_in_place(tmp_path):
    """A precomputed Zarr store: rewriting a chunk changes no folder mtime, but this."""
    store = tmp_path / "g.zarr"
    (store / "embeddings" / "c").mkdir(parents=True)
    (store / ".zattrs").write_text("{}")
    chunk = store / "embeddings" / "c" / "0"
    chunk.write_bytes(b"1234")
    before = pc.folder_digest(store)
    stat = store.stat()
    chunk.write_bytes(b"5678")
    os.utime(chunk, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert store.stat().st_mtime_ns == stat.st_mtime_ns
    assert pc.folder_digest(store) != before
    after = pc.folder_digest(store)
    (store / ".zattrs").write_text('{"a": 1}')  # hidden files count (Zarr v2 metadata)
    assert pc.folder_digest(store) != after
    assert pc.folder_digest(store) == pc.folder_digest(store)


def test_same_key_in_two_mappings_is_fine(tmp_path):
    file = tmp_path / "my.yaml"
    file.write_text("a: {options: {seed: 1}}\nb: {options: {seed: 1}}\n")
    assert pc.load_yaml(file) == {"a": {"options": {"seed": 1}}, "b": {"options": {"seed": 1}}}


@pytest.mark.parametrize(
    "text, where",
    [
        ("datasets:\n  d:\n    loader: digits\n   protocol: x\n", ":4:4:"),
        ("a: [1, 2\nb: 3\n", ":2:"),
        ("a: 'open\n", ":2:"),
    ],
)
def test_yaml_syntax_error_names_file_and_line(tmp_path, text, where):
    file = tmp_path / "my.yaml"
    file.write_text(text)
    with pytest.raises(RankwiseError, match=rf"^{file}{where}.* YAML syntax error") as info:
        pc.load_yaml(file)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- schema messages


def test_yaml_1_1_exponent_floats_are_numbers():
    """Snakemake's YAML 1.1 parser reads `1e-4` (no dot) as a string; where the schema
    wants a number it is that number (the README's verification example); a string that
    is no float, or one where a string is wanted, stays an error / text."""
    text = (
        "datasets:\n  market:\n    loader: demo-market\n    protocol: reid\n"
        "    verification: {fprs: [1e-4, 1.0e-3, 1E-2], bins: 60}\n"
        "    rerank: {k1: 20, k2: 6, lambda: 3e-1}\n"
        "    junk_labels: [1e5]\n"
        "encoders:\n  pixels: {kind: pixels}\n"
    )
    config = yaml.safe_load(text)
    assert config["datasets"]["market"]["verification"]["fprs"][0] == "1e-4"  # YAML 1.1
    pc.check_config(config, SCHEMA)
    market = config["datasets"]["market"]
    assert market["verification"]["fprs"] == [1e-4, 1e-3, 1e-2]
    assert market["rerank"]["lambda"] == 0.3
    assert market["junk_labels"] == ["1e5"]  # labels are text: left alone
    market["rerank"]["lambda"] = "e-1"
    with pytest.raises(RankwiseError, match=r"rerank.*expected number, got 'e-1'"):
        pc.check_config(config, SCHEMA)


def _error(mutate, files=()) -> str:
    config = copy.deepcopy(CONFIG)
    mutate(config)
    with pytest.raises(RankwiseError) as info:
        pc.check_config(config, SCHEMA, files=files)
    return str(info.value)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda c: c["datasets"]["market"].update(protocl="reid"),
            "datasets.market.protocl: unknown key 'protocl'; did you mean 'protocol'?",
        ),
        (
            lambda c: c["datasets"]["market"].update(distanse="cosine"),
            "datasets.market.distanse: unknown key 'distanse'; did you mean 'distance'?",
        ),
        (
            lambda c: c["datasets"]["market"]["options"].update(identites=4),
            "datasets.market.options.identites: unknown key 'identites'; "
            "did you mean 'identities'?",
        ),
        (
            lambda c: c["encoders"]["net"]["options"].update(inputsize=[2, 2]),
            "encoders.net.options.inputsize: unknown key 'inputsize'; did you mean 'input_size'?",
        ),
        (lambda c: c.update(engin={}), "engin: unknown key 'engin'; did you mean 'engine'?"),
        (
            lambda c: c["datasets"]["market"].update(loader="demo-markt"),
            "datasets.market.loader: 'demo-markt' is not allowed; did you mean 'demo-market'?",
        ),
        (
            lambda c: c["encoders"]["net"].update(kind="onx"),
            "encoders.net.kind: 'onx' is not allowed; did you mean 'onnx'?",
        ),
        (
            lambda c: c["datasets"]["market"].update(protocol="reidd"),
            "datasets.market.protocol: 'reidd' is not allowed; did you mean 'reid'?",
        ),
        (
            lambda c: c["datasets"]["market"].update(ks=[1, "five"]),
            "datasets.market.ks[1]: expected integer, got 'five'",
        ),
        (
            lambda c: c["encoders"]["net"]["options"].pop("model"),
            "encoders.net.options: missing key 'model'; add it",
        ),
        (
            lambda c: c["encoders"].update({"my net": {"kind": "hog"}}),
            "encoders: name 'my net' cannot be a folder name",
        ),
        # JSON Schema's integer takes 5.0; the jobs would refuse it after others ran
        (
            lambda c: c["datasets"]["market"].update(ks=[1, 5.0]),
            "datasets.market.ks[1]: expected integer, got 5.0",
        ),
        # and -1.0 as a string ('-1.0') would match no label: junk silently kept
        (
            lambda c: c["datasets"]["market"].update(junk_labels=[-1.0]),
            "datasets.market.junk_labels[0]: expected string or integer, got -1.0",
        ),
        (
            lambda c: c["encoders"]["pixels"]["options"].update(size=[16.0, 8]),
            "encoders.pixels.options.size[0]: expected integer, got 16.0",
        ),
        (
            lambda c: c["datasets"]["market"].update(ks=[1, True]),
            "datasets.market.ks[1]: expected integer, got True",
        ),
        # names YAML reads as numbers or booleans (an encoder per epoch: `20:`): the
        # message said "encoders: expected string, got 20", without the fix
        (
            lambda c: c["encoders"].update({20: {"kind": "hog"}}),
            "encoders.20: the name 20 is read by YAML as a number, not as text; write it in "
            "quotes ('20':)",
        ),
        (
            lambda c: c["datasets"].update({True: {"loader": "digits"}}),
            "datasets: a name is read by YAML as true or false (so are yes, no, on and off), "
            "not as text; write that name in quotes (e.g. 'yes':)",
        ),
        (
            lambda c: c.update(report={"title": 2024}),
            "report.title: expected string, got 2024; YAML reads it as a number: write it in "
            "quotes",
        ),
    ],
)
def test_schema_errors_are_one_line_with_the_key_path(mutate, message):
    text = _error(mutate)
    assert text.startswith("config: " + message), text
    assert "\n" not in text and len(text) < 300


def test_unknown_key_without_a_close_match_lists_the_valid_keys():
    text = _error(lambda c: c["datasets"]["market"].update(zzz=1))
    assert (
        "unknown key 'zzz'; valid: ap, aqe, distance, drop_junk, encoders, exclude_same_camera, "
        "gap_frames" in text
    )


def test_error_names_the_file_and_line_that_set_the_key(tmp_path):
    base, mine = tmp_path / "config.yaml", tmp_path / "mine.yaml"
    base.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    mine.write_text("datasets:\n  market:\n    loader: demo-market\n    distanse: cosine\n")
    config = copy.deepcopy(CONFIG)
    config["datasets"]["market"]["distanse"] = "cosine"
    with pytest.raises(RankwiseError, match=rf"^{mine}:4: datasets.market.distanse: "):
        pc.check_config(config, SCHEMA, files=[base, mine])


def test_a_name_yaml_reads_as_a_number_is_located_at_its_own_line(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("encoders:\n  pixels:\n    kind: pixels\n  20:\n    kind: hog\n")
    config = copy.deepcopy(CONFIG)
    config["encoders"][20] = {"kind": "hog"}
    with pytest.raises(RankwiseError, match=rf"^{mine}:4: encoders.20: the name 20 is read"):
        pc.check_config(config, SCHEMA, files=[mine])


def test_shipped_schema_accepts_the_config_and_a_sweep():
    config = copy.deepcopy(CONFIG)
    config["encoders"]["run"] = {"kind": "onnx", "checkpoints": "runs/*.onnx"}
    pc.mark_sweeps(config["encoders"])
    pc.check_config(config, SCHEMA)
    assert config["encoders"]["run"]["options"]["model"] == pc.SWEEP_PLACEHOLDER


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"kind": "hog", "checkpoints": "x/*.pth"},
            "encoders.e.checkpoints: kind 'hog' reads no checkpoint file",
        ),
        (
            {"kind": "onnx", "checkpoints": "x/*.onnx", "options": {"model": "a.onnx"}},
            "encoders.e.options.model: give either checkpoints or this option, not both",
        ),
    ],
)
def test_bad_sweep_entries(entry, message):
    with pytest.raises(RankwiseError, match="^" + message):
        pc.mark_sweeps({"e": entry})


def test_unknown_encoder_of_a_dataset_has_a_suggestion():
    datasets = {"market": {"encoders": ["pixles"]}}
    with pytest.raises(
        RankwiseError,
        match=r"datasets.market.encoders: 'pixles' is not under "
        r"`encoders:`; did you mean 'pixels'\?",
    ):
        pc.check_dataset_encoders(datasets, {"pixels": {}}, {})


# ---------------------------------------------------------------- sweeps


def test_natural_order():
    stems = ["epoch_10", "epoch_2", "epoch_1", "best", "epoch_100", "Epoch_3"]
    assert sorted(stems, key=pc.natural_key) == [
        "best",
        "epoch_1",
        "epoch_2",
        "Epoch_3",
        "epoch_10",
        "epoch_100",
    ]
    # a digit that is no decimal ('²') is text; an Arabic-Indic digit is a number
    assert sorted(["ep1²", "ep10", "ep\u0663", "ep2"], key=pc.natural_key) == [
        "ep1²",
        "ep2",
        "ep\u0663",
        "ep10",
    ]


def _touch(*paths):
    for path in paths:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"x")


def test_sweep_expands_in_place_in_natural_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch("runs/epoch_10.onnx", "runs/epoch_2.onnx", "runs/epoch_1.onnx", "runs/notes.txt")
    encoders = {
        "a": {"kind": "hog", "options": {}},
        "run": {
            "kind": "onnx",
            "checkpoints": "runs/*.onnx",
            "options": {"model": pc.SWEEP_PLACEHOLDER, "input_size": [16, 8]},
        },
        "z": {"kind": "pixels", "options": {}},
    }
    expanded, sweeps = pc.expand_checkpoints(encoders)
    names = ["run@epoch_1", "run@epoch_2", "run@epoch_10"]
    assert list(expanded) == ["a", *names, "z"]
    assert sweeps == {"run": names}
    assert expanded["run@epoch_10"] == {
        "kind": "onnx",
        "options": {"model": "runs/epoch_10.onnx", "input_size": [16, 8]},
    }
    assert "checkpoints" in encoders["run"]  # the input is not mutated
    assert pc.expand_names(["z", "run"], sweeps) == ["z", *names]
    assert pc.expand_names(["run@epoch_2"], sweeps) == ["run@epoch_2"]
    assert pc.expand_names(None, sweeps) is None


@pytest.mark.parametrize("kind, option", sorted(pc.CHECKPOINT_OPTION.items()))
def test_sweep_passes_the_file_as_the_kinds_option(tmp_path, monkeypatch, kind, option):
    monkeypatch.chdir(tmp_path)
    _touch("w/e1.bin")
    expanded, _ = pc.expand_checkpoints(
        {"s": {"kind": kind, "checkpoints": "w/*.bin", "options": {}}}
    )
    assert expanded["s@e1"]["options"] == {option: "w/e1.bin"}


@pytest.mark.parametrize(
    "files, pattern, message",
    [
        ([], "runs/*.onnx", r"encoders.run.checkpoints: 'runs/\*.onnx' matches no file"),
        (  # one name after the characters are mapped: both files named, not one dropped
            ["r/epoch=1.onnx", "r/epoch-1.onnx"],
            "r/*.onnx",
            r"^encoders\.run\.checkpoints: r/epoch-1\.onnx and r/epoch=1\.onnx would both be "
            r"the encoder run@epoch-1; narrow the pattern, or rename one of the files$",
        ),
        (  # one stem, one folder: named by their paths, still one name
            ["r/model.pth", "r/model.onnx"],
            "r/model.*",
            r"r/model\.onnx and r/model\.pth would both be the encoder run@model;",
        ),
        (  # by their paths, a/b-c and a-b/c are one name
            ["w/a/b-c/m.onnx", "w/a-b/c/m.onnx"],
            "w/**/m.onnx",
            r"w/a-b/c/m\.onnx and w/a/b-c/m\.onnx would both be the encoder run@a-b-c-m;",
        ),
        (  # Hugging Face Trainer's folders: "matches no file" said to check the pattern
            ["hf/checkpoint-500/model.safetensors", "hf/checkpoint-1000/model.safetensors"],
            "hf/checkpoint-*",
            r"^encoders\.run\.checkpoints: 'hf/checkpoint-\*' matches 2 folder\(s\) "
            r"\(hf/checkpoint-500, \.\.\.\) and no file; a checkpoint is a file: add the "
            r"file's name to the pattern \(name the file itself: "
            r"hf/checkpoint-500/model\.safetensors\)$",
        ),
        # run@ep.json's metrics file would be run@ep.json.json beside run@ep's run@ep.json
        (["r/ep.json.onnx", "r/ep.onnx"], "r/*.onnx", "the name 'ep.json' cannot be part of an"),
    ],
)
def test_sweep_errors(tmp_path, monkeypatch, files, pattern, message):
    monkeypatch.chdir(tmp_path)
    _touch(*files)
    with pytest.raises(RankwiseError, match=message):
        pc.expand_checkpoints({"run": {"kind": "onnx", "checkpoints": pattern, "options": {}}})


def _sweep(pattern: str, kind: str = "timm") -> tuple[list[str], dict]:
    """The names (after ``run@``) of a sweep over ``pattern``, in order, and its encoders."""
    expanded, sweeps = pc.expand_checkpoints(
        {"run": {"kind": kind, "checkpoints": pattern, "options": {"model": "resnet18"}}}
    )
    return [n.partition("@")[2] for n in sweeps["run"]], expanded


def test_lightning_checkpoint_names_are_mapped_in_epoch_order(tmp_path, monkeypatch):
    """PyTorch Lightning's ModelCheckpoint names (``epoch=3-step=100.ckpt``): ``=``, which
    a name may not hold, becomes ``-``; epochs in natural order; the file, as it is, is
    the checkpoint option. Other characters (a space, ``~``, a non-ASCII letter) too."""
    monkeypatch.chdir(tmp_path)
    epochs = [(10, 1100), (0, 100), (2, 300), (1, 200)]
    _touch(*[f"lightning_logs/version_0/checkpoints/epoch={e}-step={s}.ckpt" for e, s in epochs])
    _touch("lightning_logs/version_0/checkpoints/last.ckpt")
    names, expanded = _sweep("lightning_logs/version_*/checkpoints/*.ckpt")
    assert names == ["epoch-0-step-100", "epoch-1-step-200", "epoch-2-step-300",
                     "epoch-10-step-1100", "last"]  # fmt: skip
    assert expanded["run@epoch-10-step-1100"]["options"] == {
        "model": "resnet18",
        "checkpoint": "lightning_logs/version_0/checkpoints/epoch=10-step=1100.ckpt",
    }
    # after the @ a name may start with any character it holds (the schema's entry@name)
    _touch("odd/epoch 1.pt", "odd/époque~2.pt", "odd/=3.pt", "odd/_best.pt")
    assert _sweep("odd/*.pt")[0] == ["-3", "-poque-2", "_best", "epoch-1"]


@pytest.mark.parametrize(
    "pattern",
    [
        "runs/checkpoint-*/model.safetensors",
        "runs/**/model.safetensors",
        "runs/checkpoint-*/*.safetensors",
        "./runs/checkpoint-[0-9]*/model.safetensors",
    ],
)
def test_hugging_face_folders_are_named_by_their_path(tmp_path, monkeypatch, pattern):
    """Hugging Face's Trainer writes ``checkpoint-<step>/model.safetensors``: one stem
    for every file, so each is named by its path below the pattern's folders before the
    first wildcard (``runs``), ``/`` as ``-``, in step order; the absolute pattern too."""
    monkeypatch.chdir(tmp_path)
    _touch(*[f"runs/checkpoint-{step}/model.safetensors" for step in (1000, 500, 50)])
    want = ["checkpoint-50-model", "checkpoint-500-model", "checkpoint-1000-model"]
    names, expanded = _sweep(pattern)
    assert names == want
    file = expanded["run@checkpoint-500-model"]["options"]["checkpoint"]
    assert Path(file) == Path("runs/checkpoint-500/model.safetensors")
    assert _sweep(str(tmp_path / pattern))[0] == want


def test_repeated_stems_name_by_the_folders_after_the_fixed_ones(tmp_path, monkeypatch):
    """The fixed folders are those before the first component with a wildcard; from the
    working directory when the first has one; a file in the fixed folder itself keeps its
    stem; a folder's characters are mapped as a file name's."""
    monkeypatch.chdir(tmp_path)
    _touch("exp/a/seed=1/model.pt", "exp/b/seed=1/model.pt", "exp/model.pt")
    assert _sweep("exp/**/model.pt")[0] == ["a-seed-1-model", "b-seed-1-model", "model"]
    assert _sweep("exp/*/seed=1/model.pt")[0] == ["a-seed-1-model", "b-seed-1-model"]
    assert _sweep("*/*/seed=1/model.pt")[0] == ["exp-a-seed-1-model", "exp-b-seed-1-model"]
    # only the files of the repeated stem are named by their paths
    _touch("exp/a/seed=1/extra.pt")
    assert _sweep("exp/a/*/*.pt")[0] == ["extra", "model"]  # distinct stems: as before
    # in order of the files' own stems (extra before model), then of their paths
    assert _sweep("exp/*/seed=1/*.pt")[0] == ["extra", "a-seed-1-model", "b-seed-1-model"]


def test_a_file_repeating_a_stem_renames_only_the_file_it_repeats(tmp_path, monkeypatch):
    """A sweep's names are its outputs' names: a new run folder whose epoch repeats an
    older run's renamed every checkpoint of the sweep (each evaluated again under its
    path name); now the two files of that stem alone change, every other keeps its name,
    and removing the new file gives the first its stem back."""
    monkeypatch.chdir(tmp_path)
    _touch(*[f"runs/a/epoch_{e}.pth" for e in (1, 2, 3, 10)], "runs/b/epoch_11.pth")
    before, _ = _sweep("runs/*/epoch_*.pth", kind="reid")
    assert before == ["epoch_1", "epoch_2", "epoch_3", "epoch_10", "epoch_11"]
    _touch("runs/b/epoch_2.pth")  # run b resumed from epoch 1: its own epoch_2
    after, expanded = _sweep("runs/*/epoch_*.pth", kind="reid")
    # among the epochs, in order of their own stems (not all path names first)
    assert after == ["epoch_1", "a-epoch_2", "b-epoch_2", "epoch_3", "epoch_10", "epoch_11"]
    assert set(before) - set(after) == {"epoch_2"}
    assert Path(expanded["run@a-epoch_2"]["options"]["checkpoint"]) == Path("runs/a/epoch_2.pth")
    assert Path(expanded["run@b-epoch_2"]["options"]["checkpoint"]) == Path("runs/b/epoch_2.pth")
    Path("runs/b/epoch_2.pth").unlink()
    assert _sweep("runs/*/epoch_*.pth", kind="reid")[0] == before


def test_a_path_name_repeating_another_files_stem_names_that_file_by_its_path(
    tmp_path, monkeypatch
):
    """Naming only a repeated stem's files by their paths could give one of them the
    stem of another file (runs/a/model.pt -> a-model beside runs/c/a-model.pt): an error
    where naming every file by its path had three names. That file is named by its path
    too; names compare as they will be, after ``=`` -> ``-`` (epoch=1 beside epoch-1 in
    other folders: their paths, not an error)."""
    monkeypatch.chdir(tmp_path)
    _touch("runs/a/model.pt", "runs/b/model.pt", "runs/c/a-model.pt", "runs/d/epoch_3.pt")
    assert _sweep("runs/*/*.pt")[0] == ["c-a-model", "epoch_3", "a-model", "b-model"]
    _touch("hf/checkpoint-500/model.safetensors", "hf/checkpoint-1000/model.safetensors")
    _touch("hf/final/checkpoint-500-model.safetensors")
    assert _sweep("hf/*/*.safetensors")[0] == [
        "final-checkpoint-500-model",
        "checkpoint-500-model",
        "checkpoint-1000-model",
    ]
    _touch("pl/a/epoch=1.ckpt", "pl/b/epoch-1.ckpt", "pl/b/epoch-2.ckpt")
    assert _sweep("pl/*/*.ckpt")[0] == ["a-epoch-1", "b-epoch-1", "epoch-2"]


@pytest.mark.parametrize(
    "files, pattern, names",
    [
        (["runs/epoch_10.pth", "runs/epoch_2.pth"], "runs/*.pth", ["epoch_2", "epoch_10"]),
        (  # in other folders, but stems of their own: the stems, not the paths
            ["runs/a/epoch_1.pth", "runs/b/epoch_2.pth"],
            "runs/*/epoch_*.pth",
            ["epoch_1", "epoch_2"],
        ),
        (["log/model.pth.tar-60", "log/model.pth.tar-5"], "log/model.pth.tar-*",
         ["model-5", "model-60"]),
        (["out/model_0059999.pth", "out/model_final.pth"], "out/*.pth",
         ["model_0059999", "model_final"]),
        (["w/v1.2+ft.onnx", "w/best.onnx"], "w/*.onnx", ["best", "v1.2+ft"]),
    ],
)  # fmt: skip
def test_a_sweep_with_distinct_stems_keeps_its_names(tmp_path, monkeypatch, files, pattern, names):
    """Existing sweeps: the same names (so the same outputs and reports) as before."""
    monkeypatch.chdir(tmp_path)
    _touch(*files)
    assert _sweep(pattern, kind="reid")[0] == names
    assert sorted(names) == sorted(pc.checkpoint_stem(f) for f in files)


def test_a_dataset_naming_a_checkpoint_by_its_file_name_is_shown_the_sweeps_name():
    config = copy.deepcopy(CONFIG)
    config["encoders"]["pl"] = {"kind": "onnx", "checkpoints": "runs/*.ckpt"}
    pc.mark_sweeps(config["encoders"])
    config["datasets"]["market"]["encoders"] = ["pl@epoch=3-step=100"]
    with pytest.raises(RankwiseError) as info:
        pc.check_config(config, SCHEMA)
    assert str(info.value).endswith(
        "letters, digits and _ . + - around one @; a sweep writes other characters as -: "
        "did you mean 'pl@epoch-3-step-100'?"
    ), info.value


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "kind, options, split, expected",
    [
        ("onnx", {"model": "m.onnx", "input_size": None}, "query", ["m.onnx"]),
        (
            "python",
            {"factory": "nets/f.py:build", "checkpoint": "w.pth"},
            "query",
            ["w.pth", "nets/f.py"],
        ),
        ("python", {"factory": "torchvision.models:resnet18", "checkpoint": None}, "query", []),
        ("precomputed", {"query": "q.npy", "gallery": "g.npy", "path": None}, "gallery", ["g.npy"]),
        ("precomputed", {"query": None, "gallery": None, "path": "all.npy"}, "query", ["all.npy"]),
        ("timm", {"checkpoint": "t.pth"}, "query", ["t.pth"]),
        ("torchscript", {"model": "s.pt"}, "query", ["s.pt"]),
        ("hog", {"size": [8, 8]}, "query", []),
    ],
)
def test_encoder_paths(kind, options, split, expected):
    assert pc.encoder_paths(kind, options, split) == expected


def test_encoder_paths_expand_home(monkeypatch, tmp_path):
    """A model under ``~``: the encode rule's input (and its hash) is the expanded path,
    as the config check and the encoders read it; Snakemake refused ``~/...`` inputs."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pc.encoder_paths("onnx", {"model": "~/m.onnx"}) == [str(tmp_path / "m.onnx")]
    assert pc.encoder_paths("python", {"factory": "~/f.py:build", "checkpoint": None}) == [
        str(tmp_path / "f.py")
    ]


def test_a_module_factory_of_the_users_own_code_is_an_encoder_file(monkeypatch, tmp_path):
    """``module:function`` found in the project folder (the encoder's fallback) or on
    PYTHONPATH: its source file is one of the encode rule's files (hashed, so editing it
    reruns encode, as editing a ``file.py:function`` factory does; it reran nothing and
    the report kept the old code's numbers). An installed module: no file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets/f.py").write_text("def build():\n    pass\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("def build():\n    pass\n")
    python = {"checkpoint": None}
    assert pc.encoder_paths("python", {**python, "factory": "nets.f:build"}) == ["nets/f.py"]
    assert pc.encoder_paths("python", {**python, "factory": "pkg:build"}) == ["pkg/__init__.py"]
    assert pc.encoder_paths("python", {**python, "factory": "json:loads"}) == []
    (tmp_path / "elsewhere/lib").mkdir(parents=True)
    (tmp_path / "elsewhere/lib/m.py").write_text("def build():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    assert pc.encoder_paths("python", {**python, "factory": "lib.m:build"}) == [
        str(tmp_path / "elsewhere/lib/m.py")
    ]


def test_encode_params_of_reid_and_timm_entries_are_those_of_before_the_later_options():
    """Byte for byte the encode params of a reid / timm entry written before
    ``checkpoint_key`` and reid's ``interpolation`` existed (strings copied from that
    version's output): upgrading reruns no encode job; set, an option is there."""
    import json

    from rankwise.encoders import OPTIONS

    reid = OPTIONS["reid"].check({"architecture": "osnet_x1_0", "checkpoint": "w.pth"})
    assert pc.encoder_options(reid) == (
        '{"architecture": "osnet_x1_0", "checkpoint": "w.pth", "device": "auto", "flip": '
        'false, "half": false, "input_size": null}'
    )
    bicubic = json.loads(pc.encoder_options({**reid, "interpolation": "bicubic"}))
    assert bicubic["interpolation"] == "bicubic"
    timm = OPTIONS["timm"].check({"model": "resnet18", "checkpoint": "w.pth"})
    assert json.loads(pc.encoder_options(timm))["interpolation"] == "bilinear"


def test_encode_params_leave_out_checkpoint_key_when_unset():
    """The encode rule's ``--options`` (a param: a change reruns encode): with
    ``checkpoint_key: null`` (what validate() fills in) they are, byte for byte, those of
    a config from before the option existed, so upgrading reruns nothing; set, it is
    there."""
    import json

    from rankwise.encoders import OPTIONS

    for kind, required in (("timm", {"model": "resnet50"}), ("reid", {"architecture": "a"})):
        options = OPTIONS[kind].check({**required, "checkpoint": "w.pth"})
        assert options["checkpoint_key"] is None
        later = ("checkpoint_key", "interpolation" if kind == "reid" else "")
        before = {k: v for k, v in options.items() if k not in later}
        assert pc.encoder_options(options) == json.dumps(before, sort_keys=True)
        ema = json.loads(pc.encoder_options({**options, "checkpoint_key": "model_ema"}))
        assert ema == {**before, "checkpoint_key": "model_ema"}
    pixels = OPTIONS["pixels"].check({})
    assert pc.encoder_options(pixels) == json.dumps(pixels, sort_keys=True)


def test_unrecorded_encoder_options_are_every_kinds_and_need_no_encoder_import():
    """The pipeline's list of options left out at their default is every kind's
    ``record_default=False`` option, and reading it imports no encoder module: the encode
    params are computed in every Snakemake run (importing rankwise.encoders there, with
    numpy, PIL and pandas, took ~0.3 s)."""
    import subprocess
    import sys

    from rankwise.encoders import OPTIONS
    from rankwise.options import UNRECORDED_ENCODER_OPTIONS

    later = {o.name: o for spec in OPTIONS.values() for o in spec.options if not o.record_default}
    assert later == {o.name: o for o in UNRECORDED_ENCODER_OPTIONS}
    probe = (
        "import sys; from rankwise import pipeline_config as pc; "
        "print(pc.encoder_options({'model': 'm', 'checkpoint_key': None})); "
        "print(sorted(m for m in ('rankwise.encoders', 'numpy', 'pandas', 'PIL') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ['{"model": "m"}', "[]"], out.stdout


def _resolved(datasets, encoders):
    config = {"datasets": datasets, "encoders": encoders}
    for dataset in datasets.values():
        dataset.setdefault("encoders", None)
    return pc.resolve(config)


@pytest.mark.parametrize(
    "dataset, encoder, message",
    [
        (
            {"loader": "market1501", "options": {"root": "data/Market"}},
            None,
            "datasets.d.options.root: folder data/Market not found",
        ),
        (
            {"loader": "manifest", "options": {"query": "q.csv", "gallery": "g.csv"}},
            None,
            "datasets.d.options.query: file q.csv not found",
        ),
        (
            {"loader": "folder", "options": {"query_dir": "q", "gallery_dir": "g", "root": None}},
            None,
            "datasets.d.options.query_dir: folder q not found",
        ),
        (
            None,
            {"kind": "onnx", "options": {"model": "runs/epoch_3.onnx"}},
            "encoders.e.options.model: runs/epoch_3.onnx not found",
        ),
        (
            None,
            {
                "kind": "precomputed",
                "options": {"query": "emb/q.npy", "gallery": "g.npy", "path": None},
            },
            "encoders.e.options.query: emb/q.npy not found",
        ),
        (
            None,
            {"kind": "python", "options": {"factory": "nets/model.py:build", "checkpoint": None}},
            "encoders.e.options.factory: nets/model.py not found",
        ),
        (
            None,
            {"kind": "python", "options": {"factory": "m:f", "checkpoint": "w.pth"}},
            "encoders.e.options.checkpoint: w.pth not found",
        ),
    ],
)
def test_a_missing_path_is_an_error_naming_entry_and_path(
    tmp_path, monkeypatch, dataset, encoder, message
):
    monkeypatch.chdir(tmp_path)
    datasets = {"d": dataset or {"loader": "digits", "options": {}}}
    encoders = {"e": encoder or {"kind": "hog", "options": {}}}
    with pytest.raises(RankwiseError, match="^" + message) as info:
        _resolved(datasets, encoders)
    assert f"relative paths start from {tmp_path}" in str(info.value)


@pytest.mark.parametrize(
    "kind, options",
    [
        ("timm", {"model": "resnet50", "checkpoint": "hf/checkpoint-500"}),
        ("onnx", {"model": "hf/checkpoint-500"}),
        (
            "precomputed",
            {"query": "emb.zarr", "gallery": "emb.zarr", "query_ids": "hf/checkpoint-500"},
        ),
    ],
)
def test_a_folder_where_a_file_belongs_is_an_error_before_any_job(
    tmp_path, monkeypatch, kind, options
):
    """It exists, so the check passed it, and the encode job then failed saying the file
    was "not found"; a precomputed Zarr folder stays accepted."""
    monkeypatch.chdir(tmp_path)
    _touch("hf/checkpoint-500/model.safetensors", "hf/checkpoint-500/trainer_state.json")
    Path("emb.zarr").mkdir()
    key = next(k for k, v in options.items() if v == "hf/checkpoint-500")
    with pytest.raises(RankwiseError) as info:
        _resolved(
            {"d": {"loader": "digits", "options": {}}}, {"e": {"kind": kind, "options": options}}
        )
    assert str(info.value) == (
        f"encoders.e.options.{key}: hf/checkpoint-500 is a folder, not a file; name the file "
        "itself: hf/checkpoint-500/model.safetensors"
    )
    if kind == "precomputed":
        _touch("ids.txt")
        _resolved(
            {"d": {"loader": "digits", "options": {}}},
            {"e": {"kind": kind, "options": {**options, "query_ids": "ids.txt"}}},
        )


LONG = "".join("abcdefghijklmnopqrstuvwxyz"[(i * i) % 26] for i in range(201))  # not periodic


@pytest.mark.parametrize(
    "section, name, message",
    [
        ("encoders", LONG, r"^encoders\.[a-z]+: name is 201 characters long; at most 200"),
        ("datasets", LONG, r"^datasets\.[a-z]+: name is 201 characters long"),
        ("encoders", "e" * 20, r"^encoders\.e+: name ends in 'e+' repeated \d+ times"),
        ("datasets", "run-" + "ab" * 20, r"^datasets\.run-(ab)+: name ends in 'ab' repeated 20"),
    ],
)
def test_names_the_jobs_could_not_use_are_refused(section, name, message):
    """A name beyond a file name's length failed at the rank job ("File name too long")
    after prepare and encode had run; a periodic one met Snakemake's multi-line
    PeriodicWildcardError."""
    dataset, encoder = {"loader": "digits", "options": {}}, {"kind": "hog", "options": {}}
    datasets = {name if section == "datasets" else "d": dataset}
    encoders = {name if section == "encoders" else "e": encoder}
    with pytest.raises(RankwiseError, match=message):
        _resolved(datasets, encoders)
    # at the limits: accepted
    _resolved({LONG[:200]: dict(dataset)}, {"e" * 19: dict(encoder), "run-" + "ab" * 19: encoder})


def test_a_sweeps_long_checkpoint_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch(f"runs/{'epoch' * 40}.pt")
    options = {"factory": "m:f", "checkpoint": pc.SWEEP_PLACEHOLDER}
    encoders = {"run": {"kind": "python", "checkpoints": "runs/*.pt", "options": options}}
    with pytest.raises(RankwiseError, match=r"^encoders\.run: name \(the checkpoint run@epoch"):
        _resolved({"d": {"loader": "digits", "options": {}}}, encoders)


@pytest.mark.parametrize("path", ["feat{x}/q.npy", "runs/exp}1/q.npy"])
def test_a_path_with_braces_is_refused_not_read_as_wildcards(tmp_path, monkeypatch, path):
    """Snakemake reads braces in the encode rule's input paths as wildcards (its
    WildcardError, doubled braces too): refused in one line naming the entry."""
    monkeypatch.chdir(tmp_path)
    _touch(path)
    encoder = {"kind": "precomputed", "options": {"query": path, "gallery": path, "path": None}}
    with pytest.raises(RankwiseError, match=r"^encoders\.e\.options\.query: .*braces"):
        _resolved({"d": {"loader": "digits", "options": {}}}, {"e": encoder})


@pytest.mark.parametrize(
    "source, factory, message",
    [
        (
            "def make():\n    pass\n",
            "nets.py:mkae",
            r"nets\.py defines no 'mkae'; did you mean 'make'",
        ),
        ("def make(:\n", "nets.py:make", r"nets\.py:1: Python syntax error"),
        ("import os\nmake = os.path.join\n", "nets.py:make", None),
        ("from torch import *\n", "nets.py:anything", None),  # cannot tell: the job will
        ("if True:\n    def make(): pass\n", "nets.py:make", None),
        ("class Make:\n    pass\n", "nets.py:Make", None),
    ],
)
def test_a_factory_file_is_read_for_its_function(tmp_path, monkeypatch, source, factory, message):
    """A typo'd function name fails before any job (not in the encode job after prepare);
    the file is parsed, never imported."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(source)
    datasets = {"d": {"loader": "digits", "options": {}}}
    encoders = {"e": {"kind": "python", "options": {"factory": factory, "checkpoint": None}}}
    if message is None:
        assert list(_resolved(datasets, encoders)[0]) == ["e"]
    else:
        with pytest.raises(RankwiseError, match=r"^encoders\.e\.options\.factory: " + message):
            _resolved(datasets, encoders)


def test_existing_paths_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch("q.csv", "g.csv", "m.onnx", "emb/q.npy", "emb/g.zarr/zarr.json")
    encoders, sweeps = _resolved(
        {"d": {"loader": "manifest", "options": {"query": "q.csv", "gallery": "g.csv"}}},
        {
            "e": {"kind": "onnx", "options": {"model": "m.onnx"}},
            "p": {
                "kind": "precomputed",
                "options": {"query": "emb/q.npy", "gallery": "emb/g.zarr", "path": None},
            },
        },
    )
    assert list(encoders) == ["e", "p"] and sweeps == {}


def test_a_missing_image_of_a_manifest_dataset_is_named_in_the_users_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("data").mkdir()
    Path("data/q.csv").write_text("id,label,path\nq0,a,img/0.png\n")
    Path("data/g.csv").write_text(
        "id,label,path\ng1,a,img/1.png\ng2,b,img/2.png\ng3,b,/nowhere/3.png\n"
    )
    _touch("data/img/0.png", "data/img/1.png", "q.npy", "g.npy")
    options = {"query": "data/q.csv", "gallery": "data/g.csv"}
    encoders = {
        "e": {"kind": "hog", "options": {}},
        "p": {"kind": "precomputed", "options": {"query": "q.npy", "gallery": "g.npy"}},
    }
    with pytest.raises(RankwiseError) as info:
        _resolved({"d": {"loader": "manifest", "options": options}}, copy.deepcopy(encoders))
    assert str(info.value) == (
        "datasets.d.options.gallery: data/g.csv: row 3 (id 'g2'): image 'img/2.png' not found "
        "(looked for data/img/2.png) (1 more row too); fix the 'path' column or restore the file"
    )
    # features computed elsewhere read no image: the dataset's own encoders decide
    only = {"loader": "manifest", "options": options, "encoders": ["p"]}
    resolved, _ = _resolved({"d": only}, copy.deepcopy(encoders))
    assert list(resolved) == ["e", "p"]


# ---------------------------------------------------------------- fingerprints


def _image(path: Path, value: int = 0, size: int = 4) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes([value]) * size)


def _market(root: Path) -> None:
    _image(root / "query" / "0001_c1s1_000010_00.jpg")
    _image(root / "bounding_box_test" / "0001_c2s1_000020_00.jpg")
    _image(root / "bounding_box_test" / "0002_c2s1_000030_00.jpg")


def test_manifest_paths_of_links_equal_realpath(tmp_path, monkeypatch):
    """A fingerprint's path of a file (:class:`pc._ManifestPaths`) is the file's realpath
    relative to the manifests' real folder, as prepare writes it; a linked file is read
    through its link's target and a cached realpath of the target's folder (a faster
    road, not another answer): relative and absolute targets, targets through linked
    folders and ``..`` (links resolved first, as realpath does), chains of links, links
    reached through a linked folder, manifests in a linked folder."""
    monkeypatch.chdir(tmp_path)
    _touch("real/a/x.png", "real/b/y.png", "real/x.png")
    os.symlink("real/a", "linkdir")
    os.symlink("linkdir/..", "up")  # linkdir/.. is real/, not the project folder
    os.makedirs("links")
    targets = {
        "rel.png": "../real/a/x.png",
        "abs.png": str(tmp_path / "real/b/y.png"),
        "chain.png": "rel.png",
        "chain2.png": "chain.png",
        "viadir.png": "../linkdir/x.png",
        "dotdot.png": "../linkdir/../b/y.png",
        "viaup.png": "../up/x.png",
        "dot.png": "./../real/./a/x.png",
    }
    for name, target in targets.items():
        os.symlink(target, f"links/{name}")
    os.symlink("links", "linklinks")
    os.makedirs("results/real-manifests")
    os.symlink("real-manifests", "results/manifests")
    files = [f"links/{n}" for n in targets] + [f"linklinks/{n}" for n in targets]
    files += ["real/a/x.png", "linkdir/x.png", "up/x.png", str(tmp_path / "linkdir/x.png")]
    for manifests in ("results/manifests", "elsewhere/deeper", str(tmp_path)):
        paths = pc._ManifestPaths(manifests)
        base = os.path.realpath(manifests)
        for file in files:
            want = os.path.relpath(os.path.realpath(file), base)
            assert paths(file, os.path.islink(file)) == want, (manifests, file)
    assert os.path.realpath("links/dotdot.png") == str(tmp_path / "real/b/y.png")


def test_an_absolute_manifest_path_counts_by_its_real_path_wherever_the_manifests_are(
    tmp_path, monkeypatch
):
    """A CSV's absolute image path is kept as written by prepare: the fingerprint holds
    its real path, so the manifests' folder (a project moved to another depth) changes
    nothing, and a link on the way pointed at a copy with the same names, sizes and
    mtimes changes it."""
    import shutil

    monkeypatch.chdir(tmp_path)
    _touch("data/v1/a.png")
    shutil.copytree("data/v1", "data/v2", copy_function=shutil.copy2)
    os.symlink("v1", "data/img")
    Path("q.csv").write_text(f"id,label,path\nq0,a,{tmp_path / 'data/img/a.png'}\n")
    options = {"query": "q.csv", "gallery": "q.csv"}
    here = pc.dataset_fingerprints("manifest", options, manifests="results/manifests/d")
    deeper = pc.dataset_fingerprints("manifest", options, manifests="x/y/results/manifests/d")
    assert here == deeper
    os.unlink("data/img")
    os.symlink("v2", "data/img")
    after = pc.dataset_fingerprints("manifest", options, manifests="results/manifests/d")
    assert after["query"] != here["query"]


def test_market_fingerprint_follows_each_splits_folder(tmp_path):
    _market(tmp_path)
    options = {
        "root": str(tmp_path),
        "query_folder": "query",
        "gallery_folder": "bounding_box_test",
    }
    first = pc.dataset_fingerprints("market1501", options)
    assert pc.dataset_fingerprints("market1501", options) == first  # untouched: same
    (tmp_path / "bounding_box_test" / "notes.txt").write_text("not an image")
    assert pc.dataset_fingerprints("market1501", options) == first
    _image(tmp_path / "bounding_box_test" / "0003_c1s1_000040_00.jpg")  # added
    added = pc.dataset_fingerprints("market1501", options)
    assert added["query"] == first["query"] and added["gallery"] != first["gallery"]
    _image(tmp_path / "query" / "0001_c1s1_000010_00.jpg", size=5)  # rewritten, same name
    rewritten = pc.dataset_fingerprints("market1501", options)
    assert rewritten["query"] != added["query"] and rewritten["gallery"] == added["gallery"]


def test_fingerprint_uses_mtime_not_bytes_for_images(tmp_path):
    _market(tmp_path)
    options = {"root": str(tmp_path)}
    first = pc.dataset_fingerprints("market1501", options)
    image = tmp_path / "query" / "0001_c1s1_000010_00.jpg"
    stamp = image.stat().st_mtime_ns + 10**9
    os.utime(image, ns=(stamp, stamp))
    assert pc.dataset_fingerprints("market1501", options)["query"] != first["query"]


def test_manifest_fingerprint_follows_the_csv_and_its_images(tmp_path):
    _image(tmp_path / "img" / "a.png")
    _image(tmp_path / "img" / "b.png")
    query, gallery = tmp_path / "q.csv", tmp_path / "g.csv"
    query.write_text("id,label,path\nq1,1,img/a.png\n")
    gallery.write_text("id,label,path\ng1,1,img/b.png\ng2,2,\n")
    options = {"query": str(query), "gallery": str(gallery)}
    first = pc.dataset_fingerprints("manifest", options)
    assert pc.dataset_fingerprints("manifest", options) == first
    gallery.write_text("id,label,path\ng1,2,img/b.png\ng2,2,\n")  # a label edited
    edited = pc.dataset_fingerprints("manifest", options)
    assert edited["gallery"] != first["gallery"] and edited["query"] == first["query"]
    _image(tmp_path / "img" / "a.png", value=9, size=6)  # new bytes, same name
    assert pc.dataset_fingerprints("manifest", options)["query"] != edited["query"]


def test_manifest_fingerprint_past_the_csv_modules_field_limit(tmp_path):
    """A `text` value over the csv module's 128 KiB limit, and a stray quote (the rest of
    the file one field): no traceback while Snakemake builds the DAG, and the images of
    the manifest still count (editing one reruns encode); prepare names a broken file."""
    _image(tmp_path / "img" / "a.png")
    query = tmp_path / "q.csv"
    query.write_text(f"id,label,text,path\nq1,1,{'x' * 200_000},img/a.png\n")
    options = {"query": str(query), "gallery": str(query)}
    first = pc.dataset_fingerprints("manifest", options)
    _image(tmp_path / "img" / "a.png", value=9, size=6)
    assert pc.dataset_fingerprints("manifest", options)["query"] != first["query"]
    rows = ["id,label,path"] + [f"q{i},{i % 10},img/{i}.png" for i in range(20_000)]
    rows[3] = 'q2,"7,img/2.png'
    query.write_text("\n".join(rows) + "\n")
    broken = pc.dataset_fingerprints("manifest", options)
    query.write_text("\n".join(rows[:-1]) + "\n")
    assert pc.dataset_fingerprints("manifest", options) != broken


def test_folder_fingerprint_is_recursive(tmp_path):
    _image(tmp_path / "cat" / "1.png")
    _image(tmp_path / "dog" / "sub" / "2.png")
    options = {"root": str(tmp_path), "query_dir": None, "gallery_dir": None}
    first = pc.dataset_fingerprints("folder", options)
    assert first["query"] == first["gallery"]  # one tree, split by the loader
    _image(tmp_path / "dog" / "sub" / "3.png")
    assert pc.dataset_fingerprints("folder", options) != first


def test_msmt17_fingerprint_follows_list_and_listed_images(tmp_path):
    for name in (
        "0000/0000_000_01_0303morning_0015_0.jpg",
        "0001/0001_000_02_0303morning_0016_0.jpg",
    ):
        _image(tmp_path / "test" / name)
    (tmp_path / "list_query.txt").write_text("0000/0000_000_01_0303morning_0015_0.jpg 0\n")
    (tmp_path / "list_gallery.txt").write_text("0001/0001_000_02_0303morning_0016_0.jpg 1\n")
    options = {"root": str(tmp_path), "images": "auto"}
    first = pc.dataset_fingerprints("msmt17", options)
    _image(tmp_path / "test" / "0001/0001_000_02_0303morning_0016_0.jpg", size=8)
    second = pc.dataset_fingerprints("msmt17", options)
    assert second["query"] == first["query"] and second["gallery"] != first["gallery"]


def test_generated_demo_data_is_fingerprinted_by_its_loader_and_options():
    """Generated data depend on nothing else: the same options, the same digest (no
    rerun), in any key order; another option value or loader, another digest."""
    seed0 = pc.dataset_fingerprints("demo-market", {"seed": 0, "noise": 0.1})
    assert seed0 == pc.dataset_fingerprints("demo-market", {"noise": 0.1, "seed": 0})
    assert seed0["query"] == seed0["gallery"] and seed0["query"].startswith("generated:")
    others = [
        pc.dataset_fingerprints("demo-market", {"seed": 1, "noise": 0.1}),
        pc.dataset_fingerprints("demo-market", {"seed": 0, "noise": 0.9}),
        pc.dataset_fingerprints("demo-progressive", {"seed": 0, "noise": 0.1}),
    ]
    assert len({f["query"] for f in [seed0, *others]}) == 4


@pytest.mark.parametrize(
    "name, stem",
    [
        ("runs/r50/epoch_60.pth", "epoch_60"),
        ("log/osnet/model/model.pth.tar-60", "model-60"),  # torchreid's per-epoch files
        ("log/osnet/model/model.pth.tar", "model"),
        ("output/model_0059999.pth", "model_0059999"),  # fast-reid
        ("exports/epoch_2.onnx", "epoch_2"),
        ("w/epoch_3.safetensors", "epoch_3"),
        ("w/notes.v2.txt", "notes.v2"),
    ],
)
def test_checkpoint_stem(name, stem):
    from rankwise.pipeline_config import checkpoint_stem

    assert checkpoint_stem(name) == stem


def test_torchreid_epochs_sweep_in_natural_order(tmp_path, monkeypatch):
    from rankwise.pipeline_config import expand_checkpoints

    for epoch in (10, 2, 60):
        (tmp_path / f"model.pth.tar-{epoch}").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    expanded, sweeps = expand_checkpoints(
        {
            "osnet": {
                "kind": "reid",
                "checkpoints": "model.pth.tar-*",
                "options": {"architecture": "osnet_x1_0"},
            }
        }
    )
    assert sweeps["osnet"] == ["osnet@model-2", "osnet@model-10", "osnet@model-60"]
    assert expanded["osnet@model-60"]["options"] == {
        "architecture": "osnet_x1_0",
        "checkpoint": "model.pth.tar-60",
    }


@pytest.mark.parametrize(
    "section, value, expected",
    [
        ("encoders", ["pixels"], "config: encoders: expected object, got ['pixels']"),
        ("datasets", ["market", "digits"], "config: datasets: expected object, got"),
        ("datasets", 5, "config: datasets: expected object, got 5"),
        ("encoders", "pixels", "config: encoders: expected object, got 'pixels'"),
    ],
)
def test_sections_that_are_not_mappings_are_one_line(section, value, expected):
    """``encoders: [pixels]`` (a dataset's list form, one level up) crashed with an
    AttributeError before the schema check could name it."""
    config = copy.deepcopy(CONFIG)
    config[section] = value
    with pytest.raises(RankwiseError) as info:
        pc.check(config, ROOT / "config" / "schema.yaml")
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"path": "g.npy"},
            r"encoders\.e\.options\.path: one file for both splits.*query and gallery",
        ),
        (
            {"query": "q.npy", "gallery": "g.npy", "ids": "ids.txt"},
            r"encoders\.e\.options\.ids: one file for both splits.*query_ids and gallery_ids",
        ),
        (
            {"query": "q.npy", "gallery": "g.npy", "split": "query"},
            r"encoders\.e\.options\.split: 'query': the pipeline encodes both splits",
        ),
        ({"query": "q.npy"}, r"encoders\.e\.options: missing gallery: the pipeline encodes"),
        (
            # ids for one split only: it failed in the gallery's encode job
            {"query": "q.npy", "gallery": "g.npy", "query_ids": "ids.txt", "on_missing": "drop"},
            r"encoders\.e\.options\.gallery_ids: missing: on_missing: drop matches the "
            r"gallery rows by id, and g\.npy is a file without ids; give options gallery_ids",
        ),
    ],
)
def test_a_precomputed_entry_names_a_file_per_split(tmp_path, monkeypatch, options, message):
    """The pipeline encodes both splits from one entry's options: ``path`` gave the
    query and the gallery the same rows, ``split: query`` ranked the query against
    itself (recall@1 100, exit 0)."""
    monkeypatch.chdir(tmp_path)
    for name in ("q.npy", "g.npy", "ids.txt"):
        _touch(name)
    dataset = {"loader": "digits", "options": {}}
    with pytest.raises(RankwiseError, match="^" + message):
        _resolved({"d": dataset}, {"e": {"kind": "precomputed", "options": options}})
    # one file per split: accepted; so are ids for both, or a Zarr group (its 'ids')
    good = {"query": "q.npy", "gallery": "g.npy", "split": "auto"}
    _resolved({"d": dataset}, {"e": {"kind": "precomputed", "options": good}})
    (tmp_path / "g.zarr").mkdir()
    for gallery in ({"gallery_ids": "ids.txt"}, {"gallery": "g.zarr"}):
        keyed = {**good, "query_ids": "ids.txt", "on_missing": "drop", **gallery}
        _resolved({"d": dataset}, {"e": {"kind": "precomputed", "options": keyed}})


@pytest.mark.parametrize("label", ["a,b", ","])
def test_a_junk_label_with_a_comma_is_refused(label):
    """The jobs read ``--junk-labels a,b`` as two labels."""
    datasets = {"d": {"loader": "digits", "options": {}, "junk_labels": ["-1", label]}}
    with pytest.raises(RankwiseError, match=r"^datasets\.d\.junk_labels\[1\]: .* holds a comma"):
        _resolved(datasets, {"e": {"kind": "hog", "options": {}}})


@pytest.mark.parametrize("written, number", [("010", 8), ("0x1F", 31), ("1_0", 10), ("+5", 5)])
def test_a_junk_label_yaml_reads_as_another_number_is_refused(tmp_path, written, number):
    """YAML 1.1 reads an unquoted ``010`` as octal 8: labels compare as strings, so the
    dataset's label ``8`` was junked (and ``010`` kept), exit 0."""
    file = tmp_path / "my.yaml"
    file.write_text(f"datasets:\n  d:\n    junk_labels: [-1, {written}]\n")
    datasets = {"d": {"loader": "digits", "options": {}, "junk_labels": [-1, number]}}
    config = {"datasets": datasets, "encoders": {"e": {"kind": "hog", "options": {}}}}
    datasets["d"]["encoders"] = None
    with pytest.raises(
        RankwiseError,
        match=rf"my\.yaml:3: datasets\.d\.junk_labels\[1\]: "
        rf"{re.escape(written)} is read by YAML as the number {number}.*quote it",
    ):
        pc.resolve(config, [file])
    # written as the number it is (and quoted text): accepted
    file.write_text(f"datasets:\n  d:\n    junk_labels: [-1, {number}, '{written}']\n")
    datasets["d"]["junk_labels"] = [-1, number, written]
    pc.resolve(config, [file])


@pytest.mark.parametrize(
    "protocol, option, value, takers",
    [
        # each is left out of the jobs (plain numbers), where the CLI refuses it: said
        ("recall", "multi_query", "mean", "reid"),
        ("recall", "single_gallery_shot", True, "reid"),
        ("recall", "junk_labels", ["5"], "reid"),
        ("recall", "exclude_same_camera", False, "reid"),
        ("reassociation", "multi_query", "max", "reid"),
        ("reid", "gap_frames", 30, "reassociation"),
        ("reid", "query_stride", 2, "reassociation"),
        ("recall", "drop_junk", True, "reid"),
    ],
)
def test_an_option_the_protocol_does_not_take_is_named_in_a_note(
    protocol, option, value, takers, capsys
):
    datasets = {"d": {"loader": "digits", "options": {}, "protocol": protocol, option: value}}
    _resolved(datasets, {"e": {"kind": "hog", "options": {}}})
    assert capsys.readouterr().err == (
        f"note: config: datasets.d.{option}: applies to protocol {takers} only, not "
        f"'{protocol}': ignored (set protocol: {takers} to use it, or remove it)\n"
    )


@pytest.mark.parametrize(
    "protocol, options",
    [
        # defaults (the schema fills them in for every dataset), YAML integers as labels
        ("recall", {"junk_labels": [-1], "exclude_same_camera": True, "multi_query": "none"}),
        ("reassociation", {"single_gallery_shot": False, "drop_junk": False}),
        # waiting for another option of the dataset's own protocol (README)
        ("reid", {"shot_seed": 5, "shot_repeats": 3, "single_gallery_shot": False}),
        ("reid", {"drop_junk": True}),
    ],
)
def test_defaults_and_waiting_options_get_no_note(protocol, options, capsys):
    datasets = {"d": {"loader": "digits", "options": {}, "protocol": protocol, **options}}
    _resolved(datasets, {"e": {"kind": "hog", "options": {}}})
    assert capsys.readouterr().err == ""
