"""The options layer: one spec per option, read by the library, the CLI and the schema.

- config/schema.yaml holds every generated fragment verbatim (whole fragments compared);
- the library check and the schema agree on every probe value, for every option;
- library messages name the parameter, the CLI's name the flag;
- packaging: the extras and the conda environment match what the code imports.
"""

from __future__ import annotations

import json
import re
import tomllib

import click
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from helpers import ROOT, run_rankwise
from jsonschema import Draft202012Validator

from rankwise import datasets, demo, encoders, options
from rankwise.errors import RankwiseError
from rankwise.options import Option, OptionSet

SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
FRAGMENTS = options.schema_fragments()


def _at(node, path):
    for key in path:
        node = node[key]
    return node


# ---------------------------------------------------------------- the schema file


@pytest.mark.parametrize("path", list(FRAGMENTS), ids=[".".join(p) for p in FRAGMENTS])
def test_schema_holds_the_generated_fragment(path):
    assert _at(SCHEMA, path) == FRAGMENTS[path], (
        f"config/schema.yaml: {'.'.join(path)} differs from the option specs; paste the "
        "fragment printed by `python -m rankwise.options --schema`"
    )


def test_every_loader_and_kind_has_its_fragment():
    defs = SCHEMA["$defs"]
    assert sorted(k for k in defs if k.startswith("loader_")) == sorted(
        "loader_" + n.replace("-", "_") for n in datasets.LOADERS
    )
    assert sorted(k for k in defs if k.startswith("encoder_")) == sorted(
        "encoder_" + n.replace("-", "_") for n in encoders.OPTIONS
    )


def test_generator_prints_what_the_schema_holds(capsys):
    assert options._main(["--check", str(ROOT / "config" / "schema.yaml")]) == 0
    assert options._main(["--schema"]) == 0
    printed = capsys.readouterr().out
    blocks = re.split(r"^# (\S+)\n", printed, flags=re.M)[1:]
    assert len(blocks) == 2 * len(FRAGMENTS)
    for dotted, text in zip(blocks[::2], blocks[1::2], strict=True):
        path = next(p for p in FRAGMENTS if ".".join(p) == dotted)
        assert yaml.safe_load(text) == {path[-1]: FRAGMENTS[path]}


def test_check_names_a_drifted_fragment(tmp_path):
    drifted = json.loads(json.dumps(SCHEMA))
    drifted["$defs"]["loader_demo_market"]["properties"]["height"]["minimum"] = 8
    drifted["properties"]["engine"]["properties"]["query_block"]["default"] = 512
    assert options.schema_differences(drifted) == [
        "properties.engine.properties",
        "$defs.loader_demo_market",
    ]


# ---------------------------------------------------------------- check == schema


def _all_options() -> list[tuple[str, Option]]:
    found = [(f"options.{name}", o) for name, o in vars(options).items() if isinstance(o, Option)]
    for owner, sets in (
        ("loader", {n: loader.options for n, loader in datasets.LOADERS.items()}),
        ("encoder", encoders.OPTIONS),
    ):
        for name, option_set in sets.items():
            found += [(f"{owner} {name}.{o.name}", o) for o in option_set.options]
    return found


ALL = _all_options()
PROBES = [
    None,
    True,
    False,
    -2,
    -1,
    0,
    1,
    2,
    7,
    8,
    15,
    16,
    20,
    21,
    256,
    257,
    1501,
    1502,
    0.5,
    0.95,
    1.5,
    -0.5,
    1e-9,
    "x",
    "",
    "auto",
    "rgb",
    "nchw",
    "query",
    "recall",
    "standard",
    "best",
    "cosine",
    [],
    [1, 2],
    [0, 2],
    [2, 0],
    [16, 16],
    [1, 5, 10],
    [1, 2, 3],
    ["-1"],
    ["-1", 0],
    [0.1, 0.2, 0.3],
    [0.0, 0.2, 0.3],
    [1, 2, 3, 4],
    {},
    {"a": 1},
]


def _schema_accepts(option: Option, value) -> bool:
    node = {**option.schema(), "$defs": {"size": SCHEMA["$defs"]["size"]}}
    return Draft202012Validator(node).is_valid(value)


def _check_accepts(option: Option, value) -> bool:
    try:
        option.check(value)
    except RankwiseError:
        return False
    return True


