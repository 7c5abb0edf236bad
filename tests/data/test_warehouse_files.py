"""The warehouse and its lineage journal hold the lineage of the user's corpus, so they are its
owner's alone: the DuckDB file, its log and its `.corrupt` copy 0600, the journal's folders 0700
and its files 0600, after a stage run, after a rebuild, and once an older, world-readable
warehouse is opened again."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import duckdb
import pytest

from ito_assets.data import lineage, warehouse
from ito_assets.data.warehouse import connect, journal_folder
from test_integrity import Prepared, _run_dedup, prepare


@pytest.fixture(autouse=True)
def usual_umask():
    """The common umask, under which files are created readable by every user unless made otherwise."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.fixture
def fresh(real_tmp: Path) -> Prepared:
    return prepare(real_tmp)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def assert_owner_only(path: Path) -> None:
    assert _mode(path) == 0o600
    for other in (_wal(path), path.with_name(path.name + ".corrupt")):
        assert not other.exists() or _mode(other) == 0o600
    journal = journal_folder(path)
    entries = [journal, *journal.rglob("*")]
    folders = {f.relative_to(path.parent).as_posix(): _mode(f) for f in entries if f.is_dir()}
    files = {f.relative_to(path.parent).as_posix(): _mode(f) for f in entries if f.is_file()}
    # The journal, a manifest's records, the consumption records, what the consumed shards held.
    assert len(folders) == 4 and files
    assert folders == dict.fromkeys(folders, 0o700) and files == dict.fromkeys(files, 0o600)
    assert list(path.parent.glob(f".{path.name}.*")) == []  # no staging folder left behind


def test_a_stage_run_leaves_the_warehouse_and_its_journal_owner_only(fresh: Prepared) -> None:
    assert_owner_only(fresh.warehouse)


def test_a_warehouse_rebuilt_from_its_journal_is_owner_only(fresh: Prepared) -> None:
    path = fresh.warehouse
    path.unlink()
    path.write_bytes(random.Random(3).randbytes(4096))  # a new file: the umask's 0644
    assert _mode(path) == 0o644
    with connect(path) as con:  # as a data step opens it: rebuilt
        assert lineage.resolve_manifest(con, fresh.key) == [fresh.verified.digest]
    assert path.with_name(path.name + ".corrupt").exists()
    assert_owner_only(path)
    path.unlink()  # deleted by hand: rebuilt on the next write
    lineage.record_consumption(path, [fresh.clean.shards.shards[0].sha256], "run-2", "training_tokens",
                               fresh.clean.manifest_digest)
    assert_owner_only(path)


def test_an_existing_world_readable_warehouse_is_tightened(fresh: Prepared) -> None:
    path = fresh.warehouse
    journal = journal_folder(path)
    (consumption,) = (journal / warehouse.CONSUMERS).glob("*.json")
    (duplicates,) = journal.glob("*/duplicates.json")
    os.chmod(path, 0o644)
    for entry in (journal, consumption.parent, duplicates.parent):
        os.chmod(entry, 0o755)
    for entry in (consumption, duplicates):
        os.chmod(entry, 0o644)
    connect(path, read_only=True).close()  # as `ito audit` opens it
    assert _mode(path) == 0o600
    # The writes that record them again: the folders and records they write are tightened too.
    lineage.record_consumption(path, [s.sha256 for s in fresh.clean.shards.shards], "run-1", "training_tokens",
                               fresh.clean.manifest_digest)
    _run_dedup(fresh)
    assert_owner_only(path)


def test_the_warehouses_log_is_owner_only(fresh: Prepared) -> None:
    path = fresh.warehouse
    with duckdb.connect(str(path)) as con:  # a writer that leaves its log behind, as DuckDB creates it
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
        con.execute("CREATE TABLE probe (x INTEGER)")
        con.execute("INSERT INTO probe VALUES (1)")
    assert _mode(_wal(path)) == 0o644
    with connect(path) as con:
        assert _mode(_wal(path)) == 0o600
        con.execute("CHECKPOINT")

    def work(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("PRAGMA disable_checkpoint_on_shutdown")  # the log outlives the connection
        con.execute("INSERT INTO probe VALUES (2)")

    warehouse.writing_to(path, work)
    assert _mode(_wal(path)) == 0o600
