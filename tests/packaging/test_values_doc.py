"""values.yaml has a comment on every value, and the chart README's table is generated from them."""

from __future__ import annotations

import yaml

from tests.packaging.conftest import CHART
from tools.values_table import documented_values, entries, render_readme, undocumented

VALUES_TEXT = (CHART / "values.yaml").read_text()


def test_every_value_has_a_comment():
    assert undocumented(VALUES_TEXT) == []


def test_parser_sees_every_key():
    def paths(node, prefix=""):
        for key, value in node.items():
            yield f"{prefix}{key}"
            if isinstance(value, dict):
                yield from paths(value, f"{prefix}{key}.")

    assert {entry.path for entry in entries(VALUES_TEXT)} == set(paths(yaml.safe_load(VALUES_TEXT)))
    assert "podSecurityContext" in {entry.path for entry in documented_values(VALUES_TEXT)}


def test_undocumented_keys_are_reported():
    assert undocumented("# -- A group.\ngroup:\n  # -- Documented.\n  a: 1\n  b: 2\n") == ["line 5: group.b"]
    assert undocumented("# -- A block, documented whole.\nblock:\n  a: 1\n  b: 2\n") == []


def test_readme_table_is_up_to_date():
    readme = (CHART / "README.md").read_text()
    assert render_readme(readme, VALUES_TEXT) == readme, "stale values table: python -m tools.values_table"


def test_every_value_is_in_the_schema():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    for entry in entries(VALUES_TEXT):
        node = schema
        for name in entry.path.split("."):
            if node.get("additionalProperties") is not False and name not in node.get("properties", {}):
                break  # inside a free-form block
            assert name in node["properties"], f"{entry.path} is not in values.schema.json"
            node = node["properties"][name]
