"""Integrity of the data plane's stores: every shard a stage reads is verified against the digest
recorded when it was written (SHARD_CORRUPT otherwise, never a parser's error or silently other
rows); a corrupt warehouse is rebuilt from its lineage journal, or refused with the fix when the
lineage is incomplete; a full disk is STORAGE_FULL, leaves nothing half-written and a retry works."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from data_frames import edit_words, random_text
from ito_assets.data import lineage, shards, stages
from ito_assets.data.config import DataPrepConfig, ScaleConfig
from ito_assets.data.scratch import FINISHED, scratch_space
from ito_assets.data.shards import Shard
from ito_assets.data.warehouse import CONSUMERS, LOG, connect, is_corrupt, journal_folder
from ito_assets.digests import file_sha256
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite, load_suite
from ito_assets.manifest.verify import VerifiedManifest, verify_manifest
from ito_assets.settings import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "data" / "fixtures"
CONFIG = DataPrepConfig(scale=ScaleConfig(num_workers=1, unit_bytes=20_000, memory_limit_mb=128, in_memory_mb=0), shard_max_rows=40)


@dataclass
class Prepared:
    root: Path
    verified: VerifiedManifest
    suite: EvalSuite
    source: stages.SourceStage
    dedup: stages.DedupStage
    decontam: stages.DecontamStage
    clean: stages.CleanStage

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def warehouse(self) -> Path:
        return self.state / "warehouse.duckdb"

    @property
    def key(self) -> str:
        return self.verified.short_digest


def _corpus(suite: EvalSuite) -> list[list[dict]]:
    """Two sources: fresh texts, exact and near copies (also across sources), and documents that
    quote eval questions, so that every stage's tables have rows."""
    rng = random.Random(7)
    texts = [random_text(rng, rng.randint(30, 120)) for _ in range(70)]
    texts += [texts[3], texts[10], edit_words(rng, texts[20], 2), edit_words(rng, texts[30], 1)]
    for item in suite.items[:3]:
        texts.append(f"{random_text(rng, 60)} {item.question} {random_text(rng, 60)}")
    rng.shuffle(texts)
    half = len(texts) // 2
    return [[{"id": f"a{i}", "text": t} for i, t in enumerate(texts[:half])], [{"id": f"b{i}", "text": t} for i, t in enumerate(texts[half:])]]


def prepare(root: Path) -> Prepared:
    """The four stages on a small corpus under `root` (warehouse in `root/state`), as Dagster
    runs them, plus a consumption record as the training stage writes it."""
    suite = load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl")
    manifest = json.loads((FIXTURES / "manifests" / "fixture-small.json").read_text())
    provenance = manifest["data"][0]["decontamination"]
    data = []
    for index, records in enumerate(_corpus(suite)):
        path = root / f"source-{index}.jsonl"
        path.write_bytes("".join(json.dumps(r) + "\n" for r in records).encode())
        data.append({"uri": f"dataroot://{path.name}", "sha256": file_sha256(path), "license": "CC0-1.0", "format": "jsonl", "decontamination": provenance})
    manifest["data"] = data
    (root / "manifest.json").write_text(json.dumps(manifest))
    verified = verify_manifest(str(root / "manifest.json"))
    state = root / "state"
    warehouse = state / "warehouse.duckdb"
    source = stages.run_sources(verified, root, state, warehouse, CONFIG)
    decontam = stages.run_decontam(verified, suite, source, state, warehouse, CONFIG)
    dedup = stages.run_dedup(source, decontam.actions, state, warehouse, CONFIG)
    clean = stages.run_clean(verified, source, dedup, decontam, state, warehouse, CONFIG)
    lineage.record_consumption(warehouse, [s.sha256 for s in clean.shards.shards], "run-1", "training_tokens", clean.manifest_digest)
    return Prepared(root, verified, suite, source, dedup, decontam, clean)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Prepared:
    return prepare(Path(os.path.realpath(tmp_path_factory.mktemp("integrity"))))


@pytest.fixture
def fresh(real_tmp: Path) -> Prepared:
    """A run of its own, for tests that change what they leave behind."""
    return prepare(real_tmp)


def tables(warehouse: Path) -> dict[str, list[tuple]]:
    """Every lineage table's rows, sorted: what any audit can read."""
    with duckdb.connect(str(warehouse), read_only=True) as con:
        return {table: sorted(con.execute(f"SELECT * FROM {table}").fetchall(), key=repr) for table in lineage.SCHEMA}


