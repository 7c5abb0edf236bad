"""ito_assets.data.sources: verified bytes, NFC text, stable ids, JSONL (plain, gzip, zstd) and
Parquet, with the reference's own field names."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import unicodedata
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers import examples
from ito_assets.data import sources
from ito_assets.data.sources import doc_id, read_source
from ito_assets.data.uris import resolve_uri
from ito_assets.data.text import NORMALIZATION_VERSION
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DataReference

DECOMPOSED = "Cafe\u0301 au lait"  # "e" + combining acute: NFC composes it


def reference(path: Path, fmt: str = "jsonl", sha: str | None = None, **fields) -> DataReference:
    digest = sha or hashlib.sha256(path.read_bytes()).hexdigest()
    return DataReference(uri=f"dataroot://{path.name}", sha256=digest, license="CC0-1.0", format=fmt, **fields)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_bytes("".join(json.dumps(r) + "\n" for r in records).encode())
    return path


def test_reads_jsonl_normalises_and_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": DECOMPOSED}, {"id": "y", "text": "  "}, {"id": "z", "text": "plain"}])
    ref = reference(path)
    docs, counts = read_source(ref, 0, tmp_path)
    assert docs["text"].to_list() == [unicodedata.normalize("NFC", DECOMPOSED), "plain"]
    assert docs["row"].to_list() == [0, 2]
    assert docs["doc_id"].to_list() == [doc_id(ref.sha256, 0), doc_id(ref.sha256, 2)]
    assert counts.num_documents == 2 and counts.num_empty_skipped == 1 and counts.num_changed_by_normalization == 1
    assert counts.normalization == NORMALIZATION_VERSION
    assert docs["license"].unique().to_list() == ["CC0-1.0"]


@pytest.mark.parametrize("native", [True, False], ids=["C where built", "numpy"])
def test_the_ids_of_a_batch_are_each_rows_id(monkeypatch, native) -> None:
    from ito_assets.data import kernels

    monkeypatch.setattr(kernels, "NATIVE", native and kernels.NATIVE)
    rows = np.array([0, 1, 9, 10, 99, 100, 12_345, 2**40, 2**63 - 1], dtype=np.int64)
    for source in ("a" * 64, "0f" * 32, "x"):
        ids = sources.doc_ids(source, rows)
        assert ids.dtype == pl.String and ids.name == "doc_id"
        assert ids.to_list() == [sources.doc_id(source, int(row)) for row in rows]
    assert sources.doc_ids("a" * 64, np.zeros(0, dtype=np.int64)).to_list() == []


def test_ids_are_stable_and_depend_on_source_and_row() -> None:
    assert doc_id("a" * 64, 3) == doc_id("a" * 64, 3)
    assert len({doc_id("a" * 64, 3), doc_id("a" * 64, 4), doc_id("b" * 64, 3)}) == 3
    assert len(doc_id("a" * 64, 3)) == 16


def test_digest_mismatch_blocks(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}])
    with pytest.raises(ItoError) as info:
        read_source(reference(path, sha="f" * 64), 0, tmp_path)
    assert info.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH


def test_reads_parquet(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pl.DataFrame({"id": ["p", "q"], "text": ["one", "two"]}).write_parquet(path)
    docs, counts = read_source(reference(path, "parquet"), 1, tmp_path)
    assert docs["source_record_id"].to_list() == ["p", "q"] and docs["source_index"].to_list() == [1, 1]
    assert counts.format == "parquet"


def test_refuses_bad_records_and_escapes(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"id": 1}\n')
    with pytest.raises(ItoError) as info:
        read_source(reference(path), 0, tmp_path)
    assert info.value.code is ErrorCode.SOURCE_INVALID
    with pytest.raises(ItoError):
        resolve_uri("dataroot://../outside.jsonl", tmp_path)
    missing = DataReference(uri="dataroot://nope.jsonl", sha256="0" * 64, license="CC0-1.0", format="jsonl")
    with pytest.raises(ItoError) as info:
        read_source(missing, 0, tmp_path)
    assert info.value.code is ErrorCode.SOURCE_NOT_FOUND


def test_batches_number_rows_as_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"id": str(i), "text": "" if i % 4 == 1 else f"text {i}"} for i in range(11)]
    jsonl = write_jsonl(tmp_path / "a.jsonl", records)
    parquet = tmp_path / "a.parquet"
    pl.DataFrame(records).write_parquet(parquet)
    whole = {fmt: read_source(reference(path, fmt), 0, tmp_path) for fmt, path in (("jsonl", jsonl), ("parquet", parquet))}
    monkeypatch.setattr(sources, "BATCH_RECORDS", 2)
    for fmt, path in (("jsonl", jsonl), ("parquet", parquet)):
        read = sources.SourceRead(reference(path, fmt), 0, tmp_path, tmp_path / "scratch")
        frames = list(read.frames())
        assert len(frames) >= 4
        assert pl.concat(frames).equals(whole[fmt][0]) and read.counts == whole[fmt][1]
        assert whole[fmt][0]["row"].to_list() == [0, 2, 3, 4, 6, 7, 8, 10] and read.counts.num_empty_skipped == 3
    assert not list((tmp_path / "scratch").iterdir())  # the snapshots are gone


def test_what_is_parsed_is_the_verified_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "the verified text"}])
    ref = reference(path)
    parse = sources.jsonl_records

    def swapped_after_verification(copy: Path, uri: str, **fields):
        path.write_bytes(b'{"text": "a swapped text"}\n')  # the source changes once verified
        return parse(copy, uri, **fields)

    monkeypatch.setattr(sources, "jsonl_records", swapped_after_verification)
    docs, _ = read_source(ref, 0, tmp_path)
    assert docs["text"].to_list() == ["the verified text"]


def test_a_mismatching_snapshot_is_removed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}])
    read = sources.SourceRead(reference(path, sha="f" * 64), 0, tmp_path, tmp_path / "scratch")
    with pytest.raises(ItoError) as info:
        next(read.frames())
    assert info.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH
    assert not list((tmp_path / "scratch").iterdir()) and read.counts is None


def test_a_corrupt_page_is_source_invalid(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    texts = [f"document number {i} " * 20 for i in range(4000)]
    pl.DataFrame({"text": texts}).write_parquet(path, compression="zstd", row_group_size=1000)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # inside a data page; the footer still reads
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))
    with pytest.raises(ItoError) as info:
        read_source(reference(path, "parquet"), 0, tmp_path)
    assert info.value.code is ErrorCode.SOURCE_INVALID


def test_a_changed_source_leaves_the_last_good_output(tmp_path: Path) -> None:
    from ito_assets.data.config import DataPrepConfig
    from ito_assets.data.stages import run_sources
    from ito_assets.manifest.verify import verify_manifest
    from ito_assets.settings import PROJECT_ROOT

    root = tmp_path.resolve()
    first, second = write_jsonl(root / "a.jsonl", [{"text": "the first source"}]), write_jsonl(root / "b.jsonl", [{"text": "the second source"}])
    manifest = json.loads((PROJECT_ROOT / "data" / "fixtures" / "manifests" / "fixture-small.json").read_text())
    provenance = manifest["data"][0]["decontamination"]
    manifest["data"] = [{**reference(p).model_dump(mode="json", exclude_none=True), "decontamination": provenance} for p in (first, second)]
    (root / "manifest.json").write_text(json.dumps(manifest))
    verified = verify_manifest(str(root / "manifest.json"))

    def run():
        return run_sources(verified, root, root / "state", root / "warehouse.duckdb", DataPrepConfig())

    folder = Path(run().shards.folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    second.write_bytes(b'{"text": "a changed second source"}\n')
    with pytest.raises(ItoError) as info:
        run()
    assert info.value.code is ErrorCode.SOURCE_DIGEST_MISMATCH
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


RECORDS = [{"id": "a", "text": "first document"}, {"id": 7, "text": "  "}, {"id": "c", "text": DECOMPOSED}]


def _source_error(ref: DataReference, root: Path) -> ItoError:
    with pytest.raises(ItoError) as info:
        read_source(ref, 0, root)
    assert info.value.code is ErrorCode.SOURCE_INVALID
    return info.value


@pytest.mark.parametrize("compress", [gzip.compress, zstd], ids=["gzip", "zstd"])
def test_compressed_jsonl_reads_as_the_plain_file_and_is_hashed_as_stored(tmp_path: Path, compress) -> None:
    plain = write_jsonl(tmp_path / "plain.jsonl", RECORDS + [{"text": f"document {i}"} for i in range(20)])
    # Told apart by their first bytes, not by their names: neither name says what it is.
    packed = tmp_path / "packed.jsonl"
    packed.write_bytes(compress(plain.read_bytes()))
    ref = reference(packed)
    assert ref.sha256 == hashlib.sha256(packed.read_bytes()).hexdigest() != reference(plain).sha256
    docs, counts = read_source(ref, 0, tmp_path)
    expected, _ = read_source(reference(plain), 0, tmp_path)
    assert docs.drop("doc_id", "source_uri", "source_sha256").equals(expected.drop("doc_id", "source_uri", "source_sha256"))
    assert docs["source_record_id"].to_list()[:2] == ["a", "c"] and counts.num_empty_skipped == 1
    assert counts.num_bytes == packed.stat().st_size


def test_a_plain_file_with_a_compressed_name_is_plain(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "corpus.jsonl.gz", RECORDS)
    assert sources.compression_of(path) is None
    assert read_source(reference(path), 0, tmp_path)[1].num_documents == 2


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_truncated_compressed_stream_is_source_invalid(tmp_path: Path, compression: str) -> None:
    data = "".join(json.dumps({"text": f"line {i} " * 50}) + "\n" for i in range(2000)).encode()
    packed = gzip.compress(data) if compression == "gzip" else zstd(data)
    path = tmp_path / "cut.jsonl"
    path.write_bytes(packed[: len(packed) // 2])
    error = _source_error(reference(path), tmp_path)
    assert compression in error.message and "truncated" in error.message
    # The line it names: whole lines decoded before the fault, not the 0 of a reader that failed
    # its first buffer at once (gzip: the lines zlib decodes from the same bytes, within a piece).
    after = int(error.message.rsplit(" ", 1)[1])
    if compression == "gzip":
        decodable = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(packed[: len(packed) // 2]).count(b"\n")
        assert decodable - 10 <= after <= decodable
    else:
        assert 0 < after < 2000


@pytest.mark.parametrize(("padding", "ok"), [(b"\0", True), (b"\0" * 512, True), (b"\0" * 70_000, True),
                                             (b"\0" * 8 + b"x", False), (b"garbage", False)])
def test_a_gzip_file_padded_with_zero_bytes_reads_whole_and_other_trailing_bytes_stay_refused(
        tmp_path: Path, padding: bytes, ok: bool) -> None:
    """As `gzip -d` reads it ("trailing zero bytes ignored"), a tape's or a block device's padding;
    pyarrow's codec refused it as corrupt, and named a line it had not reached."""
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": f"document {i} " * 40} for i in range(3000)])
    path = tmp_path / "padded.jsonl"
    path.write_bytes(gzip.compress(plain.read_bytes()) + padding)
    if not ok:
        assert "gzip" in _source_error(reference(path), tmp_path).message
        return
    docs, counts = read_source(reference(path), 0, tmp_path)
    expected, _ = read_source(reference(plain), 0, tmp_path)
    assert docs["text"].to_list() == expected["text"].to_list() and counts.num_documents == 3000


