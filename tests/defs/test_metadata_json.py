"""Every table row and JSON value the assets record is JSON the UI can parse: its browser reads
each with JSON.parse, which has no NaN or Infinity, and shows "Could not parse record" in place of
a diverged run's row, just where a reader needs it."""

from __future__ import annotations

import json
import math

import pytest
from dagster_graphql.implementation.events import iterate_metadata_entries

from ito_assets.defs.decision.assets import _test_table
from ito_assets.defs.metadata_values import json_value, table
from ito_assets.training.verdict import paired_test


def _parsed_as_the_ui_does(text: str):
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _documents(metadata: dict) -> list:
    """What the UI receives for each entry: a table's rows, a JSON value's text."""
    texts = []
    for entry in iterate_metadata_entries(metadata):
        texts += list(entry.table.records) if hasattr(entry, "table") else [entry.jsonString]
    return [_parsed_as_the_ui_does(text) for text in texts]


@pytest.mark.parametrize("value, shown", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (1.5, 1.5)])
def test_a_number_json_has_no_word_for_is_written_as_text(value, shown):
    metadata = {"rows": table([("arm", "string"), ("loss", "float")], [{"arm": "a", "loss": value}]),
                "summary": json_value({"difference": value, "runs": [{"loss": value}], "pair": (value, 1)})}
    rows, summary = _documents(metadata)
    assert rows == {"arm": "a", "loss": shown}
    assert summary == {"difference": shown, "runs": [{"loss": shown}], "pair": [shown, 1]}


def test_a_diverged_proxys_paired_test_row_reaches_the_ui():
    test = paired_test([math.nan, 1.0, 1.1], [1.2, 1.3, 1.25], 0.95)  # one seed's proxy diverged
    [row] = _documents({"paired_test": _test_table(test)})
    assert row["verdict"] == "INCONCLUSIVE" and row["difference"] == "nan"