def replace_with_other_parquet(path: Path) -> None:
    """Other valid Parquet of the same schema: a row fewer (or, for an empty table, a row of
    nulls). A digest-blind reader takes it for the real shard."""
    frame = pl.read_parquet(path)
    before = path.read_bytes()
    other = frame.slice(0, frame.height - 1) if frame.height else pl.DataFrame({c: [None] for c in frame.columns}, schema=frame.schema)
    other.write_parquet(path, compression="zstd")
    assert path.read_bytes() != before and pl.read_parquet(path).schema == frame.schema


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


TAMPERS = {"replaced": replace_with_other_parquet, "flipped": flip_one_byte, "truncated": truncate}


def _run_dedup(p: Prepared):
    return stages.run_dedup(p.source, p.decontam.actions, p.state, p.warehouse, CONFIG)


def _run_decontam(p: Prepared):
    return stages.run_decontam(p.verified, p.suite, p.source, p.state, p.warehouse, CONFIG)


def _run_clean(p: Prepared):
    return stages.run_clean(p.verified, p.source, p.dedup, p.decontam, p.state, p.warehouse, CONFIG)


def _residual(p: Prepared):
    return stages.residual_contamination(p.clean.shards, p.suite, p.decontam, CONFIG.scale)


# (shard kind, the shard, the reader that must refuse it, the folder that reader writes)
READERS = {
    "source documents -> dedup": (lambda p: p.source.shards.shards[0], _run_dedup, "dedup"),
    "source documents -> clean": (lambda p: p.source.shards.shards[-1], _run_clean, "clean"),
    "source documents -> provenance check": (lambda p: p.source.shards.shards[0], lambda p: p.source.shards.read(["doc_id"]), None),
    "source documents -> decontam": (lambda p: p.source.shards.shards[-1], _run_decontam, "decontam"),
    "decontam actions -> dedup": (lambda p: p.decontam.actions, _run_dedup, "dedup"),
    "kept documents -> clean": (lambda p: p.dedup.kept.shards[0], _run_clean, "clean"),
    "dedup decisions -> clean": (lambda p: p.dedup.decisions, _run_clean, "clean"),
    "contamination hits -> clean": (lambda p: p.decontam.hits, _run_clean, "clean"),
    "decontam actions -> clean": (lambda p: p.decontam.actions, _run_clean, "clean"),
    "decontam pieces -> clean": (lambda p: p.decontam.pieces, _run_clean, "clean"),
    "ignored seeds -> residual check": (lambda p: p.decontam.ignored_seeds, _residual, None),
    "clean shards -> residual check": (lambda p: p.clean.shards.shards[-1], _residual, None),
    "clean shards -> training read": (lambda p: p.clean.shards.shards[0], lambda p: p.clean.shards.read(["text"]), None),
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("tamper", list(TAMPERS))
@pytest.mark.parametrize("reader", list(READERS))
def test_a_tampered_shard_is_refused_by_its_reader_naming_it(prepared: Prepared, reader: str, tamper: str) -> None:
    shard_of, read, writes = READERS[reader]
    shard: Shard = shard_of(prepared)
    path = Path(shard.path)
    original = path.read_bytes()
    output = stages.stage_folder(prepared.state, prepared.key) / writes if writes else None
    before = _snapshot(output) if output else {}
    TAMPERS[tamper](path)
    try:
        with pytest.raises(ItoError) as info:
            read(prepared)
        assert (_snapshot(output) if output else {}) == before  # refused before anything was written
    finally:
        path.write_bytes(original)
    error = info.value
    assert error.code is ErrorCode.SHARD_CORRUPT and not error.retryable
    name = path.relative_to(stages.shard_store(prepared.state)).as_posix()
    assert name.startswith(prepared.key + "/") and f"shard {name} " in error.message
    assert f"expected sha256 {shard.sha256}" in error.message
    assert str(prepared.root) not in error.message  # named within its store, not by an absolute path


def test_a_missing_or_unreadable_shard_is_shard_corrupt(prepared: Prepared) -> None:
    shard = prepared.source.shards.shards[0]
    path = Path(shard.path)
    original = path.read_bytes()
    try:
        path.unlink()
        with pytest.raises(ItoError) as missing:
            _run_decontam(prepared)
        path.mkdir()  # a path that is there but cannot be read as a file
        with pytest.raises(ItoError) as unreadable:
            _run_decontam(prepared)
    finally:
        if path.is_dir():
            path.rmdir()
        path.write_bytes(original)
    assert missing.value.code is unreadable.value.code is ErrorCode.SHARD_CORRUPT
    assert "is missing" in missing.value.message and "cannot be read" in unreadable.value.message
    assert prepared.source.shards.verify() == [] and shard.changed() is False


def test_a_shard_is_named_by_its_file_name_outside_any_store(tmp_path: Path) -> None:
    written = shards.write_shards(pl.DataFrame({"text": ["a", "b"]}), tmp_path / "set", prefix="p", max_rows=1)
    flip_one_byte(Path(written.shards[1].path))
    assert written.verify() == ["p-00001.parquet"]
    with pytest.raises(ItoError) as info:
        written.read()
    assert info.value.code is ErrorCode.SHARD_CORRUPT and "shard p-00001.parquet " in info.value.message
    assert str(tmp_path) not in info.value.message


def test_an_untampered_run_is_unaffected(real_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        p = prepare(real_tmp)
        kept = p.dedup.kept
        again = _run_dedup(p)  # a rerun replaces its folder whole, with the same bytes
    assert not caplog.records
    assert [s.sha256 for s in again.kept.shards] == [s.sha256 for s in kept.shards] and again.decisions.sha256 == p.dedup.decisions.sha256
    for shard_set in (p.source.shards, p.dedup.kept, p.clean.shards):
        assert shard_set.verify() == [] and all(s.store == str(stages.shard_store(p.state)) for s in shard_set.shards)
    assert p.clean.conservation.holds and p.clean.conservation.num_input == 77 and _residual(p).height == 0
    assert p.dedup.counts.num_removed > 0 and p.decontam.counts.num_contaminated_documents > 0
    leftovers = [f for f in stages.shard_store(p.state).rglob("*") if f.name.startswith(".") or f.name == stages.SCRATCH]
    assert leftovers == []
    rows = tables(p.warehouse)
    assert len(rows["documents"]) == len(rows["decisions"]) == 77 and len(rows["shard_consumers"]) == len(p.clean.shards.shards)
    journal = journal_folder(p.warehouse)
    recorded = {json.loads(f.read_text())["table"] for f in journal.glob("*/*.json") if f.parent.name != CONSUMERS}
    assert recorded == set(lineage.SCHEMA) - {"shard_consumers"}


# The warehouse: a derived store, rebuilt from its lineage journal.


def answers(con: duckdb.DuckDBPyConnection, p: Prepared) -> dict:
    """What the auditors' verbs ask (through the functions `ito audit` calls)."""
    duplicate, hit = (con.execute(sql).fetchone()[0] for sql in ("SELECT min(doc_id) FROM duplicates", "SELECT min(eval_item_id) FROM contamination_hits"))
    return {
        "manifest": lineage.audit_manifest(con, p.verified.digest),
        "document": lineage.audit_document(con, duplicate),
        "eval_item": lineage.audit_eval_item(con, hit),
        "resolved": lineage.resolve_manifest(con, p.key),
    }


def _rebuilt_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG.name and r.levelno == logging.WARNING]


def test_a_garbage_warehouse_is_rebuilt_with_a_warning_and_the_same_answers(fresh: Prepared, caplog: pytest.LogCaptureFixture) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    with connect(warehouse, read_only=True) as con:
        expected = answers(con, fresh)
    garbage = random.Random(3).randbytes(warehouse.stat().st_size)
    warehouse.write_bytes(garbage)
    with pytest.raises(ItoError) as refused:  # as `ito audit` opens it: a reader writes nothing
        connect(warehouse, read_only=True)
    assert refused.value.code is ErrorCode.WAREHOUSE_CORRUPT and "a read-only open does not rebuild it" in refused.value.message
    assert str(fresh.root) not in refused.value.message
    assert warehouse.read_bytes() == garbage and not warehouse.with_name("warehouse.duckdb.corrupt").exists()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        with connect(warehouse) as con:  # as a data step opens it
            assert answers(con, fresh) == expected
    (warning,) = _rebuilt_warnings(caplog)
    assert "warehouse.duckdb was corrupt" in warning and "rebuilt from its lineage" in warning and "every file verified" in warning
    assert str(fresh.root) not in warning
    assert tables(warehouse) == before
    assert warehouse.with_name("warehouse.duckdb.corrupt").read_bytes() == garbage  # kept for inspection
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        _run_dedup(fresh)  # and the rebuilt warehouse takes writes again, without a second rebuild
    assert not _rebuilt_warnings(caplog) and tables(warehouse) == before


def _blocks(warehouse: Path) -> range:
    """Offsets of DuckDB's 256 KiB blocks, after its three 4 KiB headers."""
    return range(3 * 4096, warehouse.stat().st_size, 256 * 1024)


def _damaged(data: bytes, block: int) -> bytes:
    damaged = bytearray(data)
    damaged[block + 100] ^= 0xFF  # past the block's checksum: DuckDB sees the mismatch when it reads it
    return bytes(damaged)


def _opens(warehouse: Path) -> bool:
    try:
        duckdb.connect(str(warehouse), read_only=True).close()
    except duckdb.Error:
        return False
    return True


def test_a_warehouse_damaged_in_a_block_is_rebuilt_when_a_read_finds_it(fresh: Prepared, caplog: pytest.LogCaptureFixture) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    with connect(warehouse, read_only=True) as con:
        expected = lineage.audit_manifest(con, fresh.verified.digest)
    data = warehouse.read_bytes()
    for block in _blocks(warehouse):  # a block that DuckDB reads only when the audit asks for it
        warehouse.write_bytes(_damaged(data, block))
        if not _opens(warehouse):
            continue
        with duckdb.connect(str(warehouse), read_only=True) as con:
            try:
                lineage.audit_manifest.__wrapped__(con, fresh.verified.digest)
            except duckdb.IOException as error:
                assert "Corrupt database file" in str(error)
                break
    else:
        pytest.fail("no block of the warehouse is read by the manifest audit")
    damaged = warehouse.read_bytes()
    with connect(warehouse, read_only=True) as con:  # as `ito audit` opens it: the file opens
        with pytest.raises(ItoError) as refused:
            lineage.audit_manifest(con, fresh.verified.digest)
    assert refused.value.code is ErrorCode.WAREHOUSE_CORRUPT and "a read-only open does not rebuild it" in refused.value.message
    assert warehouse.read_bytes() == damaged  # a reader rebuilds nothing
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        with connect(warehouse) as con:  # as a data step opens it
            assert not _rebuilt_warnings(caplog)  # the file opens: the damage shows only as it is read
            assert lineage.audit_manifest(con, fresh.verified.digest) == expected
            assert lineage.audit_manifest(con, fresh.verified.digest) == expected  # the connection now reads the rebuilt file
    (warning,) = _rebuilt_warnings(caplog)
    assert "Corrupt database file" in warning and "rebuilt from its lineage" in warning
    assert tables(warehouse) == before


def test_a_warehouse_found_corrupt_while_a_stage_writes_it_is_rebuilt(fresh: Prepared, caplog: pytest.LogCaptureFixture) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    data = warehouse.read_bytes()
    for block in _blocks(warehouse):  # a block the dedup stage's write reads, after the file opened
        warehouse.write_bytes(_damaged(data, block))
        if not _opens(warehouse):
            continue
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOG.name):
            _run_dedup(fresh)
        if _rebuilt_warnings(caplog):
            break
        warehouse.write_bytes(data)
    else:
        pytest.fail("no block of the warehouse is read by the dedup stage's write")
    (warning,) = _rebuilt_warnings(caplog)
    assert "Corrupt database file" in warning
    assert tables(warehouse) == before


