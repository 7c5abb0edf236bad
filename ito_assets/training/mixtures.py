"""The two arms' text: the candidate mixture from the clean shards, the baseline (a reference
mixture the desk maintains) from its files.

A baseline file is JSONL (one object with a string `text` per line) or Parquet (a `text` column),
named by a `dataroot://` or `file:///` URI like a manifest's data references; its sha256 is recorded
so that an auditor can tell which reference the decision was made against.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pyarrow.parquet as pq

from ito_assets.data.sources import jsonl_record
from ito_assets.data.uris import resolve_uri
from ito_assets.errors import ErrorCode, ItoError

# The embedded default's reference mixture: the Python language reference (PSF-2.0), curated text
# that the fixtures' decontamination self-check found free of eval n-grams (data/fixtures/README.md).
DEFAULT_BASELINE_URIS = ("dataroot://fixtures/corpora/pydoc_topics.jsonl",)


@dataclass(frozen=True, kw_only=True)
class MixtureSource:
    uri: str
    sha256: str
    num_documents: int


@dataclass(frozen=True, kw_only=True)
class Mixture:
    texts: tuple[str, ...]
    sources: tuple[MixtureSource, ...]

    @property
    def num_bytes(self) -> int:
        return sum(len(t.encode()) for t in self.texts)


def _jsonl_texts(data: bytes, uri: str) -> list[str]:
    texts = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        texts.append(jsonl_record(line, number, uri)["text"])
    return texts


def _parquet_texts(data: bytes, uri: str) -> list[str]:
    try:
        table = pq.read_table(io.BytesIO(data), columns=["text"])
    except Exception:  # noqa: BLE001 - any parse failure is the same user-facing error
        raise ItoError(ErrorCode.SOURCE_INVALID, f"{uri}: not a Parquet file with a 'text' column") from None
    return [t for t in table.column("text").to_pylist() if isinstance(t, str)]


def read_mixture(uris: Sequence[str], data_root: Path, *, sha256: Sequence[str] | None = None) -> Mixture:
    """Non-empty texts of every file, in order; SOURCE_NOT_FOUND / SOURCE_INVALID on bad files.
    `sha256`: each file's digest as reviewed (the manifest's `decision_baseline`), checked before
    a line is parsed: SOURCE_DIGEST_MISMATCH where the bytes are not those."""
    if not uris:
        raise ItoError(ErrorCode.SOURCE_INVALID, "a baseline mixture needs at least one file")
    if sha256 is not None and len(sha256) != len(uris):
        raise ValueError("one sha256 per baseline file")
    texts: list[str] = []
    sources = []
    for index, uri in enumerate(uris):
        path = resolve_uri(uri, data_root)
        if not path.is_file():
            raise ItoError(ErrorCode.SOURCE_NOT_FOUND, f"baseline file {uri} does not exist")
        data = path.read_bytes()
        found = hashlib.sha256(data).hexdigest()
        if sha256 is not None and found != sha256[index]:
            raise ItoError(ErrorCode.SOURCE_DIGEST_MISMATCH, f"baseline file {uri} has sha256 {found[:12]}..., "
                           f"not the {sha256[index][:12]}... the manifest binds: the reference mixture changed since review")
        parsed = _parquet_texts(data, uri) if path.suffix == ".parquet" else _jsonl_texts(data, uri)
        kept = [t for t in parsed if t.strip()]
        texts.extend(kept)
        sources.append(MixtureSource(uri=uri, sha256=found, num_documents=len(kept)))
    return Mixture(texts=tuple(texts), sources=tuple(sources))
