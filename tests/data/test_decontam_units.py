"""The decontamination scan over tiny work units gives exactly the in-memory hits and counters,
including the corpus-wide common-seed rule, whose counts must add up across units."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from data_frames import frame, random_text
from ito_assets.data.config import DecontamConfig, ScaleConfig
from ito_assets.data.decontam_units import scan_frames, scan_shards
from ito_assets.data.units import parquet_frames, shard_units
from ito_assets.data.eval_index import build_index
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import write_shards
from reference_impl import scan
from test_decontam import ANSWER, QUESTION, SIBLING_A, SIBLING_B, suite, wrap

BOILERPLATE = "permission is hereby granted free of charge to any person obtaining a copy"
ITEMS = [
    ("py-trivia/002", QUESTION, ANSWER),
    ("arith/a", SIBLING_A, "307"),
    ("arith/b", SIBLING_B, "99"),
    ("lic/1", f"{BOILERPLATE} what does the licence header of the zebra project forbid", "nothing"),
]


def corpus() -> pl.DataFrame:
    rng = random.Random(8)
    texts = [f"{random_text(rng, 20)} {BOILERPLATE} {random_text(rng, 20)}" for _ in range(30)]
    texts += [wrap(rng, f"{QUESTION}? Answer: {ANSWER}.") for _ in range(4)]
    texts += [wrap(rng, SIBLING_B), wrap(rng, SIBLING_A), ""]
    texts += [random_text(rng, rng.randint(10, 120)) for _ in range(40)]
    rng.shuffle(texts)
    return frame(texts)


def scanned(tmp_path: Path, docs: pl.DataFrame, scale: ScaleConfig, config: DecontamConfig = DecontamConfig(), max_rows: int = 13):
    shards = write_shards(docs, tmp_path / "kept", prefix="k", max_rows=max_rows)
    with scratch_space(tmp_path / "_scratch", scale) as scratch:
        scanned_units = scan_shards(scratch, shards.shards, build_index(suite(*ITEMS), config), config)
        hits, counts = scanned_units.hits, scanned_units.counts
    return hits, counts, len(shard_units(shards.shards, scale.unit_bytes)), shards


@pytest.mark.parametrize("num_workers", [1, 2])
def test_scan_over_units_equals_the_in_memory_scan(tmp_path: Path, num_workers: int) -> None:
    docs = corpus()
    config = DecontamConfig()
    expected, expected_counts = scan(docs, build_index(suite(*ITEMS), config), config)
    # The boilerplate item is ignored as common, the copied question is not, siblings resolve.
    assert expected["eval_item_id"].unique().sort().to_list() == ["arith/a", "arith/b", "py-trivia/002"]
    assert expected_counts.num_common_seeds_ignored > 0
    # One document per unit (shards of one row): the boilerplate's 30 documents in 30 units.
    hits, counts, num_units, _ = scanned(tmp_path, docs, ScaleConfig(unit_bytes=200, num_workers=num_workers), max_rows=1)
    assert num_units > 30
    assert_frame_equal(hits, expected)
    assert counts == expected_counts


def documents_with_hits(shard_paths: Sequence[str], hits: pl.DataFrame, extra: Sequence[str] = ()) -> pl.DataFrame:
    """A second pass over the shards: the documents that have a hit (doc_id, the `extra` columns,
    text), in the shards' order, the reference for what the scan's workers return."""
    columns = ["doc_id", *extra, "text"]
    ids = hits["doc_id"].unique().implode()
    found = [frame.filter(pl.col("doc_id").is_in(ids)).cast(pl.String) for frame in parquet_frames(shard_paths, columns)]
    return pl.concat([pl.DataFrame(schema=dict.fromkeys(columns, pl.String)), *found])


def test_documents_with_hits_reads_only_those(tmp_path: Path) -> None:
    docs = corpus()
    hits, _, _, shards = scanned(tmp_path, docs, ScaleConfig(unit_bytes=2_000))
    texts = documents_with_hits([s.path for s in shards.shards], hits)
    assert sorted(texts["doc_id"].to_list()) == sorted(hits["doc_id"].unique().to_list())
    assert_frame_equal(texts.sort("doc_id"), docs.join(hits.select("doc_id").unique(), on="doc_id", how="semi").select("doc_id", "text").sort("doc_id"))


@pytest.mark.parametrize("num_workers,unit_bytes", [(1, 200), (2, 200), (1, 10**9)])  # slices of a group, on a pool, a shard a unit
def test_the_scan_returns_the_documents_with_a_hit_as_a_pass_over_the_shards_finds_them(tmp_path: Path, num_workers: int, unit_bytes: int) -> None:
    """What the decontamination step hands to its actions: the hit documents with their extra
    columns, read by the units' workers, in the order a second pass over the shards reads them."""
    docs = corpus().with_columns(pl.format("record-{}", pl.col("doc_id")).alias("source_record_id"))
    shards = write_shards(docs, tmp_path / "kept", prefix="k", max_rows=13)
    config = DecontamConfig()
    with scratch_space(tmp_path / "_scratch", ScaleConfig(unit_bytes=unit_bytes, num_workers=num_workers)) as scratch:
        scanned_units = scan_shards(scratch, shards.shards, build_index(suite(*ITEMS), config), config, extra=["source_record_id"])
    expected = documents_with_hits([s.path for s in shards.shards], scanned_units.hits, ["source_record_id"])
    assert expected.height >= 5
    assert_frame_equal(scanned_units.documents, expected)