def test_a_corrupt_warehouse_with_lineage_missing_is_refused_with_the_fix_and_the_fix_works(fresh: Prepared, caplog: pytest.LogCaptureFixture) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    decisions = Path(fresh.dedup.decisions.path)  # what the duplicates table is read from
    decisions.unlink()
    warehouse.write_bytes(b"not a database")
    with pytest.raises(ItoError) as info:
        connect(warehouse)
    error = info.value
    assert error.code is ErrorCode.WAREHOUSE_CORRUPT and not error.retryable
    assert f"shard {fresh.key}/dedup/decisions.parquet is missing" in error.message
    assert error.message.endswith(f"one-line fix: delete warehouse.duckdb and re-materialize deduplicated_documents (partition {fresh.key})")
    assert str(fresh.root) not in error.message
    assert warehouse.read_bytes() == b"not a database"  # refused: nothing replaced
    with pytest.raises(ItoError) as again:  # a writer is refused alike
        _run_clean(fresh)
    assert again.value.code in (ErrorCode.SHARD_CORRUPT, ErrorCode.WAREHOUSE_CORRUPT)
    # The fix, as the line says it. Rerun first, deduplicated_documents rewrites what was missing.
    warehouse.unlink()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        _run_dedup(fresh)
    (warning,) = _rebuilt_warnings(caplog)
    assert "was missing; rebuilt from its lineage: 10 records" in warning  # eval_items included
    assert tables(warehouse) == before
    caplog.clear()
    warehouse.write_bytes(b"not a database")  # the lineage is whole again: the next corruption rebuilds
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        connect(warehouse).close()
    assert len(_rebuilt_warnings(caplog)) == 1 and tables(warehouse) == before


