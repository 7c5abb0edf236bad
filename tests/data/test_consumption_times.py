"""Which run consumed a clean shard, and when: the time is UTC whatever the machine's zone, and
`ito audit` prints it as every other verb prints times (ISO 8601 UTC, to the second, with Z)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import duckdb
import pytest

from ito_assets.api.commands import audit
from ito_assets.data import lineage


@pytest.fixture
def far_from_utc(monkeypatch):
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14: a local time would be off by half a day
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_consumption_is_recorded_in_utc_whatever_the_local_zone(tmp_path, far_from_utc) -> None:
    path = tmp_path / "warehouse.duckdb"
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    lineage.record_consumption(path, ["a" * 64], "run_x", "pretraining", "sha256:" + "0" * 64)
    after = datetime.now(timezone.utc).replace(tzinfo=None)
    with duckdb.connect(str(path), read_only=True) as con:
        (at,) = con.execute("SELECT consumed_at FROM shard_consumers").fetchone()
    assert before <= at <= after


@pytest.mark.parametrize(("value", "shown"), [
    (datetime(2026, 12, 5, 23, 59, 51, 969835), "2026-12-05T23:59:51Z"),
    ({"consumed_by": [{"consumed_at": datetime(2026, 1, 2, 3, 4, 5)}]}, {"consumed_by": [{"consumed_at": "2026-01-02T03:04:05Z"}]}),
    ("2026-12-05", "2026-12-05"), (7, 7), (None, None),
])
def test_the_audit_prints_warehouse_times_in_iso_utc_to_the_second(value, shown) -> None:
    assert audit._plain(value) == shown


def test_a_manifests_recorded_time_is_utc_whatever_the_local_zone(tmp_path, far_from_utc) -> None:
    """`ito audit manifest` prints `recorded_at` with a Z: it was the machine's local time."""
    import polars as pl

    path = tmp_path / "warehouse.duckdb"
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    lineage.write_tables(path, "sha256:" + "b" * 64, {"manifests": pl.DataFrame({"manifest_key": ["bbbbbbbbbbbb"], "name": ["m"]})})
    after = datetime.now(timezone.utc).replace(tzinfo=None)
    with duckdb.connect(str(path), read_only=True) as con:
        (at,) = con.execute("SELECT recorded_at FROM manifests").fetchone()
    assert before <= at <= after
