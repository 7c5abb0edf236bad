"""Out-of-core deduplication over tiny work units gives exactly the in-memory decisions."""

from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from data_frames import edit_words, frame, random_text
from ito_assets.data.band_join import candidate_batches
from ito_assets.data.bucket_sort import SPREAD_FILE, SPREAD_FILES
from ito_assets.data.clean import ACTION_SCHEMA, tiers_of
from ito_assets.data.config import DataPrepConfig, DedupConfig, ScaleConfig
from ito_assets.data import dedup_units, exact_units
from ito_assets.data.dedup_units import deduplicate_units, kept_frames
from ito_assets.data.near_dedup import band_rows, candidate_pairs
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import write_shard_stream, write_shards, write_table
from ito_assets.data.sources import DOCUMENT_SCHEMA, read_sources
from ito_assets.data.stages import SCRATCH, SourceStage, run_dedup, stage_folder
from ito_assets.manifest.schema import DataReference
from ito_assets.data.completion import MARKERS
from ito_assets.digests import file_sha256
from ito_assets.data.scratch import FINISHED
from reference_impl import deduplicate, kept_documents
from test_source_pieces import _threads

# Units of a few documents, verification batches of a few pairs, DuckDB at its floor.
TINY = ScaleConfig(unit_bytes=3_000, pair_batch=7, memory_limit_mb=128, in_memory_mb=0)


def corpus(seed: int = 0) -> pl.DataFrame:
    """Two sources with near-copies, exact copies (also across sources), chains and empties."""
    rng = random.Random(seed)
    texts: list[str] = []
    for _ in range(60):
        original = random_text(rng, rng.randint(20, 200))
        texts.append(original)
        for _ in range(rng.randint(0, 3)):
            texts.append(rng.choice([original, edit_words(rng, original, rng.randint(1, 6)), edit_words(rng, texts[-1], 2)]))
    texts += ["", "too short", "too short", "   "]
    order = list(range(len(texts)))
    rng.shuffle(order)
    texts = [texts[i] for i in order]
    half = len(texts) // 2
    return pl.concat([frame(texts[:half], source_index=1, prefix="b"), frame(texts[half:], source_index=0)])


@pytest.mark.parametrize("num_workers", [1, 2])
def test_out_of_core_decisions_and_kept_documents_equal_in_memory(tmp_path: Path, num_workers: int) -> None:
    docs = corpus()
    expected, expected_counts = deduplicate(docs, DedupConfig())
    assert expected_counts.exact.num_removed > 5 and expected_counts.near.num_removed > 5
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=num_workers, in_memory_mb=0)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
        # One worker cuts the units from the bucket sort; several make a unit of each bucket, a task each.
        units = tmp_path / "_scratch" / "dedup-units" if num_workers == 1 else tmp_path / FINISHED / "representative-units"
        assert len(list(units.glob("unit-*.parquet"))) >= 10
        kept = write_shard_stream(kept_frames(scratch), tmp_path / "kept", prefix="k", max_rows=25, schema=DOCUMENT_SCHEMA)
        # Several workers compare the exact copies' texts in hash partitions, a task each; one worker in one pass.
        partitions = list((tmp_path / FINISHED / "exact-compare").glob("copies-*.parquet"))
        assert len(partitions) >= 2 if num_workers > 1 else not partitions
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert table.num_rows == docs.height
    assert counts == expected_counts
    assert_frame_equal(kept.read(), kept_documents(docs, expected))


@pytest.mark.parametrize("seed", [0, 3])
def test_out_of_core_with_contamination_tiers_equals_in_memory(tmp_path: Path, seed: int) -> None:
    docs = corpus(seed)
    rng = random.Random(seed)
    tiers = pl.DataFrame({"doc_id": rng.sample(docs["doc_id"].to_list(), 40), "tier": [rng.choice([1, 2]) for _ in range(40)]}, schema={"doc_id": pl.String, "tier": pl.Int8})
    expected, expected_counts = deduplicate(docs, DedupConfig(), tiers)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    with scratch_space(tmp_path / "_scratch", TINY) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet", tiers=tiers)
        kept = write_shard_stream(kept_frames(scratch), tmp_path / "kept", prefix="k", max_rows=25, schema=DOCUMENT_SCHEMA)
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts
    assert_frame_equal(kept.read(), kept_documents(docs, expected, tiers))


