"""Source documents: read one data reference of a manifest into a frame of documents.

The file is copied once into the stage's scratch folder and hashed as it is copied; the copy's
sha256 is compared with the manifest's (a mismatch blocks: SOURCE_DIGEST_MISMATCH), and the copy
is parsed a batch at a time, so what was verified is what is used and no file is held whole.
Text is NFC-normalised (`text.NORMALIZATION_VERSION` is recorded). Each document gets a stable id: the
first 16 hex digits of sha256(source sha256 + ":" + row), which depends only on the source's bytes
and the row, never on the manifest or the run (64 bits: a collision needs ~4 billion documents by
the birthday bound).

Records: JSONL (one object a line, plain or gzip- or zstd-compressed, told apart by their magic
bytes, not by the file name) or Parquet. The text is in the reference's `text_field`, the record's
own id (kept as provenance, as text; an integer id as its decimal form) in its `id_field`. A
missing field or a value of the wrong type is SOURCE_INVALID naming the field and the line
(1-based) or row (0-based, as the `row` column records it).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import hmac
import io
import itertools
import json
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ito_assets.data.kernels import row_digests
from ito_assets.data.text import NORMALIZATION_VERSION, normalize
from ito_assets.digests import file_sha256
from ito_assets.data.uris import resolve_uri
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DataReference

DOC_ID_HEX = 16
# The document frame every step after this one consumes (provenance columns first).
DOCUMENT_SCHEMA = {
    "doc_id": pl.String,
    "source_index": pl.Int32,
    "source_uri": pl.String,
    "source_sha256": pl.String,
    "license": pl.String,
    "row": pl.Int64,
    "source_record_id": pl.String,
    "text": pl.String,
}
# A source shard: the documents, and each one's length in characters, counted here where the text
# is in memory anyway; the warehouse's `documents` rows take it from there and never read the text.
SOURCE_SHARD_SCHEMA = {**DOCUMENT_SCHEMA, "num_chars": pl.Int64}


@dataclass(frozen=True)
class SourceCounts:
    """Counters of one source, returned beside its frame."""

    uri: str
    sha256: str
    license: str
    format: str
    num_documents: int
    num_bytes: int
    num_empty_skipped: int
    num_changed_by_normalization: int
    normalization: str = NORMALIZATION_VERSION


def read_verified_bytes(ref: DataReference, data_root: Path) -> bytes:
    path = resolve_uri(ref.uri, data_root)
    if not path.is_file():
        raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"data reference {ref.uri} does not exist")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(actual, ref.sha256):
        raise ItoError(ErrorCode.SOURCE_DIGEST_MISMATCH, f"data reference {ref.uri} does not hash to the manifest's sha256")
    return data


def source_digest(ref: DataReference, data_root: Path) -> str:
    """sha256 hex of the file a reference names, as it is on disk now (for the independent check)."""
    path = resolve_uri(ref.uri, data_root)
    if not path.is_file():
        return ""
    return file_sha256(path)


# Records parsed per frame: ~8k documents of a few kB, as the later stages read them.
BATCH_RECORDS = 8192
Records = tuple[list[str | None], list[str], list[int]]  # source record ids, texts, rows


def snapshot(ref: DataReference, data_root: Path, copy: Path) -> None:
    """A private copy of the file a reference names, at `copy`, then the copy's own bytes hashed;
    a copy that does not hash to the manifest's sha256 is removed and blocks
    (SOURCE_DIGEST_MISMATCH). The copy is what is parsed, so what was verified is what is used,
    without holding the file in memory; the source itself may change meanwhile."""
    path = resolve_uri(ref.uri, data_root)
    if not path.is_file():
        raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"data reference {ref.uri} does not exist")
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, copy)
    if not hmac.compare_digest(file_sha256(copy), ref.sha256):
        copy.unlink()
        raise ItoError(ErrorCode.SOURCE_DIGEST_MISMATCH, f"data reference {ref.uri} does not hash to the manifest's sha256")


# The first bytes of each compressed stream (RFC 1952; RFC 8878, a zstd frame's magic number).
COMPRESSION_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}
_READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class RecordFields:
    """Where a record keeps its text and its own id. The id is optional per record unless the
    reference names its field (`id_field`): then every record must have one."""

    text: str = "text"
    id: str = "id"
    id_required: bool = False

    @classmethod
    def of(cls, ref: DataReference) -> RecordFields:
        return cls(text=ref.text_field, id=ref.id_field or "id", id_required=ref.id_field is not None)


DEFAULT_FIELDS = RecordFields()


def compression_of(path: Path) -> str | None:
    """"gzip", "zstd" or None (plain), from the file's first bytes."""
    with path.open("rb") as handle:
        head = handle.read(4)
    if _zstd_skippable(head):
        return "zstd"
    return next((name for name, magic in COMPRESSION_MAGIC.items() if head.startswith(magic)), None)


