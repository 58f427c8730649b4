"""The protocol registry is the one home of protocol facts: the other layers derive from it."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT, run_rankwise

from rankwise import metrics, registry
from rankwise.errors import RankwiseError
from rankwise.manifest import required_columns
from rankwise.protocols import build_problem


def _schema_enum(node, key):
    """Every `enum` under a property called `key`, anywhere in the schema."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict) and "enum" in v:
                found.append(v["enum"])
            found += _schema_enum(v, key)
    elif isinstance(node, list):
        for v in node:
            found += _schema_enum(v, key)
    return found


def test_schema_protocol_enum_is_the_registry():
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    enums = _schema_enum(schema, "protocol")
    assert enums and all(list(e) == list(registry.PROTOCOLS) for e in enums)


def test_cli_protocol_choices_are_the_registry():
    out = run_rankwise("evaluate", "--help").stdout
    for name in registry.PROTOCOLS:
        assert name in out
    # (an unknown --protocol on real files is tests/test_errors.py's 'unknown-protocol')


@pytest.mark.parametrize("name", registry.PROTOCOLS)
def test_metric_names_and_columns_come_from_the_spec(name):
    spec = registry.get_protocol(name)
    names = metrics.metric_names(name, (1, 5))
    expected = []
    for family in spec.metric_families:
        expected += [family[:-1] + str(k) for k in (1, 5)] if family.endswith("K") else [family]
    assert names == expected
    assert spec.headline[0] in metrics.metric_names(name, (1,))
    for role in registry.ROLES:
        assert required_columns(name, role) == spec.columns[role]


def test_unknown_protocol_lists_the_valid_ones():
    with pytest.raises(RankwiseError, match="valid protocols: recall, reid, reassociation"):
        registry.get_protocol("market")


def test_a_new_spec_is_one_declaration(monkeypatch):
    """A variant declared only in the registry (reid without same-camera exclusion) is
    built by build_problem from its flags alone."""
    import pandas as pd

    variant = registry.ProtocolSpec(
        name="reid-keep-camera",
        summary="test variant",
        columns=registry.REGISTRY["reid"].columns,
        metric_families=("rankK", "map"),
        headline=("rank1", "map"),
        junk_labels=True,
        options=("junk_labels",),
    )
    monkeypatch.setitem(registry.REGISTRY, variant.name, variant)
    q = pd.DataFrame({"id": ["q0"], "label": ["1"], "camera": ["1"]})
    g = pd.DataFrame(
        {"id": ["g0", "g1", "g2"], "label": ["1", "1", "-1"], "camera": ["1", "2", "1"]}
    )
    plain = build_problem(q, g, "reid")
    keep = build_problem(q, g, "reid-keep-camera")
    assert plain.pair_g.tolist() == [1]  # same camera excluded
    assert keep.pair_g.tolist() == [0, 1]  # kept by the variant
    assert plain.num_gallery == keep.num_gallery == 2  # junk removed by both