def test_a_survivor_is_never_in_a_worse_tier_than_its_duplicates() -> None:
    rng = random.Random(7)
    base = random_text(rng, 200)
    # Source order: dropped, cut, clean, and an exact copy of the dropped one; all near-duplicates.
    docs = frame([base, edit_words(rng, base, 1), edit_words(rng, base, 2), base])
    tiers = pl.DataFrame({"doc_id": ["d0000", "d0001", "d0003"], "tier": [2, 1, 2]}, schema={"doc_id": pl.String, "tier": pl.Int8})
    decisions, _ = deduplicate(docs, DedupConfig(), tiers)
    rows = {r["doc_id"]: r for r in decisions.iter_rows(named=True)}
    assert [d for d, r in rows.items() if r["dedup_state"] == "kept"] == ["d0002"]
    # The exact copy of the dropped document follows it to the same kept document.
    assert {d: rows[d]["duplicate_of"] for d in ("d0000", "d0001", "d0003")} == dict.fromkeys(("d0000", "d0001", "d0003"), "d0002")
    # Without tiers the first in source order survives.
    untiered, _ = deduplicate(docs, DedupConfig())
    assert untiered.filter(pl.col("dedup_state") == "kept")["doc_id"].to_list() == ["d0000"]
    # One family, named by its first document in keep order (the clean one).
    assert set(decisions["family_id"]) == {"d0002"}


LICENCE = ("Permission is hereby granted free of charge to any person obtaining a copy of this software and "
           "associated documentation files the Software to deal in the Software without restriction including "
           "without limitation the rights to use copy modify merge publish distribute sublicense and or sell copies "
           "of the Software and to permit persons to whom the Software is furnished to do so subject to the following "
           "conditions The above copyright notice and this permission notice shall be included in all copies or "
           "substantial portions of the Software")


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_cluster_past_a_buckets_anchors_is_paired_with_them_alone(tmp_path: Path, num_workers: int) -> None:
    """200 licences that differ in their copyright line share most buckets: paired every two, about
    19,900 candidates (m(m-1)/2: 8 million for 4,000 licences); with 8 anchors, each meets a
    bucket's first 8 only, and the same documents are removed, streamed as in memory."""
    rng = random.Random(5)
    texts = [f"Copyright (c) {1900 + i} Holder number {i}. {LICENCE}" for i in range(200)]
    texts += [random_text(rng, 60) for _ in range(20)]
    docs = frame(texts)
    whole, whole_counts = deduplicate(docs, DedupConfig(bucket_anchors=0))  # every two paired
    anchored, counts = deduplicate(docs, DedupConfig(bucket_anchors=8))
    assert whole_counts.near.num_candidate_pairs >= 199 * 200 // 2 * 0.99 and whole_counts.near.num_removed == 199
    # At most 8 partners a member in each band's bucket: linear in the cluster's size.
    assert counts.near.num_candidate_pairs <= 20 * 8 * 200 and counts.near.num_removed == 199
    assert counts.near.num_candidate_pairs * 5 < whole_counts.near.num_candidate_pairs
    assert anchored.drop("similarity", "duplicate_of").equals(whole.drop("similarity", "duplicate_of"))
    assert set(anchored.filter(pl.col("dedup_state") == "kept")["doc_id"]) >= {"d0000"}
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    scale = ScaleConfig(unit_bytes=3_000, pair_batch=500, memory_limit_mb=128, in_memory_mb=0, num_workers=num_workers)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        table, streamed_counts = deduplicate_units(scratch, shards.shards, DedupConfig(bucket_anchors=8), tmp_path / "d.parquet")
    assert_frame_equal(pl.read_parquet(table.path), anchored)
    assert streamed_counts == counts


def test_the_launchpad_sets_a_buckets_anchors_and_nothing_else_moves() -> None:
    from ito_assets.defs.data.params import DedupParams

    assert DedupParams().to_config().dedup == DedupConfig()
    assert DedupParams(bucket_anchors=7).to_config().dedup == DedupConfig(bucket_anchors=7)
    with pytest.raises(ValueError, match="bucket_anchors must be 0 \\(off\\) or positive"):
        DedupConfig(bucket_anchors=-1)
    assert DedupConfig(bucket_anchors=0).bucket_anchors == 0 and DedupConfig(bucket_anchors=1).bucket_anchors == 1