def _zstd_skippable(head: bytes) -> bool:
    """A zstd skippable frame (magic 0x184D2A50-0x184D2A5F, little-endian; RFC 8878, 3.1.2): pzstd
    writes one before its frames, and the zstd codec skips it."""
    return len(head) == 4 and head[1:] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50


def _lines(path: Path, uri: str, span: tuple[int, int] | None = None) -> Iterator[bytes]:
    """The file's lines, decompressed as they stream when it is gzip or zstd (pyarrow's codecs:
    this Python's standard library has no zstd); a corrupt or truncated stream is SOURCE_INVALID.
    `span` (start, end): only those bytes of a plain file, which start and end at a line's start."""
    compression = compression_of(path)
    if compression is None:
        with path.open("rb") as handle:
            if span is None:
                yield from handle
                return
            handle.seek(span[0])
            yield from io.BytesIO(handle.read(span[1] - span[0]))
        return
    handed = 0
    try:
        with pa.input_stream(str(path), compression=compression) as stream:
            for line in io.BufferedReader(stream, buffer_size=_READ_BUFFER):
                handed += 1
                yield line
    except OSError:  # what pyarrow's codecs raise for bad data
        if compression == "gzip" and _padded_gzip(path):
            with gzip.open(path, "rb") as handle:
                yield from itertools.islice(handle, handed, None)
            return
        whole = _whole_lines(path, compression)
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: the {compression} stream is corrupt or truncated after line {whole}") from None


def _padded_gzip(path: Path) -> bool:
    """A gzip file that pyarrow's codec refuses and Python's reads whole: one padded with zero
    bytes after its last member (as a tape or a block device pads it), which `gzip -d` also reads,
    "trailing zero bytes ignored". Other bytes after the last member stay refused, by both."""
    try:
        with gzip.open(path, "rb") as handle:
            while handle.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error):  # BadGzipFile is an OSError
        return False
    return True


def _whole_lines(path: Path, compression: str) -> int:
    """The complete lines a corrupt or truncated stream decodes to before its fault, read again in
    small pieces (the reader above fails a whole buffer at once, before handing out its lines)."""
    lines = 0
    with contextlib.suppress(OSError), pa.input_stream(str(path), compression=compression) as stream:
        while piece := stream.read(1 << 12):
            lines += piece.count(b"\n")
    return lines


# How orjson words a line nested deeper than its limit (pinned by a test of the limit).
_ORJSON_TOO_DEEP = "depth limit exceeded"