def test_jsonl_with_its_own_field_names(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"uid": 41, "body": "one"}, {"uid": "x-2", "body": "two", "text": 3}])
    docs, _ = read_source(reference(path, text_field="body", id_field="uid"), 0, tmp_path)
    assert docs["text"].to_list() == ["one", "two"] and docs["source_record_id"].to_list() == ["41", "x-2"]


@pytest.mark.parametrize("records, fields, message", [
    ([{"text": "ok"}, {"body": "no text"}], {}, "line 2 has no field 'text'"),
    ([{"body": "ok"}], {"text_field": "content"}, "line 1 has no field 'content'"),
    ([{"text": ["a", "list"]}], {}, "line 1: 'text' is not a string"),
    ([{"text": "ok", "id": [1]}], {}, "line 1: 'id' is neither a string nor an integer"),
    ([{"text": "ok", "id": True}], {}, "line 1: 'id' is neither a string nor an integer"),
    ([{"text": "ok", "uid": "u"}, {"text": "ok"}], {"id_field": "uid"}, "line 2 has no field 'uid'"),
    ([["not", "an", "object"]], {}, "line 1 is not a JSON object"),
])
def test_a_missing_field_or_a_wrong_type_names_the_field_and_the_line(tmp_path: Path, records, fields, message) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", records)
    assert message in _source_error(reference(path, **fields), tmp_path).message


