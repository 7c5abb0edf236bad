"""ito_assets.data.source_pieces: the sources parsed in pieces give the bytes one pass gives.

The corpus is text we did not write: the package descriptions (METADATA) of the installed
distributions, a paragraph a record, documents of every length, with blank lines, whitespace-only
texts, decomposed accents and ids of both kinds, as plain JSONL, gzip JSONL and Parquet of many
row groups."""

from __future__ import annotations

import gzip
import hashlib
import json
import site
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import examples
from ito_assets.data import source_pieces, stages
from ito_assets.data.config import DataPrepConfig, ScaleConfig
from ito_assets.data.source_pieces import line_spans, row_group_runs
from ito_assets.data.scratch import scratch_space
from ito_assets.data.shards import part_tasks, write_shard_stream
from ito_assets.data.sources import DOCUMENT_SCHEMA, SOURCE_SHARD_SCHEMA, SourceRead, read_source
from ito_assets.data.stages import run_sources
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DataReference
from ito_assets.manifest.verify import verify_manifest
from ito_assets.settings import PROJECT_ROOT

SMALL_PIECES = 3_000  # bytes: tens of pieces per source


def package_paragraphs() -> list[str]:
    """Paragraphs of the installed packages' descriptions, in a fixed order."""
    folders = sorted(Path(p) for p in site.getsitepackages())
    files = sorted(f for folder in folders for f in folder.glob("*.dist-info/METADATA"))[:40]
    assert len(files) >= 20, "too few installed distributions to build the corpus"
    return [p for f in files for p in f.read_text(errors="replace").split("\n\n")]


def _records(paragraphs: list[str]) -> list[dict]:
    records = []
    for i, text in enumerate(paragraphs):
        if i % 17 == 0:
            text = unicodedata.normalize("NFD", text + " café")  # normalisation changes it
        if i % 29 == 0:
            text = " \t "  # empty after strip: skipped and counted
        records.append({"id": i if i % 2 else f"r{i}", "text": text})
    return records


def _reference(path: Path, fmt: str) -> dict:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return DataReference(uri=f"dataroot://{path.name}", sha256=digest, license="CC0-1.0", format=fmt).model_dump(mode="json", exclude_none=True)


def _manifest(root: Path, files: list[tuple[Path, str]]) -> Path:
    manifest = json.loads((PROJECT_ROOT / "data/fixtures/manifests/fixture-small.json").read_text())
    provenance = manifest["data"][0]["decontamination"]
    manifest["data"] = [{**_reference(path, fmt), "decontamination": provenance} for path, fmt in files]
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root / "manifest.json"


def _jsonl(records: list[dict], blank_every: int = 11) -> bytes:
    lines = []
    for i, record in enumerate(records):
        lines.append(json.dumps(record, ensure_ascii=i % 3 == 0))
        if i % blank_every == 0:
            lines.append("")  # a blank line: a row, no record
    return "\n".join(lines).encode()  # the last line has no newline


def write_corpus(root: Path) -> Path:
    """The three sources and their manifest under `root` (returned)."""
    records = _records(package_paragraphs())
    third = len(records) // 3
    plain, packed, table = records[:third], records[third:2 * third], records[2 * third:]
    (root / "a.jsonl").write_bytes(_jsonl(plain))
    (root / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(packed), mtime=0))
    pq.write_table(pa.table({"id": [str(r["id"]) for r in table], "text": [r["text"] for r in table]}), root / "c.parquet", row_group_size=20)
    _manifest(root, [(root / "a.jsonl", "jsonl"), (root / "b.jsonl.gz", "jsonl"), (root / "c.parquet", "parquet")])
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("pieces").resolve())


def sources_stage(root: Path, state: str, shard_max_rows: int = DataPrepConfig().shard_max_rows, **scale):
    verified = verify_manifest(str(root / "manifest.json"))
    config = DataPrepConfig(scale=ScaleConfig(**scale), shard_max_rows=shard_max_rows)
    return run_sources(verified, root, root / state, root / state / "warehouse.duckdb", config)