def test_a_rescan_of_the_cleaned_documents_keeps_the_first_scans_common_seeds(tmp_path: Path) -> None:
    # The boilerplate is in 11 documents (common: > 10), 2 of which hold the whole licence item
    # and are removed; in the 9 left it would no longer be common.
    rng = random.Random(3)
    texts = [f"{random_text(rng, 20)} {BOILERPLATE} {random_text(rng, 20)}" for _ in range(9)]
    texts += [wrap(rng, ITEMS[3][1]) for _ in range(2)] + [random_text(rng, 60) for _ in range(10)]
    docs = frame(texts).select("doc_id", "text")
    config = DecontamConfig()

    def scan_of(name: str, rows: pl.DataFrame, ignored: pl.DataFrame | None = None):
        with scratch_space(tmp_path / name, ScaleConfig(unit_bytes=500)) as scratch:
            scanned = scan_frames(scratch, [rows], build_index(suite(*ITEMS), config), config, ignored)
            return scanned.hits, scanned.counts, scanned.ignored

    hits, _, ignored = scan_of("first", docs)
    assert hits["doc_id"].n_unique() == 2 and ignored.height > 0
    survivors = docs.join(hits, on="doc_id", how="anti")
    counted_again, _, _ = scan_of("fresh", survivors)
    assert counted_again["doc_id"].n_unique() == 9  # the same text, judged by another rule
    same_rule, counts, _ = scan_of("same", survivors, ignored)
    assert same_rule.height == 0 and counts.num_common_seeds_ignored == ignored.height


FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"


def _fixture_documents() -> pl.DataFrame:
    import json

    texts = [json.loads(line)["text"] for path in sorted((FIXTURES / "corpora").glob("*.jsonl")) for line in path.open()]
    return frame(texts)


@pytest.mark.parametrize("documents", ["planted", "fixtures"])
def test_hits_found_for_every_candidate_at_once_equal_one_document_at_a_time(documents: str) -> None:
    """The fixtures' corpora against their eval suite (real text with planted copies, hundreds of
    candidates) and the planted corpus above: the batched authoritative path gives exactly the rows
    of the per-document one."""
    from ito_assets.data.decontam import candidate_documents, common_seeds, hits_of, seed_frequency, seed_matches
    from ito_assets.data.text import token_hashes
    from ito_assets.evals.suite import load_suite
    from reference_impl import hits_per_document

    config = DecontamConfig()
    if documents == "planted":
        docs, index = corpus(), build_index(suite(*ITEMS), config)
    else:
        docs, index = _fixture_documents(), build_index(load_suite(FIXTURES / "evals" / "ito-fixture-evals-v1.jsonl"), config)
    matches = seed_matches(token_hashes(docs["text"], digits_normalized=True), index)
    ignored = common_seeds(seed_frequency(matches), index, config)
    candidates = candidate_documents(matches, ignored, index)
    assert len(candidates) >= 5
    batched = hits_of(candidates, docs, index, ignored, config)
    assert batched.height >= 5
    assert_frame_equal(batched, hits_per_document(candidates, docs, index, ignored, config))
    assert hits_of([], docs, index, ignored, config).height == 0


@pytest.mark.parametrize("num_workers,unit_bytes", [(1, 200), (2, 200), (1, 10**9)])
def test_pieces_scanned_from_their_shards_are_named_and_found_as_from_frames(tmp_path: Path, num_workers: int, unit_bytes: int) -> None:
    """The residual re-scan's units are the clean shards' rows, a piece named doc_id#piece (a
    whole document doc_id#): the hits of the frames it replaced, under the first scan's ignored seeds."""
    docs = corpus()
    pieces = docs.select("doc_id", "text").with_columns(
        pl.when(pl.int_range(pl.len()) % 3 == 0).then(pl.int_range(pl.len()) % 2).otherwise(None).cast(pl.Int32).alias("piece"))
    shards = write_shards(pieces, tmp_path / "clean", prefix="c", max_rows=13)
    config = DecontamConfig()
    index = build_index(suite(*ITEMS), config)
    with scratch_space(tmp_path / "first", ScaleConfig(unit_bytes=2_000)) as scratch:
        ignored = scan_shards(scratch, shards.shards, index, config).ignored
    assert ignored.height > 0
    named = pieces.select(pl.concat_str([pl.col("doc_id"), pl.col("piece").cast(pl.String).fill_null("")], separator="#").alias("doc_id"), "text")
    with scratch_space(tmp_path / "frames", ScaleConfig(unit_bytes=unit_bytes)) as scratch:
        expected = scan_frames(scratch, [named], index, config, ignored).hits
    with scratch_space(tmp_path / "shards", ScaleConfig(unit_bytes=unit_bytes, num_workers=num_workers)) as scratch:
        found = scan_shards(scratch, shards.shards, index, config, ignored=ignored, ids=("doc_id", "piece")).hits
    assert expected.height >= 5 and expected["doc_id"].str.contains("#").all()
    assert_frame_equal(found, expected)
