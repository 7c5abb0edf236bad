"""The kept shards in parts (several workers, or Ray): each part of the representatives' side
file drops its removed rows as a task, then each kept shard is a task cut from those files; the
one pass's shards, byte for byte."""

from __future__ import annotations

import random
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from polars.testing import assert_frame_equal

from ito_assets.data import dedup_units, exact_units, kept_units
from ito_assets.data.completion import MARKERS
from ito_assets.data.config import DedupConfig, ScaleConfig
from ito_assets.data.dedup_units import deduplicate_units, representative_parts
from ito_assets.data.scratch import FINISHED, scratch_space
from ito_assets.data.shards import write_shards
from reference_impl import deduplicate, kept_documents
from data_frames import edit_words, frame
from test_dedup_units import TINY, corpus
from test_source_pieces import _threads, package_paragraphs


@contextmanager
def _pool(num_workers: int, engine: str = "local"):
    """The step's pool as threads of this process, where the tests' failures are planted (none
    for one worker, as the real pool)."""
    if num_workers <= 1:
        yield None
        return
    with _threads(num_workers, engine) as pool:
        yield pool


@pytest.fixture
def on_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (dedup_units, exact_units, kept_units):
        monkeypatch.setattr(module, "worker_pool", _pool)


def _kept(root: Path, shards, num_workers: int, max_rows: int):
    scale = ScaleConfig(unit_bytes=TINY.unit_bytes, pair_batch=TINY.pair_batch, memory_limit_mb=128, num_workers=num_workers)
    with scratch_space(root / "_scratch", scale) as scratch:
        deduplicate_units(scratch, shards.shards, DedupConfig(), root / "decisions.parquet")
        in_parts = representative_parts(scratch) is not None
        kept = kept_units.kept_shards(scratch, root / "kept", max_rows, None)
        return kept, in_parts, scratch.units_resumed


def _files(shard_set) -> list[tuple[str, str, int]]:
    return [(Path(s.path).name, s.sha256, s.num_rows) for s in shard_set.shards]


@pytest.mark.parametrize("max_rows", [7, 37, 100_000])
def test_the_kept_shards_in_parts_are_the_one_pass_s(tmp_path: Path, on_threads, max_rows: int) -> None:
    docs = corpus(seed=1)
    expected, counts = deduplicate(docs, DedupConfig())
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    one, one_in_parts, _ = _kept(tmp_path / "one", shards, 1, max_rows)
    parts, in_parts, _ = _kept(tmp_path / "parts", shards, 2, max_rows)
    assert (one_in_parts, in_parts) == (False, True)
    assert _files(parts) == _files(one) and len(parts.shards) == -(-one.num_rows // max_rows)
    assert_frame_equal(parts.read(), kept_documents(docs, expected))
    assert counts.near.num_removed > 5  # rows were dropped inside the parts


def test_a_rerun_after_a_failed_part_keeps_only_the_parts_left(tmp_path: Path, on_threads, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = corpus(seed=1)
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    one, _, _ = _kept(tmp_path / "one", shards, 1, 25)
    real, seen = np.isin, []

    def failing(*args, **kwargs):
        seen.append(1)
        if len(seen) == 4:
            raise RuntimeError("a worker lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(kept_units.np, "isin", failing)
    with pytest.raises(RuntimeError, match="a worker lost"):
        _kept(tmp_path / "state", shards, 2, 25)
    markers = {phase.name: len(list(phase.glob(MARKERS))) for phase in (tmp_path / "state" / FINISHED).iterdir()}
    assert 0 < markers["kept-rows"]
    monkeypatch.setattr(kept_units.np, "isin", real)
    again, _, resumed = _kept(tmp_path / "state", shards, 2, 25)
    assert _files(again) == _files(one)
    assert resumed == sum(markers.values())


def test_no_document_gives_the_one_pass_s_one_empty_shard(tmp_path: Path, on_threads) -> None:
    shards = write_shards(frame([], source_index=0), tmp_path / "source", prefix="d", max_rows=37)
    one, _, _ = _kept(tmp_path / "one", shards, 1, 25)
    parts, in_parts, _ = _kept(tmp_path / "parts", shards, 2, 25)
    assert in_parts and _files(parts) == _files(one) and [s.num_rows for s in parts.shards] == [0]


def test_on_text_we_did_not_write_the_parts_write_the_one_pass_s_decisions_and_kept_shards(tmp_path: Path, on_threads) -> None:
    """The installed packages' descriptions, a paragraph a document (their licence and install
    boilerplate shared between packages), with exact copies and near copies planted."""
    rng, texts = random.Random(5), []
    for i, paragraph in enumerate(package_paragraphs()):
        texts.append(paragraph)
        num_words = len(paragraph.split())
        if i % 5 == 0:
            texts.append(paragraph)
        if i % 7 == 0 and num_words >= 40:
            texts.append(edit_words(rng, paragraph, num_words // 40))
    docs = frame(texts)
    expected, counts = deduplicate(docs, DedupConfig())
    shards = write_shards(docs, tmp_path / "source", prefix="d", max_rows=37)
    one, _, _ = _kept(tmp_path / "one", shards, 1, 25)
    parts, in_parts, _ = _kept(tmp_path / "parts", shards, 2, 25)
    assert in_parts and _files(parts) == _files(one)
    assert (tmp_path / "parts" / "decisions.parquet").read_bytes() == (tmp_path / "one" / "decisions.parquet").read_bytes()
    assert_frame_equal(parts.read(), kept_documents(docs, expected))
    assert counts.exact.num_removed > 20 and counts.near.num_removed > 5