def test_signature_verification_mode_agrees_too(tmp_path: Path) -> None:
    docs = corpus(seed=3)
    config = DedupConfig(verify="signature")
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=50)
    with scratch_space(tmp_path / "_scratch", TINY) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, config, tmp_path / "decisions.parquet")
    expected, expected_counts = deduplicate(docs, config)
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts


def test_duckdb_band_join_finds_the_in_memory_candidate_pairs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    # Small slot values make many shared bands: buckets of all sizes, pairs sharing several bands.
    signatures = rng.integers(0, 3, size=(300, 12), dtype=np.uint32)
    signatures[::17] = np.uint32(0xFFFFFFFF)  # documents without shingles never pair
    a, b = candidate_pairs(signatures, 4, 3)
    files = []
    for i, start in enumerate(range(0, 300, 64)):
        path = tmp_path / f"bands-{i}.parquet"
        band_rows(signatures[start : start + 64], 4, 3, first=start).with_columns(pl.lit(i, dtype=pl.Int32).alias("unit")).write_parquet(path)
        files.append(str(path))
    with scratch_space(tmp_path / "_scratch", TINY) as scratch:
        batches = list(candidate_batches(scratch.db, files, 500))
    assert len(batches) > 1 and all(len(x) <= 500 for x, *_ in batches)
    got = np.concatenate([np.stack(batch[:2], axis=1) for batch in batches])
    units = got // 64  # the batches come out in the order of the units of a, then b
    assert np.all(np.diff(units[:, 0] * 10 + units[:, 1]) >= 0)
    got = got[np.lexsort((got[:, 0], got[:, 1]))]
    assert len(a) > 1000 and np.array_equal(got, np.stack([a, b], axis=1))


def test_an_all_empty_corpus_keeps_everything(tmp_path: Path) -> None:
    docs = frame(["", " "])
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=50)
    with scratch_space(tmp_path / "_scratch", TINY) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
    expected, expected_counts = deduplicate(docs, DedupConfig())
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts


def test_the_dedup_stage_on_the_fixtures_matches_in_memory_with_two_workers(tmp_path: Path, fixtures: Path) -> None:
    paths = sorted((fixtures / "corpora").glob("*.jsonl"))
    refs = tuple(DataReference(uri=f"dataroot://{p.name}", sha256=hashlib.sha256(p.read_bytes()).hexdigest(), license="CC0-1.0", format="jsonl") for p in paths)
    docs, counts = read_sources(refs, fixtures / "corpora")
    source = SourceStage(manifest_digest="sha256:" + "0" * 64, manifest_key="k", shards=write_shards(docs, tmp_path / "source", prefix="d", max_rows=1000), sources=tuple(counts))
    config = DataPrepConfig(scale=ScaleConfig(unit_bytes=200_000, num_workers=2, pair_batch=64))
    # Every kept document with duplicates of its own is said to be contaminated, one in two cut.
    untiered, _ = deduplicate(docs, config.dedup)
    survivors = untiered.filter(pl.col("dedup_state") == "duplicate")["duplicate_of"].unique().sort()
    actions = pl.DataFrame({"doc_id": survivors, "action": ["cut", "drop"] * (len(survivors) // 2) + ["cut"] * (len(survivors) % 2), "num_pieces": 0}, schema=ACTION_SCHEMA)
    stage = run_dedup(source, write_table(actions, tmp_path / "actions.parquet"), tmp_path, tmp_path / "warehouse.duckdb", config)
    tiers = tiers_of(actions)
    expected, expected_counts = deduplicate(docs, config.dedup, tiers)
    assert stage.counts == expected_counts and expected_counts.num_removed > 0
    assert stage.band_join_partitions == 2  # one a worker: the fixtures are far under partition_rows
    assert_frame_equal(pl.read_parquet(stage.decisions.path), expected)
    # The source shard's document lengths are the warehouse's; kept shards hold the documents alone.
    assert_frame_equal(stage.kept.read(), kept_documents(docs.select(list(DOCUMENT_SCHEMA)), expected, tiers))
    # The tiers changed which documents survive, not how many.
    assert (expected["dedup_state"] != untiered["dedup_state"]).any() and expected_counts.num_kept == untiered.filter(pl.col("dedup_state") == "kept").height
    assert not (stage_folder(tmp_path, "k") / "dedup" / SCRATCH).exists()


def test_exact_copies_never_rest_on_the_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every text hashes alike: one hash group, so only the text comparison inside it can decide.
    monkeypatch.setattr(exact_units, "text_hashes", lambda texts: np.zeros((len(texts), 2), dtype=np.uint64))
    docs = corpus(seed=5)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=40)
    with scratch_space(tmp_path / "_scratch", TINY) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
    expected, expected_counts = deduplicate(docs, DedupConfig())
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts and counts.exact.num_removed > 5


def _zero_hashes(texts: pl.Series) -> np.ndarray:
    return np.zeros((len(texts), 2), dtype=np.uint64)


def test_exact_copies_in_partitions_never_rest_on_the_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One hash group for every text, on the step's pool (threads here, so the hash is planted in
    # the key tasks too): the partition holding it compares the texts, as the one pass does.
    monkeypatch.setattr(exact_units, "text_hashes", _zero_hashes)
    monkeypatch.setattr(exact_units, "worker_pool", _threads)
    docs = corpus(seed=5)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=40)
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=2)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
        copies = [pl.read_parquet(path) for path in sorted((tmp_path / FINISHED / "exact-compare").glob("copies-*.parquet"))]
    expected, expected_counts = deduplicate(docs, DedupConfig())
    assert_frame_equal(pl.read_parquet(table.path), expected)
    assert counts == expected_counts and counts.exact.num_removed > 5
    assert len(copies) > 2 and [c.height > 0 for c in copies].count(True) == 1  # the one group, in one partition


