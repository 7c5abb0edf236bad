"""Deduplication in the step's memory: the streamed path's bytes, and the rule that picks it."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from ito_assets.data import dedup_units
from ito_assets.data.config import DedupConfig, ScaleConfig
from ito_assets.data.dedup_memory import text_bytes
from ito_assets.data.dedup_units import deduplicate_units, in_memory, kept_frames, load_removals
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import Shard, write_shard_stream, write_shards
from ito_assets.data.sources import DOCUMENT_SCHEMA
from ito_assets.errors import ErrorCode, ItoError
from test_dedup_units import TINY, corpus

MB = 2**20


def run(tmp: Path, docs: pl.DataFrame, scale: ScaleConfig, tiers: pl.DataFrame | None = None):
    shards = write_shards(docs, tmp / "source", prefix="d", max_rows=37)
    with scratch_space(tmp / "_scratch", scale) as scratch:
        table, counts = deduplicate_units(scratch, shards.shards, DedupConfig(), tmp / "decisions.parquet", tiers=tiers)
        kept = write_shard_stream(kept_frames(scratch), tmp / "kept", prefix="k", max_rows=25, schema=DOCUMENT_SCHEMA)
        removed, num_representatives = load_removals(scratch)
    return table, counts, kept.read(), (removed.tolist(), num_representatives)


@pytest.mark.parametrize("contaminated", [False, True])
def test_in_memory_writes_the_streamed_paths_bytes(tmp_path: Path, monkeypatch, contaminated: bool) -> None:
    """Exact copies across sources, near-copies, chains, empty and short texts; with contaminated
    documents last in the keep order or without: the same decisions file byte for byte, the same
    counters, removals and kept documents."""
    docs = corpus(3)
    tiers = pl.DataFrame({"doc_id": docs["doc_id"].head(9), "tier": [1, 2, 1, 2, 1, 2, 1, 2, 1]}, schema={"doc_id": pl.String, "tier": pl.Int8}) if contaminated else None
    calls = []
    original = dedup_units.deduplicate_in_memory
    monkeypatch.setattr(dedup_units, "deduplicate_in_memory", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    streamed = run(tmp_path / "streamed", docs, TINY, tiers)
    assert calls == []
    memory = run(tmp_path / "memory", docs, ScaleConfig(), tiers)
    assert calls == [1]
    assert memory[0].sha256 == streamed[0].sha256 and memory[0].num_rows == streamed[0].num_rows == docs.height
    assert memory[1] == streamed[1] and memory[1].exact.num_removed > 5 and memory[1].near.num_removed > 5
    assert memory[3] == streamed[3]
    assert_frame_equal(memory[2], streamed[2])


def test_an_empty_corpus_in_memory(tmp_path: Path) -> None:
    table, counts, kept, removals = run(tmp_path, pl.DataFrame(schema=DOCUMENT_SCHEMA), ScaleConfig())
    assert table.num_rows == 0 and counts.num_input == 0 and kept.height == 0 and removals == ([], 0)


@pytest.mark.parametrize(
    ("scale", "text", "expected"),
    [
        (ScaleConfig(in_memory_mb=32), 32 * MB, True),  # at the limit
        (ScaleConfig(in_memory_mb=32), 32 * MB + 1, False),  # a byte past it
        (ScaleConfig(in_memory_mb=32), 0, True),
        (ScaleConfig(in_memory_mb=1), MB - 1, True),
        (ScaleConfig(in_memory_mb=0), 0, False),  # 0 always streams, an empty corpus too
        (ScaleConfig(in_memory_mb=32, num_workers=2), 1, False),  # several workers: their pool streams
        (ScaleConfig(in_memory_mb=32, engine="ray"), 1, False),
    ],
)
def test_the_step_takes_a_corpus_in_memory_up_to_in_memory_mb_of_text(monkeypatch, scale: ScaleConfig, text: int, expected: bool) -> None:
    monkeypatch.setattr(dedup_units, "text_bytes", lambda shards, up_to: text)
    assert in_memory([], scale) is expected


@pytest.mark.parametrize(("rows", "expected"), [(250_000, True), (250_001, False), (0, True)])
def test_and_up_to_in_memory_documents(monkeypatch, rows: int, expected: bool) -> None:
    """Tiny texts count little as text but ~1.4 kB each in memory: the documents are bounded too."""
    monkeypatch.setattr(dedup_units, "text_bytes", lambda shards, up_to: 1)
    shards = [Shard(path="a", sha256="0" * 64, num_rows=rows // 2), Shard(path="b", sha256="0" * 64, num_rows=rows - rows // 2)]
    assert in_memory(shards, ScaleConfig()) is expected
    assert in_memory(shards, ScaleConfig(in_memory_documents=rows)) is True


@pytest.mark.parametrize("field", ["in_memory_mb", "in_memory_documents"])
def test_in_memory_limits_below_zero_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ScaleConfig(**{field: -1})
    assert getattr(ScaleConfig(**{field: 0}), field) == 0


def test_text_bytes_are_the_texts_bytes_and_four_a_row(tmp_path: Path) -> None:
    """Whatever the texts: ASCII, multi-byte, empty, null; distinct ones, which the writer lays
    out PLAIN, and repeated ones, which it puts in a dictionary (whose footer then tells only the
    dictionary's bytes)."""
    rng = random.Random(4)
    distinct = ["".join(rng.choices("abcdé日 ", k=rng.randint(0, 200))) for _ in range(4_000)]
    repeated = ["é" * 300, "", None, "日本語のテキスト" * 40] * 25
    texts = distinct + repeated
    docs = pl.DataFrame({"doc_id": [f"d{i:05d}" for i in range(len(texts))], "text": texts}, schema={"doc_id": pl.String, "text": pl.String})
    shards = write_shards(docs, tmp_path, prefix="d", max_rows=4_000).shards
    assert [pq.ParquetFile(s.path).metadata.row_group(0).column(1).has_dictionary_page for s in shards] == [False, True]
    exact = int(docs["text"].str.len_bytes().fill_null(0).sum())
    counted = text_bytes(shards, up_to=10**12)
    assert exact <= counted <= exact + 4 * docs.height + 1_000 * len(shards)
    # Counting stops once past the limit: the dictionary's texts are not read to their end.
    assert exact // 2 < text_bytes(shards, up_to=exact // 2) < counted


def test_a_full_disk_while_the_in_memory_decisions_are_written(tmp_path: Path, monkeypatch) -> None:
    """STORAGE_FULL, retryable, naming the file; no half-written decisions file stays."""

    class FillsTheDisk(pq.ParquetWriter):
        def write_batch(self, batch, *args, **kwargs):
            super().write_batch(batch, *args, **kwargs)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "ParquetWriter", FillsTheDisk)
    with pytest.raises(ItoError) as info:
        run(tmp_path, corpus(1), ScaleConfig())
    assert info.value.code is ErrorCode.STORAGE_FULL and info.value.retryable and "decisions.parquet" in info.value.message
    assert [f.name for f in tmp_path.iterdir() if "decisions" in f.name] == []


def test_the_kept_side_file_refuses_removals_out_of_step(tmp_path: Path) -> None:
    """The removals name how many representatives the side file must hold: a side file from
    another run is caught, not filtered by the wrong positions."""
    docs = corpus(2)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    with scratch_space(tmp_path / "_scratch", ScaleConfig()) as scratch:
        deduplicate_units(scratch, shards.shards, DedupConfig(), tmp_path / "decisions.parquet")
        removed, num_representatives = load_removals(scratch)
        np.savez(scratch.folder / dedup_units.REMOVED_FILE, removed=removed, num_representatives=np.int64(num_representatives + 1))
        with pytest.raises(AssertionError, match="out of step"):
            list(kept_frames(scratch))
