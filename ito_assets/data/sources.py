"""Source documents: read one data reference of a manifest into a frame of documents.

The file's bytes are read once, their sha256 compared with the manifest's (a mismatch blocks:
SOURCE_DIGEST_MISMATCH), and the same bytes parsed, so what was verified is what is used. Text is
NFC-normalised (`text.NORMALIZATION_VERSION` is recorded). Each document gets a stable id: the
first 16 hex digits of sha256(source sha256 + ":" + row), which depends only on the source's bytes
and the row, never on the manifest or the run (64 bits: a collision needs ~4 billion documents by
the birthday bound).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from ito_assets.data.text import NORMALIZATION_VERSION, normalize
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DataReference

DATAROOT = "dataroot://"
FILE = "file://"
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


def resolve_uri(uri: str, data_root: Path) -> Path:
    """`dataroot://rel/path` under the data root (never escaping it), or `file:///abs/path`."""
    if uri.startswith(DATAROOT):
        relative = Path(uri[len(DATAROOT):])
        root = data_root.resolve()
        path = (root / relative).resolve()
        if relative.is_absolute() or not path.is_relative_to(root):
            raise ItoError(ErrorCode.SOURCE_INVALID, "a dataroot:// reference points outside the data root")
        return path
    if uri.startswith(FILE):
        return Path(uri[len(FILE):])
    raise ItoError(ErrorCode.SOURCE_INVALID, "a data reference has an unsupported uri scheme")


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
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _parse_jsonl(data: bytes, uri: str) -> tuple[list[str | None], list[str], list[int]]:
    ids: list[str | None] = []
    texts: list[str] = []
    rows: list[int] = []
    for row, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {row + 1} is not JSON") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: line {row + 1} has no string 'text'")
        record_id = record.get("id")
        ids.append(None if record_id is None else str(record_id))
        texts.append(record["text"])
        rows.append(row)
    return ids, texts, rows


def _parse_parquet(data: bytes, uri: str) -> tuple[list[str | None], list[str], list[int]]:
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - any parse failure is the same user-facing error
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: not a readable Parquet file") from None
    if "text" not in table.column_names:
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: has no 'text' column")
    texts = table.column("text").to_pylist()
    if any(not isinstance(t, str) for t in texts):
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: 'text' must be a non-null string column")
    ids = [None if i is None else str(i) for i in table.column("id").to_pylist()] if "id" in table.column_names else [None] * len(texts)
    return ids, texts, list(range(len(texts)))


def doc_id(source_sha256: str, row: int) -> str:
    return hashlib.sha256(f"{source_sha256}:{row}".encode()).hexdigest()[:DOC_ID_HEX]


def read_source(ref: DataReference, source_index: int, data_root: Path) -> tuple[pl.DataFrame, SourceCounts]:
    """One data reference -> (documents frame in DOCUMENT_SCHEMA, counters). Empty texts are
    skipped and counted; they are not documents."""
    data = read_verified_bytes(ref, data_root)
    parse = _parse_jsonl if ref.format == "jsonl" else _parse_parquet
    ids, raw_texts, rows = parse(data, ref.uri)
    texts = [normalize(t) for t in raw_texts]
    changed = sum(1 for a, b in zip(raw_texts, texts) if a != b)
    keep = [i for i, t in enumerate(texts) if t.strip()]
    frame = pl.DataFrame(
        {
            "doc_id": [doc_id(ref.sha256, rows[i]) for i in keep],
            "source_index": [source_index] * len(keep),
            "source_uri": [ref.uri] * len(keep),
            "source_sha256": [ref.sha256] * len(keep),
            "license": [ref.license] * len(keep),
            "row": [rows[i] for i in keep],
            "source_record_id": [ids[i] for i in keep],
            "text": [texts[i] for i in keep],
        },
        schema=DOCUMENT_SCHEMA,
    )
    counts = SourceCounts(
        uri=ref.uri,
        sha256=ref.sha256,
        license=ref.license,
        format=ref.format,
        num_documents=frame.height,
        num_bytes=len(data),
        num_empty_skipped=len(texts) - len(keep),
        num_changed_by_normalization=changed,
    )
    return frame, counts


def read_sources(refs: tuple[DataReference, ...], data_root: Path) -> tuple[pl.DataFrame, list[SourceCounts]]:
    """Every data reference of a manifest, in manifest order (the first part of the keep order)."""
    frames, counts = [], []
    for index, ref in enumerate(refs):
        frame, count = read_source(ref, index, data_root)
        frames.append(frame)
        counts.append(count)
    return pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=DOCUMENT_SCHEMA), counts
