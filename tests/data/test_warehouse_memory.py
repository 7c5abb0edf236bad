"""The warehouse runs under a fixed memory cap, so what it reads must stay bounded whatever the
corpus: the `documents` rows take each document's length from the source shard, never its text,
and a write that still needs more than the cap is a coded error, not a crash."""

from __future__ import annotations

import json
import random
import string

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from ito_assets.data import warehouse
from ito_assets.data.lineage import ParquetRows, write_tables
from ito_assets.data.shards import write_table
from ito_assets.errors import ErrorCode, ItoError
from test_source_pieces import _manifest, sources_stage

# Small enough that one row group's text (below) is several times the cap.
CAP_MB = 16


def _texts(count: int, chars: int) -> list[str]:
    # Random words compress poorly, like real text: the row group's decoded text is what counts.
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(5_000)]
    return [" ".join(rng.choices(words, k=chars // 6))[:chars] + " é" for _ in range(count)]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_row_group_of_more_text_than_the_warehouse_cap_prepares(tmp_path, monkeypatch, num_workers):
    monkeypatch.setattr(warehouse, "MEMORY_LIMIT_MB", CAP_MB)
    texts = _texts(24, 2_000_000)  # 48 MB of text in one row group of the source shard
    (tmp_path / "big.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    _manifest(tmp_path, [(tmp_path / "big.jsonl", "jsonl")])
    stage = sources_stage(tmp_path, "state", num_workers=num_workers)
    shard = stage.shards.shards[0].path
    assert pq.ParquetFile(shard).metadata.num_row_groups == 1
    assert sum(len(t) for t in texts) > 2 * CAP_MB * 2**20
    con = duckdb.connect(str(tmp_path / "state" / "warehouse.duckdb"), read_only=True)
    lengths = [n for (n,) in con.execute("SELECT num_chars FROM documents ORDER BY row").fetchall()]
    con.close()
    assert lengths == [len(t) for t in texts]
    assert pl.read_parquet(shard, columns=["num_chars"])["num_chars"].to_list() == lengths


def test_a_write_beyond_the_warehouse_cap_is_out_of_memory_and_keeps_the_earlier_rows(tmp_path, monkeypatch):
    """A journal record of an older version still computes lengths from the text: such a read past
    the cap is refused with a code, the table's earlier rows kept."""
    path = tmp_path / "warehouse.duckdb"
    small = write_table(pl.DataFrame({"doc_id": ["a"], "text": ["short"]}), tmp_path / "small.parquet")
    write_tables(path, "m", {"documents": ParquetRows((small,), {"doc_id": "doc_id", "num_chars": "length(text)"})})
    big = tmp_path / "big.parquet"
    pl.DataFrame({"doc_id": [str(i) for i in range(24)], "text": _texts(24, 2_000_000)}).write_parquet(big, row_group_size=8192)
    rows = ParquetRows((write_table(pl.read_parquet(big), big),), {"doc_id": "doc_id", "num_chars": "length(text)"})
    monkeypatch.setattr(warehouse, "MEMORY_LIMIT_MB", CAP_MB)
    with pytest.raises(ItoError) as raised:
        write_tables(path, "m", {"documents": rows})
    assert raised.value.code is ErrorCode.WAREHOUSE_OUT_OF_MEMORY
    assert not raised.value.retryable
    assert f"{CAP_MB} MB memory cap" in raised.value.message and str(tmp_path) not in raised.value.message
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT doc_id, num_chars FROM documents").fetchall() == [("a", 5)]
    con.close()


def test_a_rebuild_beyond_the_warehouse_cap_is_out_of_memory_too(tmp_path, monkeypatch):
    """A warehouse deleted by hand is rebuilt before the next write: a replayed record past the cap
    was DuckDB's own exception there (an internal error to every verb)."""
    path = tmp_path / "warehouse.duckdb"
    big = tmp_path / "big.parquet"
    pl.DataFrame({"doc_id": [str(i) for i in range(24)], "text": _texts(24, 2_000_000)}).write_parquet(big, row_group_size=8192)
    rows = ParquetRows((write_table(pl.read_parquet(big), big),), {"doc_id": "doc_id", "num_chars": "length(text)"})
    write_tables(path, "m", {"documents": rows})  # under the real cap, as an older version wrote it
    monkeypatch.setattr(warehouse, "MEMORY_LIMIT_MB", CAP_MB)
    path.unlink()
    with pytest.raises(ItoError) as raised:
        write_tables(path, "other", {"sources": pl.DataFrame({"source_index": [0]})})
    assert raised.value.code is ErrorCode.WAREHOUSE_OUT_OF_MEMORY