def _loads(line: bytes, id_field: str) -> object:
    """`json.loads(line)`, by orjson where that gives the same value (4.3x faster over the
    benchmark's 64x corpus: 0.18 s against 0.76 s). orjson refuses what the standard library
    accepts (integers beyond 64 bits, NaN, lone surrogates, a BOM, UTF-16), or reads an integer
    beyond 64 bits as a float: the standard library reads those lines, and a line whose id is such
    a float, and so decides their errors and ids as it always did (the step keeps a record's text
    and id only, so another field read as a float changes nothing). Nesting is orjson's rule alone:
    up to 1,023 levels, a line deeper is not JSON; the standard library's limit moves with the
    process's recursion limit, which an imported library may raise."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        if str(error).startswith(_ORJSON_TOO_DEEP):
            raise
        return json.loads(line)
    if isinstance(record, dict) and isinstance(record.get(id_field), float):
        return json.loads(line)
    return record


def jsonl_record(line: bytes, number: int, uri: str, fields: RecordFields = DEFAULT_FIELDS) -> dict:
    """One JSONL line (1-based `number`) as an object with a string text field (SOURCE_INVALID if not)."""
    try:
        record = _loads(line, fields.id)
    except UnicodeDecodeError:  # Latin-1 or cp1252 text, say: the syntax may be fine
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {number} is not UTF-8 text") from None
    # ValueError: JSONDecodeError and an integer of more than 4,300 digits; RecursionError: the
    # standard library's nesting limit, below orjson's on a deep call stack.
    except (ValueError, RecursionError):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {number} is not JSON") from None
    if not isinstance(record, dict):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {number} is not a JSON object")
    if fields.text not in record:
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {number} has no field '{fields.text}'")
    if not isinstance(record[fields.text], str):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {number}: '{fields.text}' is not a string")
    return record


def _default_id_hint(fields: RecordFields) -> str:
    """Where nobody named the id field, `id` was read because it is there: say how to read another."""
    if fields.id_required:
        return ""
    return f" ('{fields.id}' is read as each record's own id by default: name the field that holds them with id_field, `--id-field`)"


def record_id(value: object, fields: RecordFields, where: str) -> str | None:
    """A record's own id as text (an integer as its decimal form); None where it has none and
    none is required. `where` names the record in the message ("<uri>: line 3")."""
    if value is None:
        if fields.id_required:
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{where} has no field '{fields.id}' (or it is null)")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{where}: '{fields.id}' is neither a string nor an integer{_default_id_hint(fields)}")
    return str(value)


def jsonl_records(path: Path, uri: str, fields: RecordFields = DEFAULT_FIELDS, *,
                   span: tuple[int, int] | None = None, first_row: int = 0) -> Iterator[Records]:
    """`span`: a byte range of a plain file (`_lines`) whose first line is row `first_row`."""
    ids: list[str | None] = []
    texts: list[str] = []
    rows: list[int] = []
    loads, text_field, id_field, no_id = orjson.loads, fields.text, fields.id, not fields.id_required
    for row, line in enumerate(_lines(path, uri, span), start=first_row):
        # The common line, an object that orjson reads with a string text and a string, integer or
        # absent id, needs none of `jsonl_record`'s checks: orjson refuses lone surrogates, the one
        # thing `_text` looks for. Every other line (blank, not JSON, another id) goes through them.
        # 60,000 short lines: 0.155 -> 0.128 s of CPU for the whole read (best of 7, alternating).
        try:
            record = loads(line)
            text, value = record[text_field], record.get(id_field)
        except Exception:  # noqa: BLE001 - not JSON, not an object, no text: the checks below say which
            text = value = None
        if type(text) is not str or not (type(value) is str or type(value) is int or (value is None and no_id)):
            if not line.strip():
                continue
            record = jsonl_record(line, row + 1, uri, fields)
            where = f"{uri}: line {row + 1}"
            value = _text(record_id(record.get(fields.id), fields, where), where, fields.id)
            text = _text(record[fields.text], where, fields.text)
        elif type(value) is int:
            value = str(value)
        ids.append(value)
        texts.append(text)
        rows.append(row)
        if len(texts) == BATCH_RECORDS:
            yield ids, texts, rows
            ids, texts, rows = [], [], []
    if texts:
        yield ids, texts, rows


def _text(value: str | None, where: str, field: str) -> str | None:
    """`value`, refused (SOURCE_INVALID) when it holds a lone surrogate: the standard library reads
    `"\\ud800"`, or the raw bytes of one, into a str that no UTF-8 column can hold (ASCII cannot
    hold one: only other text is encoded to find out)."""
    if value is not None and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{where}: '{field}' holds a lone surrogate, which is not Unicode text") from None
    return value


def _pylist(column: pa.ChunkedArray | pa.Array, uri: str, first: int, field: str) -> list:
    """The column's values; a string that is not valid UTF-8 (pyarrow does not check on reading)
    is SOURCE_INVALID naming its row."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        bad = next(i for i in range(len(column)) if not _decodes(column[i]))
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: row {first + bad}: '{field}' is not valid UTF-8") from None


def _decodes(scalar: pa.Scalar) -> bool:
    try:
        scalar.as_py()
    except UnicodeDecodeError:
        return False
    return True


def _string_type(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    return pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_)


def _id_type(type_: pa.DataType) -> bool:
    return _string_type(type_) or pa.types.is_integer(type_)