def test_parquet_with_its_own_column_names(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pl.DataFrame({"uid": [10, 11], "body": ["one", "two"]}).write_parquet(path)
    docs, _ = read_source(reference(path, "parquet", text_field="body", id_field="uid"), 0, tmp_path)
    assert docs["text"].to_list() == ["one", "two"] and docs["source_record_id"].to_list() == ["10", "11"]


@pytest.mark.parametrize("frame, fields, message", [
    (pl.DataFrame({"text": ["a"]}), {"text_field": "body"}, "has no column 'body'"),
    (pl.DataFrame({"text": [1, 2]}), {}, "column 'text' is not a string column"),
    (pl.DataFrame({"text": ["a", None, "c"]}), {}, "row 1: 'text' is null"),
    (pl.DataFrame({"text": ["a"], "id": [1.5]}), {}, "column 'id' is neither a string nor an integer column"),
    (pl.DataFrame({"text": ["a"]}), {"id_field": "uid"}, "has no column 'uid'"),
    (pl.DataFrame({"text": ["a", "b"], "uid": ["x", None]}), {"id_field": "uid"}, "row 1 has no field 'uid'"),
])
def test_a_bad_parquet_column_names_the_column_and_the_row(tmp_path: Path, frame, fields, message) -> None:
    path = tmp_path / "a.parquet"
    frame.write_parquet(path)
    assert message in _source_error(reference(path, "parquet", **fields), tmp_path).message



@pytest.mark.parametrize(("fields", "hinted"), [({}, True), ({"id_field": "uid"}, False)])
def test_an_unusable_default_id_column_says_how_to_name_another(tmp_path: Path, fields, hinted) -> None:
    """A float `id` nobody asked for stopped the read with no way out named; a named field needs no hint."""
    path = tmp_path / "a.parquet"
    pl.DataFrame({"text": ["a"], "id": [1.5], "uid": [2.5]}).write_parquet(path)
    message = _source_error(reference(path, "parquet", **fields), tmp_path).message
    assert "neither a string nor an integer column" in message
    assert ("name the field that holds them with id_field, `--id-field`" in message) is hinted

@pytest.mark.parametrize(("names", "fields", "message"), [
    (["text", "text"], {}, "has 2 columns named 'text'"),
    (["text", "id", "id"], {}, "has 2 columns named 'id' ('id' is read as each record's own id by default"),
    (["body", "uid", "uid", "uid"], {"text_field": "body", "id_field": "uid"}, "has 3 columns named 'uid'"),
])
def test_a_column_named_twice_is_source_invalid_naming_it(tmp_path: Path, names, fields, message) -> None:
    """pyarrow (and pandas) write a name twice; reading one of them stopped the step with a KeyError."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a"] if i == 0 else ["x"]) for i in range(len(names))], names=names), path)
    error = _source_error(reference(path, "parquet", **fields), tmp_path)
    assert error.code is ErrorCode.SOURCE_INVALID and message in error.message


def test_a_column_named_twice_that_is_not_read_is_no_obstacle(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["one"]), pa.array([1]), pa.array([2])], names=["text", "n", "n"]), path)
    docs, _ = read_source(reference(path, "parquet"), 0, tmp_path)
    assert docs["text"].to_list() == ["one"]


# --- orjson where it agrees with the standard library ---

def _outcome(parse, line: bytes) -> str:
    """What a line gives the sources step: its text and id (the step keeps no other field), or the
    error's code and message."""
    fields = sources.RecordFields(id_required=False)
    try:
        record = parse(line)
        return repr((record[fields.text], sources.record_id(record.get(fields.id), fields, "u: line 1")))
    except ItoError as error:
        return f"{error.code.value}: {error.message}"


def _standard_library_only(line: bytes) -> dict:
    """`jsonl_record` as it was before orjson: json.loads alone."""
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        raise ItoError(ErrorCode.SOURCE_INVALID, "u: line 1 is not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError):
        raise ItoError(ErrorCode.SOURCE_INVALID, "u: line 1 is not JSON") from None
    if not isinstance(record, dict):
        raise ItoError(ErrorCode.SOURCE_INVALID, "u: line 1 is not a JSON object")
    if "text" not in record:
        raise ItoError(ErrorCode.SOURCE_INVALID, "u: line 1 has no field 'text'")
    if not isinstance(record["text"], str):
        raise ItoError(ErrorCode.SOURCE_INVALID, "u: line 1: 'text' is not a string")
    return record


# What orjson refuses or reads otherwise than json.loads does, beside ordinary values.
_SPECIAL = ["NaN", "-Infinity", "1e400", "-0", "2.5", "true", "null", "[1, 2]", '{"a": 1}', '"\\ud800"', '"\\udc00x"',
            '"\\u00e9"', str(2**64), str(-2**63 - 1), str(2**63), str(2**200), "1E5", '"\\u0000"']
_VALUES = st.one_of(st.sampled_from(_SPECIAL), st.integers(-2**70, 2**70).map(str),
                    st.builds(json.dumps, st.text(max_size=20), ensure_ascii=st.booleans()),
                    st.floats(allow_nan=True).map(json.dumps))


@st.composite
def _lines(draw) -> bytes:
    pairs = draw(st.lists(st.tuples(st.sampled_from(["text", "id", "other"]), _VALUES), max_size=5))  # keys may repeat
    body = "{" + ", ".join(f'"{key}": {value}' for key, value in pairs) + "}"
    prefix = draw(st.sampled_from(["", " ", "\ufeff"]))
    suffix = draw(st.sampled_from(["", "\n", "\r\n", " x"]))
    return (prefix + body + suffix).encode(draw(st.sampled_from(["utf-8", "utf-16"])), "surrogatepass")


@settings(max_examples=examples(300, 3_000), deadline=None)
@given(line=_lines())
@example(line=b'{"text": "", "other": 18446744073709551616}')  # orjson's float, in a field the step drops
def test_a_line_reads_as_the_standard_library_reads_it(line):
    assert _outcome(lambda data: sources.jsonl_record(data, 1, "u"), line) == _outcome(_standard_library_only, line)


def _read_outcome(path: Path, fields: sources.RecordFields) -> str:
    """What the whole read gives a file: every (id, text, row), or the error's code and message."""
    try:
        return repr([list(zip(*batch)) for batch in sources.jsonl_records(path, "u", fields)])
    except ItoError as error:
        return f"{error.code.value}: {error.message}"


def _checked_outcome(lines: list[bytes], fields: sources.RecordFields) -> str:
    """The same from the checks alone, a line at a time: `jsonl_record`, `record_id` and the
    lone-surrogate check on every line that is not blank (the read's common lines skip them)."""
    rows = []
    try:
        for row, line in enumerate(lines):
            if not line.strip():
                continue
            record = sources.jsonl_record(line, row + 1, "u", fields)
            where = f"u: line {row + 1}"
            value = sources._text(sources.record_id(record.get(fields.id), fields, where), where, fields.id)
            rows.append((value, sources._text(record[fields.text], where, fields.text), row))
    except ItoError as error:
        return f"{error.code.value}: {error.message}"
    return repr([rows] if rows else [])


@settings(max_examples=examples(200, 2_000), deadline=None)
@given(lines=st.lists(st.one_of(_lines(), st.sampled_from([b"\n", b"  \n", b'{"text": "\\ud800"}', b'{"text": 1, "id": "x"}',
                                                                  b'{"id": true, "text": "t"}', b'[{"text": "t"}]', b'"text"'])), max_size=6),
       id_required=st.booleans())
def test_a_file_reads_as_its_lines_checked_one_by_one(tmp_path_factory, lines, id_required):
    """The read's fast path for common lines gives what the checks give, hostile lines among them."""
    lines = [line if line.endswith(b"\n") else line + b"\n" for line in lines if b"\n" not in line.rstrip(b"\r\n")]
    path = tmp_path_factory.mktemp("lines") / "a.jsonl"
    path.write_bytes(b"".join(lines))
    fields = sources.RecordFields(id_required=id_required)
    assert _read_outcome(path, fields) == _checked_outcome(lines, fields)


@pytest.mark.parametrize("line", [b'{"text": "t", "id": 123456789012345678901234567890}', b'{"text": "t", "id": -9223372036854775809}',
                                  b'{"text": "t", "id": 18446744073709551615}', b'{"text": "t", "id": 1.5}'])
def test_an_integer_id_beyond_64_bits_keeps_its_digits(line):
    # orjson reads such an integer as a float; the standard library keeps every digit.
    assert _outcome(lambda data: sources.jsonl_record(data, 1, "u"), line) == _outcome(_standard_library_only, line)


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_a_line_that_is_not_utf8_is_named_so_not_as_bad_json(tmp_path, encoding):
    # Its syntax is fine: "is not JSON" sent the user looking for a missing brace.
    path = tmp_path / "a.jsonl"
    path.write_bytes('{"text": "fine"}\n{"text": "caf\u00e9 \u2014 cr\u00e8me"}\n'.encode(encoding, "replace"))
    error = _source_error(reference(path), tmp_path)
    assert error.code is ErrorCode.SOURCE_INVALID and error.message.endswith("line 2 is not UTF-8 text")


def test_arrays_nested_beyond_the_recursion_limit_are_not_json(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    error = _source_error(reference(path), tmp_path)
    assert error.message.endswith("line 2 is not JSON")


@pytest.mark.parametrize("recursion_limit", [None, 100_000])
@pytest.mark.parametrize("depth,read", [(1_023, True), (1_024, False)])
def test_nesting_is_read_up_to_orjsons_limit(tmp_path, depth, read, recursion_limit):
    # The record's object and 1,023 arrays: 1,024 levels, orjson's limit; one more is not JSON,
    # whatever recursion limit a library imported into the process has set.
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"text": "deep", "x": ' + b"[" * depth + b"]" * depth + b"}\n")
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit or previous)
    try:
        if read:
            assert read_source(reference(path), 0, tmp_path)[0]["text"].to_list() == ["deep"]
        else:
            assert _source_error(reference(path), tmp_path).message.endswith("line 1 is not JSON")
    finally:
        sys.setrecursionlimit(previous)


def test_an_integer_beyond_the_interpreters_digit_limit_is_not_json(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "t", "id": ' + b"7" * 5_000 + b"}\n")
    assert _source_error(reference(path), tmp_path).message.endswith("line 2 is not JSON")


# The standard library reads a lone surrogate, escaped or as its raw UTF-8-like bytes, into a str
# no UTF-8 column holds: refused, naming the line and field, where it used to be an internal error.
@pytest.mark.parametrize(("line", "field"), [
    (b'{"id": "s1", "text": "lone \\ud800 surrogate"}', "text"),
    (b'{"id": "s2", "text": "raw \xed\xa0\x80 bytes"}', "text"),
    (b'{"id": "s3", "text": "a low one \\udc00 alone"}', "text"),
    (b'{"id": "\\ud83d", "text": "fine"}', "id"),
])
def test_a_lone_surrogate_is_source_invalid_naming_its_line(tmp_path, line, field):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"id": "ok", "text": "caf\\u00e9 \xf0\x9f\x99\x82 fine"}\n\n' + line + b"\n")
    error = _source_error(reference(path), tmp_path)
    assert error.message == f"dataroot://a.jsonl: line 3: '{field}' holds a lone surrogate, which is not Unicode text"


def test_a_surrogate_pair_escaped_is_one_character_and_reads(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"id": "\\ud83d\\ude42", "text": "smile \\ud83d\\ude42"}\n')
    docs, _ = read_source(reference(path), 0, tmp_path)
    assert docs["text"].to_list() == ["smile \U0001f642"] and docs["source_record_id"].to_list() == ["\U0001f642"]


@pytest.mark.parametrize("column", ["text", "id"])
def test_a_parquet_string_that_is_not_utf8_is_source_invalid_naming_its_row(tmp_path, column):
    # pyarrow does not check UTF-8 on reading: a writer that stored raw bytes as strings shows only here.
    values = [b"ok text", "caf\u00e9".encode(), b"bad \xff", b"fine"]
    good = pa.array([v.decode("latin-1").encode() for v in values], pa.binary()).view(pa.string())
    bad = pa.array(values, pa.binary()).view(pa.string())
    table = pa.table({"id": bad if column == "id" else good, "text": bad if column == "text" else good})
    path = tmp_path / "a.parquet"
    import pyarrow.parquet as pq

    pq.write_table(table, path, row_group_size=2)  # the bad value in the second group: rows count on
    error = _source_error(reference(path, "parquet"), tmp_path)
    assert error.message == f"dataroot://a.parquet: row 2: '{column}' is not valid UTF-8"