def one_pass(root: Path, state: str, shard_max_rows: int) -> list[str]:
    """The shards' digests when each verified source is read in one pass, a batch at a time,
    and streamed into the shards."""
    verified = verify_manifest(str(root / "manifest.json"))
    with scratch_space(root / state / "_scratch", ScaleConfig()) as scratch:
        reads = [SourceRead(ref, i, root, scratch.folder) for i, ref in enumerate(verified.manifest.data)]
        frames = (frame for read in reads for frame in read.frames())
        shards = write_shard_stream(frames, root / state / "source", prefix="documents", max_rows=shard_max_rows, schema=SOURCE_SHARD_SCHEMA)
    return [s.sha256 for s in shards.shards]


def shard_digests(stage) -> list[str]:
    return [s.sha256 for s in stage.shards.shards]


# --- where a file is cut ---

@settings(max_examples=examples(100, 1_000), deadline=None)
@given(lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=40),
       trailing=st.booleans(), target=st.integers(1, 200), chunk=st.integers(1, 64))
def test_spans_start_at_line_starts_end_on_the_first_line_end_past_the_target_and_count_rows(tmp_path_factory, lines, trailing, target, chunk):
    data = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    path = tmp_path_factory.mktemp("spans") / "f.jsonl"
    path.write_bytes(data)
    spans = line_spans(path, target, chunk_bytes=chunk)
    assert (spans == []) == (data == b"")  # an empty file has no range (its one piece reads it whole)
    assert [s for s, _, _ in spans] == [0, *(e for _, e, _ in spans[:-1])][:len(spans)]  # contiguous from the start
    assert (spans[-1][1] if spans else 0) == len(data)  # to the end
    for start, end, first_row in spans:
        assert start == 0 or data[start - 1:start] == b"\n"
        assert first_row == data.count(b"\n", 0, start)
        if end < len(data):  # every range but the last ends on the first newline at or past the target
            assert data.find(b"\n", start + target - 1) == end - 1


@pytest.mark.parametrize("target,ends", [(19, [20, 40, 60]), (20, [20, 40, 60]), (21, [30, 60])])
def test_a_range_ends_on_the_first_line_end_at_its_target(tmp_path, target, ends):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"123456789\n" * 6)  # lines of 10 bytes
    assert [end for _, end, _ in line_spans(path, target)] == ends
    assert [row for _, _, row in line_spans(path, target)] == [end // 10 for end in [0, *ends[:-1]]]


def test_a_line_longer_than_the_target_is_a_range_of_its_own(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"x" * 100 + b"\nab\ncd\n")
    assert line_spans(path, 3) == [(0, 101, 0), (101, 104, 1), (104, 107, 2)]


def test_row_groups_run_until_their_uncompressed_bytes_reach_the_target(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"document {i:04d}" for i in range(60)]}), path, row_group_size=10)
    group = pq.ParquetFile(path).metadata.row_group(0).total_byte_size
    sizes = [pq.ParquetFile(path).metadata.row_group(i).total_byte_size for i in range(6)]
    assert set(sizes) == {group}  # equal groups, so the boundary is exact
    assert row_group_runs(path, "u", group) == [(i, i + 1, 10 * i) for i in range(6)]
    assert row_group_runs(path, "u", group - 1) == [(i, i + 1, 10 * i) for i in range(6)]
    assert row_group_runs(path, "u", group + 1) == [(0, 2, 0), (2, 4, 20), (4, 6, 40)]
    assert row_group_runs(path, "u", 100 * group) == [(0, 6, 0)]