def test_a_warehouse_deleted_by_hand_is_rebuilt_from_the_lineage_that_verifies(fresh: Prepared, caplog: pytest.LogCaptureFixture) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    decisions = Path(fresh.dedup.decisions.path)
    recorded = decisions.read_bytes()
    decisions.unlink()
    warehouse.unlink()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        _run_decontam(fresh)  # another asset first: the duplicates' record cannot be replayed
    (warning,) = _rebuilt_warnings(caplog)
    assert "was missing; rebuilt from the 9 lineage records that verify" in warning  # eval_items included
    assert f"left out: shard {fresh.key}/dedup/decisions.parquet is missing" in warning
    assert warning.endswith(f"re-materialize deduplicated_documents (partition {fresh.key}) to restore them")
    after = tables(warehouse)
    assert after["duplicates"] == [] and all(after[t] == before[t] for t in lineage.SCHEMA if t not in ("duplicates", "manifests"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        _run_dedup(fresh)  # the asset the warning names: the record, and the rows, are back
    assert not _rebuilt_warnings(caplog) and decisions.read_bytes() == recorded
    after = tables(warehouse)
    assert all(after[t] == before[t] for t in lineage.SCHEMA if t != "manifests")


def test_a_tampered_lineage_file_or_record_is_refused(fresh: Prepared) -> None:
    warehouse = fresh.warehouse
    clean_shard = Path(fresh.clean.shards.shards[0].path)  # read by the clean_pieces record
    original = clean_shard.read_bytes()
    replace_with_other_parquet(clean_shard)
    warehouse.write_bytes(b"\0" * 4096)
    with pytest.raises(ItoError) as info:
        connect(warehouse)
    assert info.value.code is ErrorCode.WAREHOUSE_CORRUPT and "does not hash to its recorded digest" in info.value.message
    assert "re-materialize clean_shards (partition" in info.value.message
    clean_shard.write_bytes(original)
    record = next(journal_folder(warehouse).glob("*/sources.json"))
    record.write_text("{")
    with pytest.raises(ItoError) as unreadable:
        connect(warehouse)
    assert unreadable.value.code is ErrorCode.WAREHOUSE_CORRUPT and "sources.json is unreadable" in unreadable.value.message


def test_a_corrupt_warehouse_without_any_lineage_is_refused(fresh: Prepared) -> None:
    shutil.rmtree(journal_folder(fresh.warehouse))  # a warehouse from before lineage was journaled
    fresh.warehouse.write_bytes(b"garbage")
    with pytest.raises(ItoError) as info:
        connect(fresh.warehouse)
    assert info.value.code is ErrorCode.WAREHOUSE_CORRUPT and "no lineage was recorded beside it" in info.value.message
    assert info.value.message.endswith("one-line fix: delete warehouse.duckdb and re-materialize the data assets of every manifest")


def test_a_warehouse_held_by_a_writer_is_busy_and_never_rebuilt(fresh: Prepared) -> None:
    warehouse = fresh.warehouse
    data = warehouse.read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(warehouse)!r}); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for attempt in (lambda: connect(warehouse, read_only=True), lambda: lineage.record_consumption(warehouse, ["x"], "run-2", "s", "sha256:" + "0" * 64)):
            with pytest.raises(ItoError) as info:
                attempt()
            assert info.value.code is ErrorCode.WAREHOUSE_BUSY and info.value.retryable
    finally:
        holder.communicate("")
    assert warehouse.read_bytes() == data and not warehouse.with_name("warehouse.duckdb.corrupt").exists()


