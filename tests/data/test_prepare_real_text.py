"""`ito data prepare` on what real corpora bring: files compressed or packed in a way the reader
does not open (xz, zip, a tar archive, a compressed Parquet file), and eval suites whose short
items the scan cannot look for. Generated in tmp_path; no Dagster run (the summary is built from
the stage outputs it is handed)."""

from __future__ import annotations

import bz2
import gzip
import json
import io
import lzma
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
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
    ("zip", lambda p: zipfile.ZipFile(p, "w").close()),  # an empty archive: its end of directory alone
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


def _tar(lines: bytes) -> bytes:
    sink = io.BytesIO()
    with tarfile.open(fileobj=sink, mode="w") as archive:
        info = tarfile.TarInfo("part.jsonl")
        info.size = len(lines)
        archive.addfile(info, io.BytesIO(lines))
    return sink.getvalue()


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def _parquet(tmp_path: Path) -> bytes:
    pl.DataFrame({"id": ["a"], "text": ["the quick brown fox"]}).write_parquet(tmp_path / "p.parquet")
    return (tmp_path / "p.parquet").read_bytes()


@pytest.mark.parametrize(("pack", "what"), [
    (lambda b: b, "a tar archive"),
    (gzip.compress, "a gzip-compressed tar archive"),
])
def test_a_tar_archive_is_refused_by_name(tmp_path, pack, what) -> None:
    """Its header was read as the first line: "line 1 is not JSON", after the job ran."""
    archive = tmp_path / "corpus.tar"
    archive.write_bytes(pack(_tar(LINE * 20)))
    with pytest.raises(ItoError) as refused:
        corpus.describe([archive])
    assert refused.value.code is ErrorCode.SOURCE_INVALID and f"#1 is {what}" in refused.value.message


@pytest.mark.parametrize(("pack", "name"), [(gzip.compress, "gzip"), (_zstd, "zstd")])
def test_a_compressed_parquet_file_is_refused_by_name(tmp_path, pack, name) -> None:
    packed = tmp_path / "p.parquet.packed"
    packed.write_bytes(pack(_parquet(tmp_path)))
    with pytest.raises(ItoError) as refused:
        corpus.describe([packed])
    assert refused.value.code is ErrorCode.SOURCE_INVALID and f"#1 is a {name}-compressed Parquet file" in refused.value.message


def test_a_line_saying_ustar_where_a_tar_header_would_is_jsonl(tmp_path) -> None:
    """Only a tar header's NUL-holding magic counts: Spanish text ("gustar") may sit at byte 257."""
    prefix = b'{"id": "es", "text": "'
    line = prefix + b"x" * (257 - len(prefix)) + b'ustar  y gustar"}\n'
    (tmp_path / "es.jsonl").write_bytes(line)
    (tmp_path / "es.jsonl.gz").write_bytes(gzip.compress(line + line))
    assert [f.format for f in corpus.describe([tmp_path / "es.jsonl", tmp_path / "es.jsonl.gz"])] == ["jsonl", "jsonl"]


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
                                   num_contaminated_cut=0, num_clean_rows=1, holds=True, num_duplicate_contaminated=0)
    clean = SimpleNamespace(conservation=conservation, shards=ShardSet(str(tmp_path), ()),
                            decisions=Shard(str(decisions), "0" * 64, 1))
    decontam = SimpleNamespace(decontam_config=DecontamConfig)
    return SimpleNamespace(clean=clean, decontam=decontam, run_id="r", num_checks_passed=10, warnings=())


def _summary(tmp_path: Path, prepared: SimpleNamespace):
    verified = SimpleNamespace(manifest=SimpleNamespace(name="c"), digest="sha256:" + "1" * 64, short_digest="1" * 12)
    source = {"num_documents": 1, "num_empty_skipped": 0}
    files = [SimpleNamespace(uri="file:///c.jsonl", sha256="2" * 64, format="jsonl", num_bytes=10)]
    return data_command._summary(verified, _suite(), files, prepared, None, tmp_path / "m.json", tmp_path, [source])


def test_duplicates_that_matched_eval_items_are_in_the_summary(tmp_path) -> None:
    """Removed as duplicates, they are not in "contaminated", while `ito audit manifest`'s
    contamination table counts them: the summary says how many, so the two agree."""
    prepared = _prepared(tmp_path)
    c = prepared.clean.conservation
    c.num_input, c.num_duplicate, c.num_duplicate_contaminated = 3, 2, 2
    result = _summary(tmp_path, prepared)
    assert result.data["documents"]["duplicate_contaminated"] == 2
    line = next(line for line in result.text if line.startswith("documents:"))
    assert "2 duplicates, 0 contaminated (0 dropped, 0 cut); 2 of the duplicates matched eval items too" in line


def test_items_too_short_to_look_for_are_named_in_the_summary(tmp_path) -> None:
    """An item under the index's shortest view, answer included, matches no document whatever it
    holds: the summary said "3 items" as if all were looked for."""
    result = _summary(tmp_path, _prepared(tmp_path))
    assert result.data["eval_suite"]["unprotected_items"] == ["short/1", "short 2"]
    line = next(line for line in result.text if "not looked for" in line)
    assert "2 item(s) under 8 words" in line and "short/1, 'short 2'" in line
    json.dumps(result.data)


def _pzstd(data: bytes, magic: int = 0x184D2A50) -> bytes:
    """What pzstd writes: a skippable frame (here, its 4-byte payload) before the zstd frames."""
    return magic.to_bytes(4, "little") + (4).to_bytes(4, "little") + b"\0\0\0\0" + _zstd(data)


@pytest.mark.parametrize("magic", [0x184D2A50, 0x184D2A5F])
def test_a_zstd_file_led_by_a_skippable_frame_is_read_as_zstd(tmp_path, magic) -> None:
    """pzstd's output was taken for plain text: "line 1 is not UTF-8 text"."""
    from ito_assets.data.sources import compression_of, jsonl_records

    path = tmp_path / "part.jsonl.zst"
    path.write_bytes(_pzstd(LINE * 3, magic))
    assert compression_of(path) == "zstd"
    assert [texts for _, texts, _ in jsonl_records(path, "file:///part.jsonl.zst")] == [["the quick brown fox"] * 3]


@pytest.mark.parametrize("head", [0x184D2A40, 0x184D2A60, 0x184D2B50])
def test_bytes_next_to_the_skippable_magic_are_not_zstd(tmp_path, head) -> None:
    from ito_assets.data.sources import compression_of

    path = tmp_path / "part.bin"
    path.write_bytes(head.to_bytes(4, "little") + LINE)
    assert compression_of(path) is None