def parquet_records(path: Path, uri: str, fields: RecordFields = DEFAULT_FIELDS, *,
                     row_groups: list[int] | None = None, first_row: int = 0) -> Iterator[Records]:
    """`row_groups`: only those, consecutive, the first of which starts at row `first_row`."""
    try:
        handle = pq.ParquetFile(path)
    except Exception:  # noqa: BLE001 - any parse failure is the same user-facing error
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: not a readable Parquet file") from None
    with handle:
        schema = handle.schema_arrow
        if fields.text not in schema.names:
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: has no column '{fields.text}'")
        for name in dict.fromkeys([fields.text, fields.id]):
            # pyarrow and pandas write a name twice; which of them holds the text or the id is anyone's guess.
            if (count := schema.names.count(name)) > 1:
                hint = _default_id_hint(fields) if name == fields.id and name != fields.text else ""
                raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: has {count} columns named '{name}'{hint}")
        if not _string_type(schema.field(fields.text).type):
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: column '{fields.text}' is not a string column")
        has_id = fields.id in schema.names
        if fields.id_required and not has_id:
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: has no column '{fields.id}'")
        if has_id and not _id_type(schema.field(fields.id).type):
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: column '{fields.id}' is neither a string nor an integer column"
                                                     f"{_default_id_hint(fields)}")
        first = first_row
        columns = list(dict.fromkeys([fields.text, fields.id] if has_id else [fields.text]))
        for batch in _batches(handle, columns, uri, row_groups):
            column = batch.column(fields.text)
            if column.null_count:
                null = column.is_null().to_pylist().index(True)
                raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: row {first + null}: '{fields.text}' is null")
            texts = _pylist(column, uri, first, fields.text)
            raw_ids = _pylist(batch.column(fields.id), uri, first, fields.id) if has_id else [None] * len(texts)
            ids = [record_id(value, fields, f"{uri}: row {first + i}") for i, value in enumerate(raw_ids)]
            yield ids, texts, list(range(first, first + len(texts)))
            first += len(texts)


def record_parser(ref: DataReference) -> Callable[[Path, str], Iterator[Records]]:
    """The parse function of the reference's format, reading its record fields: (path, uri) ->
    batches of (source record ids, texts, rows)."""
    parse = jsonl_records if ref.format == "jsonl" else parquet_records
    return functools.partial(parse, fields=RecordFields.of(ref))


def _batches(handle: pq.ParquetFile, columns: list[str], uri: str, row_groups: list[int] | None = None) -> Iterator:
    """The file's record batches, a row group at a time (pyarrow's batches would otherwise run
    across groups, and a file read in runs of groups would meet its errors in other batches); a
    page that does not decode is the same user-facing error as a footer that does not
    (SOURCE_INVALID), wherever in the file it is."""
    groups = range(handle.metadata.num_row_groups) if row_groups is None else row_groups
    batches = (batch for group in groups for batch in handle.iter_batches(batch_size=BATCH_RECORDS, columns=columns, row_groups=[group]))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception:  # noqa: BLE001 - pyarrow raises several types for a corrupt page
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: not a readable Parquet file") from None
        yield batch


