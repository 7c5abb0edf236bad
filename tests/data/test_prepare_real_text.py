"""`ito data prepare` on what real corpora bring: files compressed in a way the reader does not
open, and eval suites whose short items the scan cannot look for. Generated in tmp_path; no
Dagster run (the summary is built from the stage outputs it is handed)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import zipfile
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from ito_assets.api.commands import data as data_command
from ito_assets.data import corpus
from ito_assets.data.config import DecontamConfig
from ito_assets.data.shards import Shard, ShardSet
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import parse_suite

LINE = b'{"id": "a", "text": "the quick brown fox"}\n'


def _zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("part.jsonl", LINE)


@pytest.mark.parametrize(("name", "write"), [
    ("xz", lambda p: p.write_bytes(lzma.compress(LINE))),
    ("bzip2", lambda p: p.write_bytes(bz2.compress(LINE))),
    ("zip", _zip),
])
def test_a_container_the_reader_does_not_open_is_refused_by_name(tmp_path, name, write) -> None:
    """Read as JSONL, its bytes were refused only after the job ran, as "line 1 is not UTF-8 text"."""
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(LINE)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(LINE + LINE))
    packed = tmp_path / "c.jsonl.packed"
    write(packed)
    with pytest.raises(ItoError) as refused:
        corpus.describe([plain, tmp_path / "b.jsonl.gz", packed])
    assert refused.value.code is ErrorCode.SOURCE_INVALID
    assert f"corpus file #3 is {name}-compressed" in refused.value.message and "gzip or zstd" in refused.value.message
    assert [f.format for f in corpus.describe([plain, tmp_path / "b.jsonl.gz"])] == ["jsonl", "jsonl"]


def _suite() -> object:
    items = [
        {"id": "long/1", "benchmark": "b", "question": "Which standard stream receives the diagnostic messages a command "
         "prints when it fails?", "answer": "standard error"},
        {"id": "short/1", "benchmark": "b", "question": "Which command lists files?", "answer": "ls"},
        {"id": "short 2", "benchmark": "b", "question": "What is 2 + 2?", "answer": "4"},
    ]
    lines = [json.dumps({"suite_id": "short-v1"}), *map(json.dumps, items)]
    return parse_suite("short-v1", "\n".join(lines).encode())


def _prepared(tmp_path: Path) -> SimpleNamespace:
    decisions = tmp_path / "decisions.parquet"
    pl.DataFrame({"doc_id": ["0" * 16], "source_record_id": ["a"], "state": ["kept"], "eval_item_ids": [[]]},
                 schema={"doc_id": pl.String, "source_record_id": pl.String, "state": pl.String,
                         "eval_item_ids": pl.List(pl.String)}).write_parquet(decisions)
    conservation = SimpleNamespace(num_input=1, num_kept=1, num_duplicate=0, num_contaminated=0, num_contaminated_dropped=0,
                                   num_contaminated_cut=0, num_clean_rows=1, holds=True)
    clean = SimpleNamespace(conservation=conservation, shards=ShardSet(str(tmp_path), ()),
                            decisions=Shard(str(decisions), "0" * 64, 1))
    decontam = SimpleNamespace(decontam_config=DecontamConfig)
    return SimpleNamespace(clean=clean, decontam=decontam, run_id="r", num_checks_passed=10, warnings=())


def test_items_too_short_to_look_for_are_named_in_the_summary(tmp_path) -> None:
    """An item under the index's shortest view, answer included, matches no document whatever it
    holds: the summary said "3 items" as if all were looked for."""
    suite = _suite()
    verified = SimpleNamespace(manifest=SimpleNamespace(name="c"), digest="sha256:" + "1" * 64, short_digest="1" * 12)
    source = {"num_documents": 1, "num_empty_skipped": 0}
    files = [SimpleNamespace(uri="file:///c.jsonl", sha256="2" * 64, format="jsonl", num_bytes=10)]
    result = data_command._summary(verified, suite, files, _prepared(tmp_path), None, tmp_path / "m.json", tmp_path, [source])
    assert result.data["eval_suite"]["unprotected_items"] == ["short/1", "short 2"]
    line = next(line for line in result.text if "not looked for" in line)
    assert "2 item(s) under 8 words" in line and "short/1, 'short 2'" in line
    json.dumps(result.data)
