"""Metadata values the assets share: a chart (a PNG from `ito_assets.charts` embedded in markdown),
a table with a schema (sortable in the UI, unlike a markdown table) and a JSON document.

A diverged run's figures are NaN or infinite, and the UI parses each table row and JSON value
with JSON.parse, which has no word for them ("Could not parse record"): they are written as the
strings "nan", "inf" and "-inf". A plain float value is sent apart and shown as it is.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import dagster as dg

from ito_assets.charts import markdown_image


def chart(title: str, png: bytes) -> dg.MarkdownMetadataValue:
    return dg.MetadataValue.md(markdown_image(title, png))


def table(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping]) -> dg.TableMetadataValue:
    """`columns`: (name, type) with the unit in the name; `rows`: dicts by column name (a missing
    value is left empty)."""
    schema = dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in columns])
    records = [dg.TableRecord({name: _parseable(row[name]) for name, _ in columns if row.get(name) is not None})
               for row in rows]
    return dg.MetadataValue.table(records, schema=schema)


def json_value(document: Any) -> dg.JsonMetadataValue:
    """`document` as JSON metadata, every number in it one JSON can hold."""
    return dg.MetadataValue.json(_parseable(document))


def _parseable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {key: _parseable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_parseable(item) for item in value]
    return value