# A full disk: STORAGE_FULL, nothing half-written left, and a retry once space returns succeeds.

needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, where every write fails with ENOSPC")


def _hidden(folder: Path) -> list[str]:
    return sorted(f.relative_to(folder).as_posix() for f in folder.rglob("*") if f.name.startswith(".") or f.name == stages.SCRATCH)


def test_a_full_disk_while_source_shards_are_written(fresh: Prepared, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = stages.stage_folder(fresh.state, fresh.key)
    before = _snapshot(folder / "source")
    rows = tables(fresh.warehouse)
    original = shards._Sink.write

    def fills_the_disk(self, data) -> int:
        # The second part: its first kilobytes land, then the OS says the disk is full.
        if self.name.endswith("documents-00001.parquet") and self.tell() >= 1024:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, data)

    monkeypatch.setattr(shards._Sink, "write", fills_the_disk)
    with pytest.raises(ItoError) as info:
        stages.run_sources(fresh.verified, fresh.root, fresh.state, fresh.warehouse, CONFIG)
    assert info.value.code is ErrorCode.STORAGE_FULL and info.value.retryable
    assert f"{fresh.key}/source" in info.value.message and str(fresh.root) not in info.value.message
    assert _snapshot(folder / "source") == before and _hidden(folder) == []  # the last good set, and nothing else
    assert tables(fresh.warehouse) == rows
    monkeypatch.undo()  # space returns
    again = stages.run_sources(fresh.verified, fresh.root, fresh.state, fresh.warehouse, CONFIG)
    assert [s.sha256 for s in again.shards.shards] == [s.sha256 for s in fresh.source.shards.shards]
    assert _snapshot(folder / "source") == before and _hidden(folder) == []