@pytest.mark.parametrize("where, option", ALL, ids=[w for w, _ in ALL])
def test_library_check_and_schema_agree(where, option):
    probes = PROBES + list(option.choices) + [options._json_value(option.default)]
    if option.kind in ("cutoffs", "labels", "record"):  # the command line's "1,5,10" form
        probes = [p for p in probes if not isinstance(p, str)]
    if option.kind == "cutoffs":  # the library collapses repeated cutoffs; the config
        probes = [
            p
            for p in probes  # refuses them (uniqueItems): the one difference
            if not (isinstance(p, list) and len(set(map(repr, p))) < len(p))
        ]
    for value in probes:
        if value is None and option.required:
            continue  # a required key is never null; OptionSet reports it missing
        assert _check_accepts(option, value) == _schema_accepts(option, value), (
            f"{where}: check and schema disagree on {value!r}"
        )


@pytest.mark.parametrize("where, option", ALL, ids=[w for w, _ in ALL])
def test_default_passes_its_own_check(where, option):
    if not option.required:
        option.check(option.default)
        assert _schema_accepts(option, json.loads(json.dumps(options._json_value(option.default))))


def test_defaults_dicts_derive_from_the_specs():
    assert demo.DEFAULTS["demo-market"]["height"] == 64
    assert demo.OPTIONS["demo-market"]["height"].minimum == 16  # the schema's bound
    for loader in datasets.LOADERS.values():
        assert loader.defaults == loader.options.defaults
    for kind, spec in encoders.OPTIONS.items():
        assert encoders.DEFAULTS[kind] == spec.defaults
        assert encoders.REQUIRED[kind] == spec.required


# ---------------------------------------------------------------- messages

BAD = [  # (option, bad value, expected wording after "<label> ")
    (options.QUERY_BLOCK, 0, "must be a positive integer, got 0"),
    (options.GALLERY_CHUNK, -3, "must be a positive integer, got -3"),
    (options.GAP_FRAMES, 0, "must be an integer in 1..2147483647, got 0"),
    (options.SEED, -1, "must be a non-negative integer, got -1"),
    (options.CONFIDENCE, 1.5, "must be between 0 and 1 (exclusive), got 1.5"),
    (options.EXACT_MAX, 21, "must be an integer in 0..20, got 21"),
    (options.TOP_K, 0, "must be at least 1, got 0"),
    (options.BY, "person", "must be one of query, identity, got 'person'"),
    (options.MEMORY_LIMIT, float("nan"), "must be a positive number of MB, got nan"),
    (
        options.KS,
        "1,0",
        "must be positive integers separated by commas (e.g. 1,5,10); got '0' in '1,0'",
    ),
]


@pytest.mark.parametrize("option, value, wording", BAD, ids=[b[0].name for b in BAD])
def test_library_names_the_parameter_cli_names_the_flag(option, value, wording):
    with pytest.raises(RankwiseError) as library:
        option.check(value)
    assert str(library.value) == f"{option.name} {wording}"

    @click.command()
    @option.click()
    def command(**kw):
        click.echo(repr(kw))

    from rankwise.cli import _Group

    group = _Group(commands={"c": command})
    result = CliRunner().invoke(group, ["c", option.flag, str(value)])
    assert result.exit_code == 2
    assert result.output == f"error: {option.flag} {wording}\n"


def test_evaluate_names_the_parameter(tmp_path):
    import numpy as np

    import rankwise

    (tmp_path / "q.csv").write_text("id,label\nq0,a\n")
    (tmp_path / "g.csv").write_text("id,label\ng0,a\ng1,b\n")
    np.save(tmp_path / "q.npy", np.eye(2, dtype=np.float32)[:1])
    np.save(tmp_path / "g.npy", np.eye(2, dtype=np.float32))
    args = [tmp_path / f for f in ("q.csv", "g.csv", "q.npy", "g.npy")]
    for kw, message in [
        ({"query_block": 0}, "query_block must be a positive integer, got 0"),
        ({"gallery_chunk": 0}, "gallery_chunk must be a positive integer"),
        ({"workers": 0}, "workers must be a positive integer"),
        ({"distance": "cosin"}, "unknown distance 'cosin'; valid distances"),
        ({"memory_limit_mb": -1.0}, "memory_limit_mb must be a positive"),
    ]:
        # (rank: api.evaluate does not pass memory_limit_mb on; reported to the lead)
        with pytest.raises(RankwiseError, match=re.escape(message)) as error:
            rankwise.rank(*args, **kw)
        assert "--" not in str(error.value)
    assert rankwise.evaluate(*args).metrics["recall@1"] == 100.0


