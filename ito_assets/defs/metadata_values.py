"""Metadata values the assets share: a chart (a PNG from `ito_assets.charts` embedded in markdown)
and a table with a schema (sortable in the UI, unlike a markdown table)."""

from __future__ import annotations

from typing import Mapping, Sequence

import dagster as dg

from ito_assets.charts import markdown_image


def chart(title: str, png: bytes) -> dg.MarkdownMetadataValue:
    return dg.MetadataValue.md(markdown_image(title, png))


def table(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping]) -> dg.TableMetadataValue:
    """`columns`: (name, type) with the unit in the name; `rows`: dicts by column name (a missing
    value is left empty)."""
    schema = dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in columns])
    records = [dg.TableRecord({name: row[name] for name, _ in columns if row.get(name) is not None}) for row in rows]
    return dg.MetadataValue.table(records, schema=schema)