def test_a_full_disk_while_a_table_is_written(fresh: Prepared, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = stages.stage_folder(fresh.state, fresh.key) / "dedup"
    before = _snapshot(folder)

    class FillsTheDisk(pq.ParquetWriter):
        # The decisions table: its first batch is written, then the disk is full.
        def write_batch(self, batch, *args, **kwargs):
            super().write_batch(batch, *args, **kwargs)
            if str(self.where).endswith(".decisions.parquet.tmp"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "ParquetWriter", FillsTheDisk)
    with pytest.raises(ItoError) as info:
        _run_dedup(fresh)
    assert info.value.code is ErrorCode.STORAGE_FULL and info.value.retryable and f"{fresh.key}/dedup/decisions.parquet" in info.value.message
    # Only the finished work units' outputs and markers stay, for the rerun once space returns.
    finished = {name for name in _snapshot(folder) if name.startswith(f"{FINISHED}/")}
    assert {name for name in finished if "/marker-" in name} and _hidden(folder) == []
    assert {name: data for name, data in _snapshot(folder).items() if name not in finished} == before
    monkeypatch.undo()
    again = _run_dedup(fresh)
    assert again.decisions.sha256 == fresh.dedup.decisions.sha256 and _snapshot(folder) == before


@needs_dev_full
def test_a_full_disk_under_the_warehouse_leaves_its_rows(fresh: Prepared) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    wal = warehouse.with_name("warehouse.duckdb.wal")
    wal.symlink_to("/dev/full")  # DuckDB's commit writes its log here first: a real ENOSPC
    try:
        with pytest.raises(ItoError) as info:
            _run_dedup(fresh)
    finally:
        wal.unlink()
    assert info.value.code is ErrorCode.STORAGE_FULL and info.value.retryable and "warehouse.duckdb" in info.value.message
    assert tables(warehouse) == before  # the transaction rolled back
    assert _run_dedup(fresh).counts == fresh.dedup.counts and tables(warehouse) == before


@needs_dev_full
def test_a_full_disk_under_the_lineage_journal_leaves_the_warehouse_alone(fresh: Prepared) -> None:
    warehouse = fresh.warehouse
    before = tables(warehouse)
    record = next(journal_folder(warehouse).glob("*/duplicates.json"))
    recorded = record.read_bytes()
    temporary = record.with_name(".duplicates.json.tmp")
    temporary.symlink_to("/dev/full")  # where the record is written before it is renamed
    with pytest.raises(ItoError) as info:
        _run_dedup(fresh)
    assert info.value.code is ErrorCode.STORAGE_FULL and "lineage of duplicates" in info.value.message
    assert not temporary.is_symlink() and record.read_bytes() == recorded and tables(warehouse) == before
    _run_dedup(fresh)
    assert record.read_bytes() == recorded and tables(warehouse) == before


def test_a_full_disk_in_a_steps_scratch_space_is_storage_full(tmp_path: Path) -> None:
    folder = tmp_path / "dedup" / stages.SCRATCH
    with pytest.raises(ItoError) as info:
        with scratch_space(folder, CONFIG.scale) as scratch:
            scratch.sub("units")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert info.value.code is ErrorCode.STORAGE_FULL and "dedup/_scratch" in info.value.message
    assert not folder.exists()


def test_disk_full_is_told_apart_from_other_failures() -> None:
    assert shards.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert shards.disk_full(pl.exceptions.ComputeError("parquet: underlying IO error: No space left on device (os error 28)"))
    assert shards.disk_full(duckdb.IOException('IO Error: Could not write file "x": No space left on device'))
    assert not shards.disk_full(OSError(errno.EACCES, "Permission denied"))
    assert is_corrupt(duckdb.IOException('IO Error: The file "x" exists, but it is not a valid DuckDB database file!'))
    assert not is_corrupt(duckdb.IOException('IO Error: Could not set lock on file "x": Conflicting lock is held'))
    assert not is_corrupt(duckdb.IOException('IO Error: Cannot open file "x": Permission denied'))


def test_a_runs_consumption_is_the_manifests_it_trained_not_every_manifest_with_those_bytes(fresh: Prepared) -> None:
    """Two manifests over the same files write byte-identical clean shards: keyed by the shard's
    digest alone, a run of one showed as a consumer of the other's (in `ito audit manifest` and
    `ito audit doc`). A row recorded before runs named their manifest counts for both, as it did;
    a rebuilt warehouse answers the same."""
    other = "sha256:" + "e" * 64
    sha = fresh.clean.shards.shards[0].sha256
    with connect(fresh.warehouse) as con:  # the other manifest's clean shards, the same bytes
        con.execute("INSERT INTO clean_shards SELECT ? AS manifest_digest, * EXCLUDE (manifest_digest) FROM clean_shards "
                    "WHERE manifest_digest = ?", [other, fresh.verified.digest])
    lineage.record_consumption(fresh.warehouse, [sha], "run-of-a", "training_tokens", fresh.verified.digest)

    def consumers() -> dict[str, list[str]]:
        with connect(fresh.warehouse, read_only=True) as con:
            return {digest: [c["run_id"] for c in lineage.audit_manifest(con, digest)["consumed_by"]]
                    for digest in (fresh.verified.digest, other)}

    assert consumers() == {fresh.verified.digest: ["run-1", "run-of-a"], other: []}  # run-1: the preparation's
    with connect(fresh.warehouse) as con:  # as a release before this one recorded it
        lineage.insert_consumers(con, [(sha, "old-run", "training_tokens", datetime(2026, 1, 1), None)])
    assert consumers() == {fresh.verified.digest: ["old-run", "run-1", "run-of-a"], other: ["old-run"]}
    fresh.warehouse.unlink()
    lineage.record_consumption(fresh.warehouse, [sha], "run-of-a", "training_tokens", fresh.verified.digest)  # rebuilt
    with connect(fresh.warehouse, read_only=True) as con:
        rows = con.execute("SELECT run_id, manifest_digest FROM shard_consumers ORDER BY run_id").fetchall()
    assert ("run-of-a", fresh.verified.digest) in rows


def test_an_audit_of_a_warehouse_written_before_consumptions_named_their_manifest(fresh: Prepared) -> None:
    """An audit opens the warehouse read-only, where nothing adds the new column: it read
    `c.manifest_digest` and failed (INTERNAL_ERROR) until a data step wrote again."""
    with connect(fresh.warehouse) as con:
        con.execute("ALTER TABLE shard_consumers DROP COLUMN manifest_digest")  # as an earlier release wrote it
    with connect(fresh.warehouse, read_only=True) as con:
        assert [c["run_id"] for c in lineage.audit_manifest(con, fresh.verified.digest)["consumed_by"]] == ["run-1"]
        kept = con.execute("SELECT doc_id FROM clean_pieces WHERE manifest_digest = ? LIMIT 1",
                           [fresh.verified.digest]).fetchone()[0]
        (entry,) = lineage.audit_document(con, kept)
        assert [c["run_id"] for c in entry["consumed_by"]] == ["run-1"]