def test_option_set_messages():
    spec = demo.OPTIONS["demo-market"]
    with pytest.raises(
        RankwiseError,
        match=r"^demo-market: option height must be an integer "
        r">= 16, got 8$",
    ):
        spec.check({"height": 8})
    with pytest.raises(
        RankwiseError,
        match=r"option identities must be an integer in "
        r"1\.\.1501, got 1502",
    ):
        spec.check({"identities": 1502})
    assert spec.check({"height": 16})["height"] == 16
    with pytest.raises(
        RankwiseError,
        match=r"^pixels: option grayscale must be true or "
        r"false, got 'yes'$",
    ):
        encoders.OPTIONS["pixels"].check({"grayscale": "yes"})
    with pytest.raises(
        RankwiseError,
        match=r"onnx: option std must be a list of 3 numbers "
        r"\(each > 0\)",
    ):
        encoders.OPTIONS["onnx"].check({"model": "m.onnx", "std": [1, 0, 1]})
    with pytest.raises(
        RankwiseError,
        match=r"manifest: option protocol: unknown protocol "
        r"'rei-d'; valid protocols: recall, reid",
    ):
        datasets.LOADERS["manifest"].options.check(
            {"query": "q", "gallery": "g", "protocol": "rei-d"}
        )
    toy = OptionSet(
        "toy", (Option("a", "integer", 1, minimum=1), Option("b", "string", required=True))
    )
    with pytest.raises(RankwiseError, match=r"^toy: unknown option\(s\) c; valid options: a, b$"):
        toy.check({"b": "x", "c": 1})
    with pytest.raises(RankwiseError, match=r"^toy: missing option\(s\) b; add them"):
        toy.check({})
    assert toy.check({"b": "x"}) == {"a": 1, "b": "x"}
    assert toy.schema() == {
        "type": "object",
        "additionalProperties": False,
        "required": ["b"],
        "properties": {
            "a": {"type": "integer", "minimum": 1, "default": 1},
            "b": {"type": "string"},
        },
    }


@pytest.mark.parametrize(
    "spec, given, plain",
    [
        (encoders.OPTIONS["color-histogram"], lambda np: {"bins": np.int64(5), "joint": np.True_},
         {"bins": 5, "joint": True}),
        (datasets.LOADERS["folder"].options,
         lambda np: {"root": "r", "query_fraction": np.float32(0.25), "seed": np.uint8(3)},
         {"root": "r", "query_fraction": 0.25, "seed": 3}),
        (encoders.OPTIONS["onnx"],
         lambda np: {"model": "m.onnx", "input_size": [np.int64(4), np.int32(6)],
                     "mean": [np.float32(0.5), np.float64(0.25), np.int64(1)]},
         {"model": "m.onnx", "input_size": [4, 6], "mean": [0.5, 0.25, 1]}),
        (datasets.LOADERS["mot"].options,
         lambda np: {"root": "r", "classes": [np.int64(1)], "sequences": [np.int16(2)]},
         {"root": "r", "classes": [1], "sequences": [2]}),
    ],
)  # fmt: skip
def test_option_sets_record_numpy_scalars_as_pythons(spec, given, plain):
    """numpy's booleans were recorded as True / False, its integers and floats as given
    (``np.int64(5)``): a record unlike the one of the same values given as Python's,
    and np.int64 / np.float32 are not JSON."""
    import numpy as np

    got, expected = spec.check(given(np)), spec.check(plain)
    assert got == expected
    assert repr(got) == repr(expected)  # np.int64(5) == 5, but its repr is not 5's
    assert json.loads(json.dumps(got)) == json.loads(json.dumps(expected))


@pytest.mark.parametrize(
    "option, given, plain",
    [
        (options.CONFIDENCE, np.float32(0.5), 0.5),
        (options.CONFIDENCE, np.float64(0.25), 0.25),
        (options.VERIFICATION_FPRS, [np.float32(1e-3), np.float64(0.5)],
         (float(np.float32(1e-3)), 0.5)),
        (options.VERIFICATION_FPRS, (np.float32(0.25),), (0.25,)),
    ],
)  # fmt: skip
def test_a_single_option_gives_numpy_numbers_as_pythons(option, given, plain):
    """Option.check (the API's keywords) returned np.float32 as given, and inside
    a tuple of numbers: not JSON, and recorded unlike the same Python number."""
    got = option.check(given)
    assert got == plain and repr(got) == repr(plain)
    assert json.dumps(got) == json.dumps(plain)