def doc_id(source_sha256: str, row: int) -> str:
    return hashlib.sha256(f"{source_sha256}:{row}".encode()).hexdigest()[:DOC_ID_HEX]


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def doc_ids(source_sha256: str, rows: np.ndarray) -> pl.Series:
    """`doc_id` of every row at once (`kernels.row_digests`), as a String column."""
    digests = row_digests(f"{source_sha256}:".encode(), rows)[:, : (DOC_ID_HEX + 1) // 2]
    nibbles = np.stack([digests >> 4, digests & 15], axis=-1).reshape(len(rows), 2 * digests.shape[1])
    hexed = np.ascontiguousarray(_HEX_DIGITS[nibbles[:, :DOC_ID_HEX]])
    offsets = np.arange(0, (len(rows) + 1) * DOC_ID_HEX, DOC_ID_HEX, dtype=np.int64)
    array = pa.LargeStringArray.from_buffers(len(rows), pa.py_buffer(offsets), pa.py_buffer(hexed))
    return pl.Series("doc_id", pl.from_arrow(array), dtype=pl.String)


_BATCH_SCHEMA = {"row": pl.Int64, "source_record_id": pl.String, "text": pl.String}
# A text is empty when Python's str.strip() leaves nothing: Unicode White_Space (the regex's \s)
# and U+001C-U+001F, which Python counts as space too (tests/data/test_dedup_fast_paths.py checks
# every code point).
BLANK = r"^[\s\x1c-\x1f]*$"


def normalized(texts: pl.Series) -> tuple[pl.Series, int]:
    """The texts NFC-normalised by Python's unicodedata (whose version is recorded), and how many
    changed. ASCII is NFC already, so only the other texts are visited one by one. polars'
    str.normalize was measured 20x slower on mostly ASCII text, and follows its own Unicode version."""
    others = np.flatnonzero((texts.str.len_bytes() != texts.str.len_chars()).to_numpy())
    if not len(others):
        return texts, 0
    raw = texts.gather(others).to_list()
    done = [normalize(t) for t in raw]
    changed = [i for i, (a, b) in enumerate(zip(raw, done)) if a != b]
    if not changed:
        return texts, 0
    return texts.clone().scatter(others[changed], [done[i] for i in changed]), len(changed)  # scatter works in place


def documents(ref: DataReference, source_index: int, records: Records) -> tuple[pl.DataFrame, int, int]:
    """One parsed batch -> (its documents in SOURCE_SHARD_SCHEMA, with ids and provenance; how many
    empty texts were skipped; how many texts normalisation changed)."""
    ids, raw_texts, rows = records
    batch = pl.DataFrame({"row": rows, "source_record_id": ids, "text": raw_texts}, schema=_BATCH_SCHEMA)
    texts, changed = normalized(batch["text"])
    kept = batch.with_columns(texts).filter(~texts.str.contains(BLANK))
    frame = kept.with_columns(
        doc_ids(ref.sha256, kept["row"].to_numpy()),
        pl.lit(source_index).alias("source_index"),
        pl.lit(ref.uri).alias("source_uri"),
        pl.lit(ref.sha256).alias("source_sha256"),
        pl.lit(ref.license).alias("license"),
        pl.col("text").str.len_chars().alias("num_chars"),
    ).select(list(SOURCE_SHARD_SCHEMA)).cast(SOURCE_SHARD_SCHEMA)
    return frame, batch.height - kept.height, changed


class SourceRead:
    """One data reference read a batch at a time: `frames()` yields documents (SOURCE_SHARD_SCHEMA),
    and `counts` is complete once they are exhausted. Empty texts are skipped and counted; they
    are not documents. `folder` holds the verified snapshot while it is read."""

    def __init__(self, ref: DataReference, source_index: int, data_root: Path, folder: Path) -> None:
        self.ref, self.source_index, self.data_root, self.folder = ref, source_index, data_root, folder
        self.counts: SourceCounts | None = None

    @property
    def copy(self) -> Path:
        return self.folder / f"source-{self.source_index:05d}.{self.ref.format}"

    def verify(self) -> None:
        """Take the verified snapshot now (`frames` takes it if not): a stage that verifies every
        source before it writes a shard leaves its earlier output alone when one has changed."""
        if not self.copy.exists():
            snapshot(self.ref, self.data_root, self.copy)

    def frames(self) -> Iterator[pl.DataFrame]:
        ref, copy = self.ref, self.copy
        self.verify()
        num_bytes = copy.stat().st_size
        num_documents = num_empty = num_changed = 0
        parse = record_parser(ref)
        try:
            for records in parse(copy, ref.uri):
                kept, empty, changed = documents(ref, self.source_index, records)
                num_changed += changed
                num_empty += empty
                num_documents += kept.height
                if kept.height:
                    yield kept
        finally:
            copy.unlink(missing_ok=True)
        self.counts = SourceCounts(
            uri=ref.uri, sha256=ref.sha256, license=ref.license, format=ref.format, num_documents=num_documents,
            num_bytes=num_bytes, num_empty_skipped=num_empty, num_changed_by_normalization=num_changed,
        )


def read_source(ref: DataReference, source_index: int, data_root: Path) -> tuple[pl.DataFrame, SourceCounts]:
    """One data reference -> (its whole documents frame, counters): `SourceRead` collected."""
    with tempfile.TemporaryDirectory(prefix="ito-source-") as folder:
        read = SourceRead(ref, source_index, data_root, Path(folder))
        frame = pl.concat([pl.DataFrame(schema=SOURCE_SHARD_SCHEMA), *read.frames()])
    assert read.counts is not None
    return frame, read.counts


def read_sources(refs: tuple[DataReference, ...], data_root: Path) -> tuple[pl.DataFrame, list[SourceCounts]]:
    """Every data reference of a manifest, in manifest order (the first part of the keep order)."""
    frames, counts = [], []
    for index, ref in enumerate(refs):
        frame, count = read_source(ref, index, data_root)
        frames.append(frame)
        counts.append(count)
    return pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=SOURCE_SHARD_SCHEMA), counts