@settings(max_examples=examples(200, 2_000), deadline=None)
@given(rows=st.lists(st.integers(0, 30), max_size=12), max_rows=st.integers(1, 40))
def test_parts_are_the_streams_parts_cut_from_the_files(rows, max_rows):
    files = [(f"f{i}", n) for i, n in enumerate(rows)]
    tasks = part_tasks(files, Path("staging"), prefix="documents", max_rows=max_rows, schema=DOCUMENT_SCHEMA)
    total = sum(rows)
    assert len(tasks) == max(1, -(-total // max_rows))  # an empty set still has one (empty) part
    assert [t.name for t in tasks] == [f"documents-{i:05d}.parquet" for i in range(len(tasks))]
    expected = [(path, row) for path, n in files for row in range(n)]
    cut = [(path, row) for t in tasks for path, first, n in t.slices for row in range(first, first + n)]
    assert cut == expected  # every row once, in order
    sizes = [sum(n for _, _, n in t.slices) for t in tasks]
    assert all(size == max_rows for size in sizes[:-1]) and 0 < sizes[-1] <= max_rows if total else sizes == [0]
    assert all(n > 0 for t in tasks for _, _, n in t.slices)


# --- the same documents ---

@pytest.mark.parametrize("shard_max_rows", [7, 97, 100_000])
def test_pieces_and_parts_write_the_bytes_of_one_pass(corpus, shard_max_rows):
    expected = one_pass(corpus, f"pass-{shard_max_rows}", shard_max_rows)
    assert len(expected) > 1 or shard_max_rows == 100_000
    stage = sources_stage(corpus, f"pieces-{shard_max_rows}", shard_max_rows=shard_max_rows, unit_bytes=SMALL_PIECES, num_workers=2)
    assert shard_digests(stage) == expected

def test_pieces_on_two_workers_write_the_shards_and_counts_one_pass_writes_on_one(corpus):
    whole = sources_stage(corpus, "whole", unit_bytes=SMALL_PIECES)  # one worker: one pass
    assert whole.num_pieces == 3
    big = sources_stage(corpus, "big", num_workers=2)  # the default unit (8 MiB): one piece a source
    small = sources_stage(corpus, "small", unit_bytes=SMALL_PIECES, num_workers=2)
    assert big.num_pieces == 3 and small.num_pieces > 20
    assert shard_digests(big) == shard_digests(small) == shard_digests(whole)
    assert big.sources == small.sources == whole.sources
    counts = whole.sources
    assert all(c.num_documents > 0 for c in counts)
    assert sum(c.num_empty_skipped for c in counts) > 0 and sum(c.num_changed_by_normalization for c in counts) > 0
    # And they are what one pass over each file reads (SourceRead, the in-memory path).
    verified = verify_manifest(str(corpus / "manifest.json"))
    for index, ref in enumerate(verified.manifest.data):
        _, expected = read_source(ref, index, corpus)
        assert counts[index] == expected


def _invalid(root: Path, state: str, **scale) -> ItoError:
    with pytest.raises(ItoError) as info:
        sources_stage(root, state, **scale)
    assert info.value.code is ErrorCode.SOURCE_INVALID
    return info.value


def test_an_invalid_line_deep_in_a_file_is_named_as_one_pass_names_it(tmp_path):
    root = tmp_path.resolve()
    lines = [json.dumps({"text": f"document number {i} " * 5}) for i in range(400)]
    lines[250] = '{"text": 12}'  # the first invalid record
    lines[390] = "not json"
    path = root / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _manifest(root, [(path, "jsonl")])
    verified = verify_manifest(str(root / "manifest.json"))
    with pytest.raises(ItoError) as one_pass:
        read_source(verified.manifest.data[0], 0, root)
    assert one_pass.value.message.endswith("line 251: 'text' is not a string")
    for workers in (1, 2):
        assert _invalid(root, f"state{workers}", unit_bytes=1_000, num_workers=workers).message == one_pass.value.message


def test_a_null_text_in_a_later_row_group_is_named_by_its_row(tmp_path):
    root = tmp_path.resolve()
    texts = [f"row {i} of the table" for i in range(100)]
    texts[73] = None
    pq.write_table(pa.table({"text": texts}), root / "c.parquet", row_group_size=10)
    _manifest(root, [(root / "c.parquet", "parquet")])
    verified = verify_manifest(str(root / "manifest.json"))
    with pytest.raises(ItoError) as one_pass:
        read_source(verified.manifest.data[0], 0, root)
    assert "row 73" in one_pass.value.message
    assert _invalid(root, "state", unit_bytes=100, num_workers=2).message == one_pass.value.message


@contextmanager
def _threads(num_workers: int, engine: str = "local"):
    """The step's pool as threads of this process, where the test's failure is planted."""
    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        yield pool


def test_a_rerun_after_a_failed_piece_parses_only_the_pieces_left(corpus, monkeypatch):
    done = sources_stage(corpus, "reference", unit_bytes=SMALL_PIECES, num_workers=2)
    real, seen = source_pieces.documents, []

    def failing(ref, source_index, records):
        seen.append(1)
        if len(seen) == 9:  # inside a later piece, after some have finished
            raise RuntimeError("the worker's disk went away")
        return real(ref, source_index, records)

    monkeypatch.setattr(stages, "worker_pool", _threads)
    monkeypatch.setattr(source_pieces, "documents", failing)
    with pytest.raises(RuntimeError):
        sources_stage(corpus, "state", unit_bytes=SMALL_PIECES, num_workers=1)  # one thread: the pieces in order
    monkeypatch.setattr(source_pieces, "documents", real)
    again = sources_stage(corpus, "state", unit_bytes=SMALL_PIECES, num_workers=2)
    assert 0 < again.units_resumed < again.num_pieces
    assert shard_digests(again) == shard_digests(done) and again.sources == done.sources
    assert sources_stage(corpus, "state", unit_bytes=SMALL_PIECES, num_workers=2).units_resumed == 0  # success removes the markers


def test_a_source_of_no_documents_writes_one_pass_s_one_empty_part(tmp_path):
    root = tmp_path.resolve()
    path = root / "blank.jsonl"
    path.write_text("\n".join(json.dumps({"text": " " * i}) for i in range(50)) + "\n\n")
    _manifest(root, [(path, "jsonl")])
    stage = sources_stage(root, "pieces", unit_bytes=100, num_workers=2)
    assert stage.num_pieces > 5 and stage.num_documents == 0 and stage.sources[0].num_empty_skipped == 50
    assert shard_digests(stage) == one_pass(root, "pass", 1_000) and len(stage.shards.shards) == 1


def test_crlf_a_bom_and_no_last_newline_read_as_in_one_pass(tmp_path):
    root = tmp_path.resolve()
    lines = [json.dumps({"id": i, "text": f"line {i} ends with CR LF " * 3}) for i in range(60)]
    (root / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode())
    _manifest(root, [(root / "a.jsonl", "jsonl")])
    stage = sources_stage(root, "pieces", unit_bytes=150, num_workers=2)
    assert stage.num_pieces > 20 and stage.num_documents == 60
    assert shard_digests(stage) == one_pass(root, "pass", 1_000)


def test_empty_row_groups_read_as_in_one_pass(tmp_path):
    root = tmp_path.resolve()
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(root / "c.parquet", schema) as writer:
        for group in range(12):
            rows = [] if group % 3 == 0 else [f"group {group} row {i}" for i in range(group)]
            writer.write_table(pa.table({"text": rows}, schema=schema))
    assert pq.ParquetFile(root / "c.parquet").metadata.num_row_groups == 12
    _manifest(root, [(root / "c.parquet", "parquet")])
    stage = sources_stage(root, "pieces", unit_bytes=1, num_workers=2)
    assert stage.num_pieces == 12 and shard_digests(stage) == one_pass(root, "pass", 1_000)


def _one_pass_error(root: Path) -> str:
    with pytest.raises(ItoError) as caught:
        one_pass(root, "pass", 1_000)
    assert caught.value.code is ErrorCode.SOURCE_INVALID
    return caught.value.message


def test_a_table_with_two_errors_names_the_one_one_pass_names(tmp_path):
    # A null id in row 5 and a null text in row 15, in groups of 10 rows: one pass used to read
    # both in one batch and name the text; each group is a batch now, in either path.
    root = tmp_path.resolve()
    ids, texts = [f"r{i}" for i in range(40)], [f"row {i}" for i in range(40)]
    ids[5], texts[15] = None, None
    pq.write_table(pa.table({"id": ids, "text": texts}), root / "c.parquet", row_group_size=10)
    _manifest(root, [(root / "c.parquet", "parquet")])
    data = json.loads((root / "manifest.json").read_text())
    data["data"][0]["id_field"] = "id"
    (root / "manifest.json").write_text(json.dumps(data))
    expected = _one_pass_error(root)
    assert expected.endswith("row 5 has no field 'id' (or it is null)")
    assert _invalid(root, "pieces", unit_bytes=1, num_workers=2).message == expected


def test_an_unreadable_table_after_a_bad_line_names_the_bad_line(tmp_path):
    root = tmp_path.resolve()
    (root / "a.jsonl").write_text('{"text": "fine"}\n{"text": null}\n')
    (root / "c.parquet").write_bytes(b"PAR1 not a footer PAR1")
    _manifest(root, [(root / "a.jsonl", "jsonl"), (root / "c.parquet", "parquet")])
    expected = _one_pass_error(root)
    assert expected.endswith("line 2: 'text' is not a string")
    assert _invalid(root, "pieces", unit_bytes=1, num_workers=2).message == expected
    # Nothing of an invalid source is kept for a rerun: it is fixed by a new file, under new keys.
    assert not list((root / "pieces").glob("shards/*/_finished/source-pieces/*"))
    (root / "c.parquet").write_bytes(b"PAR1 not a footer PAR1")
    _manifest(root, [(root / "c.parquet", "parquet")])
    assert _invalid(root, "pieces", unit_bytes=1, num_workers=2).message == _one_pass_error(root)


# --- each source verified and cut by a task of its own ---

@pytest.mark.parametrize(("damage", "code"), [("b.jsonl.gz", ErrorCode.SOURCE_DIGEST_MISMATCH), ("c.parquet", ErrorCode.SOURCE_NOT_FOUND)])
def test_a_changed_or_missing_source_fails_the_pieces_as_it_fails_one_pass(tmp_path, damage, code):
    root = write_corpus(tmp_path.resolve())
    (root / "b.jsonl.gz").write_bytes((root / "b.jsonl.gz").read_bytes() + b"\0")  # the second source changed
    if damage == "c.parquet":  # the second source restored, the third gone
        write_corpus(root)
        (root / "c.parquet").unlink()
    errors = []
    for workers in (1, 2):
        with pytest.raises(ItoError) as raised:
            sources_stage(root, f"state-{workers}", unit_bytes=SMALL_PIECES, num_workers=workers)
        errors.append((raised.value.code, raised.value.message))
    assert errors[0] == errors[1] and errors[0][0] is code and damage in errors[0][1]


def test_the_first_bad_source_in_manifest_order_is_the_one_named(tmp_path):
    """The second source changed and the third gone: the tasks verify both at once, and the step
    names the second, as one pass, which stops there, does."""
    root = write_corpus(tmp_path.resolve())
    (root / "b.jsonl.gz").write_bytes(b"not the manifest's bytes")
    (root / "c.parquet").unlink()
    with pytest.raises(ItoError) as raised:
        sources_stage(root, "state", unit_bytes=SMALL_PIECES, num_workers=2)
    assert raised.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH and "b.jsonl.gz" in raised.value.message
    assert not list((root / "state").rglob("*.parquet"))  # no piece parsed, no shard written


def test_each_source_is_cut_by_its_own_task(corpus, monkeypatch):
    cut = []
    real = source_pieces.map_units
    monkeypatch.setattr(source_pieces, "map_units", lambda function, tasks, pool, **kw: (
        cut.extend(t.read.ref.uri for t in tasks) if function is source_pieces.cut_source else None, real(function, tasks, pool, **kw))[1])
    stage = sources_stage(corpus, "cut-tasks", unit_bytes=SMALL_PIECES, num_workers=2)
    assert cut == ["dataroot://a.jsonl", "dataroot://b.jsonl.gz", "dataroot://c.parquet"] and stage.num_pieces > 20