# ---------------------------------------------------------------- the command line


def _help(*command) -> str:
    proc = run_rankwise(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_defaults_are_the_specs():
    evaluate = _help("evaluate")
    for option in (options.QUERY_BLOCK, options.GALLERY_CHUNK, options.GAP_FRAMES):
        assert re.search(rf"{option.flag} INTEGER .*?\[default: {option.default}\]", evaluate, re.S)
    assert "[default: 1,5,10]" in " ".join(evaluate.split())
    for command in ("ci", "compare", "report"):  # one default number of resamples
        text = " ".join(_help(command).split())
        assert re.search(
            rf"--resamples INTEGER .*?\[default: {options.DEFAULT_RESAMPLES}\]", text
        ), command


def test_cli_lists_every_loader_and_kind():
    # (click wraps long lines after a hyphen: "demo-\n market")
    prepare = re.sub(r"-\s+", "-", " ".join(_help("prepare").split()))
    encode = re.sub(r"-\s+", "-", " ".join(_help("encode").split()))
    for name in datasets.LOADERS:
        assert name in prepare
    for kind in encoders.OPTIONS:
        assert kind in encode


# ---------------------------------------------------------------- packaging

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> set[str]:
    return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_base_dependencies_are_what_the_evaluator_imports():
    """Modules the package imports at top level or in its base commands, by distribution."""
    base = _names(PYPROJECT["dependencies"])
    assert base == {
        "numpy",
        "dask",
        "zarr",
        "click",
        "numba",
        "pandas",
        "threadpoolctl",
        "pillow",
        "tqdm",
    }
    extras = PYPROJECT["optional-dependencies"]
    assert _names(extras["pipeline"]) == {"snakemake", "pyyaml", "jsonschema"}
    assert _names(extras["report"]) == {"matplotlib"}
    assert _names(extras["demo"]) == {"scikit-learn"}
    test = " ".join(extras["test"])
    for extra in ("pipeline", "report", "demo", "onnx", "distributed"):
        assert extra in test
    source = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rankwise").rglob("*.py"))
    assert not re.search(r"^\s*(import|from) dask\.array", source, re.M)  # dask, not dask[array]
    from rankwise.extras import EXTRAS

    for module, (package, extra) in EXTRAS.items():
        assert package in " ".join(extras[extra]), (module, extra)


def test_conda_environment_installs_this_repository():
    env = yaml.safe_load((ROOT / "envs" / "rankwise.yaml").read_text())
    conda = _names(d for d in env["dependencies"] if isinstance(d, str))
    conda = {"matplotlib" if n == "matplotlib-base" else n for n in conda}
    extras = PYPROJECT["optional-dependencies"]
    needed = _names(PYPROJECT["dependencies"]) | _names(
        extras["report"] + extras["demo"] + extras["onnx"] + extras["distributed"]
    )
    assert needed <= conda, needed - conda
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip[0].startswith("-e ")
    # Snakemake copies the file to <workdir>/.snakemake/conda/<hash>.yaml; conda runs pip
    # from that folder. Run from the repository root, the path is the repository.
    copied_to = ROOT / ".snakemake" / "conda"
    target = (copied_to / pip[0].split(maxsplit=1)[1]).resolve()
    assert target == ROOT.resolve()
    assert tomllib.loads((target / "pyproject.toml").read_text())["project"]["name"] == "rankwise"
    rules = "\n".join(p.read_text() for p in (ROOT / "rules").glob("*.smk"))
    assert '"../envs/rankwise.yaml"' in rules  # the file the rules name


def test_library_constants_are_the_specs_choices():
    """Names the library still keeps beside the specs must say the same thing."""
    from rankwise import metrics, ranking, stats

    assert options.DISTANCE.choices == ranking.DISTANCES
    assert tuple(metrics.AP_VARIANTS) == options.AP.choices
    assert tuple(stats.BY) == options.BY.choices
    assert ranking.EngineOptions().query_block == options.QUERY_BLOCK.default
    assert ranking.EngineOptions().gallery_chunk == options.GALLERY_CHUNK.default