def _exact_counts(tmp_path: Path, shards, num_workers: int, unit_bytes: int):
    scale = ScaleConfig(unit_bytes=unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=num_workers, in_memory_mb=0)
    with scratch_space(tmp_path / f"_scratch-{num_workers}-{unit_bytes}", scale) as scratch:
        counts = exact_units.exact_copies(scratch, shards.shards)
        copies = scratch.db.execute("SELECT doc_id, exact_copy_of FROM copies ORDER BY doc_id").pl()
        return counts, copies, scratch.units_resumed


@pytest.mark.parametrize("unit_bytes", [500, 3_000, 10_000_000])  # many partitions, some, one
def test_exact_copies_in_partitions_are_the_one_pass_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unit_bytes: int) -> None:
    monkeypatch.setattr(exact_units, "worker_pool", _threads)
    docs = corpus(seed=7)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=23)
    one_pass = _exact_counts(tmp_path, shards, 1, unit_bytes)
    parts = _exact_counts(tmp_path, shards, 2, unit_bytes)
    assert parts[0] == one_pass[0] and one_pass[0].num_removed > 5
    assert_frame_equal(parts[1], one_pass[1])


def test_a_rerun_after_a_failed_partition_compares_only_the_partitions_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact_units, "worker_pool", _threads)
    docs = corpus(seed=7)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=23)
    expected = _exact_counts(tmp_path / "reference", shards, 1, 500)
    real, seen = exact_units._first_of_identical, []

    def failing(rows: pl.DataFrame) -> pl.DataFrame:
        seen.append(1)
        if len(seen) == 5:
            raise RuntimeError("a worker lost")
        return real(rows)

    monkeypatch.setattr(exact_units, "_first_of_identical", failing)
    with pytest.raises(RuntimeError, match="a worker lost"):
        _exact_counts(tmp_path, shards, 2, 500)
    finished = {phase: len(list((tmp_path / FINISHED / phase).glob(MARKERS))) for phase in ("exact-spread", "exact-compare")}
    assert finished["exact-spread"] > 1 and finished["exact-compare"] >= 1
    monkeypatch.setattr(exact_units, "_first_of_identical", real)
    counts, copies, resumed = _exact_counts(tmp_path, shards, 2, 500)
    assert counts == expected[0]
    assert_frame_equal(copies, expected[1])
    # Every source shard's texts and the partitions compared before the failure (and the keys):
    # not done again.
    assert resumed == finished["exact-spread"] + finished["exact-compare"] + len(shards.shards)


def test_a_stray_spread_file_in_the_folder_is_removed_before_the_partitions_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The partitions read every spread file of their folder: one that no marker vouches for (a
    copy here; an earlier attempt's) goes when the phase starts again."""
    monkeypatch.setattr(exact_units, "worker_pool", _threads)
    shards = write_shards(corpus(seed=7), tmp_path / "source", prefix="d", max_rows=23)
    expected = _exact_counts(tmp_path / "reference", shards, 1, 500)
    real = exact_units._first_of_identical

    def failing(rows: pl.DataFrame) -> pl.DataFrame:
        raise RuntimeError("a worker lost")

    monkeypatch.setattr(exact_units, "_first_of_identical", failing)
    with pytest.raises(RuntimeError, match="a worker lost"):
        _exact_counts(tmp_path, shards, 2, 500)
    spread = tmp_path / FINISHED / "exact-spread"
    planted = spread / SPREAD_FILE.format(99999)
    shutil.copy(min(spread.glob(SPREAD_FILES)), planted)
    monkeypatch.setattr(exact_units, "_first_of_identical", real)
    counts, copies, _ = _exact_counts(tmp_path, shards, 2, 500)
    assert counts == expected[0] and not planted.exists()
    assert_frame_equal(copies, expected[1])


def _dedup_on_threads(tmp_path: Path, shards) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=2)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        table, _ = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
        kept = write_shard_stream(kept_frames(scratch), tmp_path / "kept", prefix="k", max_rows=25, schema=DOCUMENT_SCHEMA)
        return pl.read_parquet(table.path), kept.read(), scratch.units_resumed


def test_the_representatives_units_are_the_keep_order_s_buckets_and_a_rerun_makes_only_those_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup_units, "worker_pool", _threads)
    monkeypatch.setattr(exact_units, "worker_pool", _threads)
    docs = corpus(seed=3)
    expected, _ = deduplicate(docs, DedupConfig())
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    made: list = []
    real = dedup_units.representatives_in_parts

    def checked(*args):  # the units' digests, as their tasks took them, are their files' (while they exist)
        units, digests = real(*args)
        made.append((units, digests == {path: file_sha256(path) for path in digests} and {u.path for u in units} <= set(digests)))
        return units, digests

    monkeypatch.setattr(dedup_units, "representatives_in_parts", checked)
    decisions, kept, _ = _dedup_on_threads(tmp_path / "straight", shards)
    assert_frame_equal(decisions, expected)
    assert_frame_equal(kept, kept_documents(docs, expected))
    units, digests_hold = made[0]
    assert digests_hold
    assert len(units) >= 10 and [u.first for u in units] == [sum(u.num_docs for u in units[:i]) for i in range(len(units))]
    # A bucket's task fails after some have finished: the rerun makes only the buckets left.
    real_gathered, seen = dedup_units.gathered, []

    def failing(*args):
        seen.append(1)
        if len(seen) == 6:
            raise RuntimeError("a worker lost")
        return real_gathered(*args)

    monkeypatch.setattr(dedup_units, "gathered", failing)
    with pytest.raises(RuntimeError, match="a worker lost"):
        _dedup_on_threads(tmp_path / "state", shards)
    markers = {phase.name: len(list(phase.glob(MARKERS))) for phase in (tmp_path / "state" / FINISHED).iterdir()}
    assert 0 < markers["representative-units"] < len(units)
    monkeypatch.setattr(dedup_units, "gathered", real_gathered)
    again, kept_again, resumed = _dedup_on_threads(tmp_path / "state", shards)
    assert_frame_equal(again, expected)
    assert_frame_equal(kept_again, kept)
    assert resumed == sum(markers.values())  # every unit finished before the failure, the buckets made among them


def test_hash_groups_are_never_split_between_chunks() -> None:
    rows = pl.DataFrame({"hi": [1, 1, 2, 2, 2, 3, 4, 4], "lo": [0] * 8, "doc_id": list("abcdefgh")}, schema={"hi": pl.UInt64, "lo": pl.UInt64, "doc_id": pl.String})
    batches = [rows.slice(0, 3), rows.slice(3, 0), rows.slice(3, 1), rows.slice(4, 4)]
    chunks = list(exact_units._whole_groups(iter(batches)))
    assert_frame_equal(pl.concat(chunks), rows)
    for chunk in chunks:
        others = pl.concat([c for c in chunks if c is not chunk]) if len(chunks) > 1 else rows.clear()
        assert not set(chunk["hi"].to_list()) & set(others["hi"].to_list())
