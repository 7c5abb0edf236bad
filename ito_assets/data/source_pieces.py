"""The sources read in pieces, each parsed by a worker alone: the same documents, ids and counters
as one pass over each file (`SourceRead`), with the parsing spread over the step's workers.

A plain JSONL file is cut at line starts into byte ranges of about `unit_bytes`, a Parquet file
into runs of whole row groups of about as many uncompressed bytes, and a gzip or zstd file is one
piece (a compressed stream reads only from its start). The cut needs each range's first line
number (a document's id is its source's sha256 and its row), so the lines of the verified copy
are counted once, at the speed of `bytes.count` (2.4 GB/s measured here, against the copy and
sha256 that precede it). Each source is copied, hashed and cut by a task of its own
(`cut_source`), so a manifest of many files spreads those too. A piece writes its documents to a
Parquet file in the order it read them, and the step writes the source shards from those files
in piece order, so the shards are the bytes one pass writes.

A record a piece cannot parse is a result, not a failure: the step raises SOURCE_INVALID with the
message of the first such piece in file order (the message one pass gives), on either engine,
and Ray does not retry a file's content.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from ito_assets.data.scratch import Scratch
from ito_assets.data.shards import ShardSet, write_part, write_shards_in_parts
from ito_assets.data.sources import (NORMALIZATION_VERSION, SOURCE_SHARD_SCHEMA, RecordFields, SourceCounts, SourceRead, compression_of,
                                     documents, jsonl_records, parquet_records)
from ito_assets.data.units import Pool, map_units, row_group_runs
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.manifest.schema import DataReference

_COUNT_CHUNK = 8 << 20
_ARROW_SCHEMA = pl.DataFrame(schema=SOURCE_SHARD_SCHEMA).to_arrow(compat_level=pl.CompatLevel.oldest()).schema


@dataclass(frozen=True)
class SourcePiece:
    """Part of one verified source copy: a byte range of a plain JSONL file (`start`, `end`), a
    run of row groups of a Parquet file (`start` up to `end`, exclusive), or, where `start` =
    `end` = 0, the whole file (a compressed or empty one, or a Parquet file whose footer does
    not read, so that its error comes in file order). `first_row` is the row of its first
    record in the file."""

    ref: DataReference
    source_index: int
    copy: str
    start: int
    end: int
    first_row: int
    output: str

    def key(self) -> dict:
        # The copy's bytes are the ones its sha256 names: verified before any piece runs.
        return {"source": self.ref.model_dump(mode="json"), "source_index": self.source_index,
                "start": self.start, "end": self.end, "first_row": self.first_row, "normalization": NORMALIZATION_VERSION,
                "columns": list(SOURCE_SHARD_SCHEMA)}  # a piece an older version wrote lacks the newer columns

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return (self.output,)

    def records(self) -> Iterator:
        fields, path, uri = RecordFields.of(self.ref), Path(self.copy), self.ref.uri
        if self.ref.format == "parquet":
            groups = list(range(self.start, self.end)) if self.end else None
            return parquet_records(path, uri, fields, row_groups=groups, first_row=self.first_row)
        span = (self.start, self.end) if self.end else None
        return jsonl_records(path, uri, fields, span=span, first_row=self.first_row)


def parse_piece(piece: SourcePiece) -> tuple[int, int, int, str | None]:
    """-> (documents, empty texts skipped, texts changed by normalisation, why a record is invalid
    or None); the documents are written to `piece.output` a batch at a time (a compressed file is
    one piece of any size), none where a record is invalid."""
    num_documents = num_empty = num_changed = 0
    with pq.ParquetWriter(piece.output, _ARROW_SCHEMA, compression="lz4") as writer:  # scratch data: fast over small
        try:
            for records in piece.records():
                kept, empty, changed = documents(piece.ref, piece.source_index, records)
                writer.write_table(kept.to_arrow(compat_level=pl.CompatLevel.oldest()).cast(_ARROW_SCHEMA))
                num_documents, num_empty, num_changed = num_documents + kept.height, num_empty + empty, num_changed + changed
        except ItoError as error:
            if error.code is not ErrorCode.SOURCE_INVALID:
                raise
            invalid = error.message
        else:
            return num_documents, num_empty, num_changed, None
    pl.DataFrame(schema=SOURCE_SHARD_SCHEMA).write_parquet(piece.output)
    return 0, 0, 0, invalid


def line_spans(path: Path, target_bytes: int, chunk_bytes: int = _COUNT_CHUNK) -> list[tuple[int, int, int]]:
    """(start, end, first row) of ranges that start at a line's start and end on the first line
    end at or past `target_bytes` from their start (a line longer than the target is a range of
    its own); the file is read `chunk_bytes` at a time."""
    spans: list[tuple[int, int, int]] = []
    start = position = lines = first_row = 0
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            offset = 0
            while position + len(chunk) - start >= target_bytes:
                cut = chunk.find(b"\n", max(offset, start + target_bytes - 1 - position))
                if cut < 0:
                    break
                lines += chunk.count(b"\n", offset, cut + 1)
                offset = cut + 1
                spans.append((start, position + offset, first_row))
                start, first_row = position + offset, lines
            lines += chunk.count(b"\n", offset)
            position += len(chunk)
    if position > start:
        spans.append((start, position, first_row))
    return spans


@dataclass(frozen=True)
class SourceCut:
    """One source, to be verified (copied and hashed) and cut into pieces of about `target_bytes`."""

    read: SourceRead
    target_bytes: int


def cut_source(task: SourceCut) -> tuple[list[tuple[int, int, int]], tuple[str, str] | None]:
    """-> (start, end, first row) of the source's pieces, once its copy hashes to the manifest's
    sha256, and None; or no pieces and (code, message) of why the source cannot be read, so that
    the step raises the first such error in manifest order, with its code, on either engine."""
    read = task.read
    try:
        read.verify()
    except ItoError as error:
        return [], (error.code.value, error.message)
    ref, copy = read.ref, read.copy
    if ref.format == "parquet":
        try:
            return row_group_runs(copy, ref.uri, task.target_bytes), None
        except ItoError:  # the piece meets the same error, after the earlier sources' pieces
            return [(0, 0, 0)], None
    if compression_of(copy) is None:
        return line_spans(copy, task.target_bytes) or [(0, 0, 0)], None
    return [(0, 0, 0)], None


def cut_sources(reads: Sequence[SourceRead], pool: Pool, target_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Each source verified and cut by a task of its own (the copies, digests and line counts
    spread over `pool`); the first source that cannot be read, in manifest order, raises."""
    cuts = map_units(cut_source, [SourceCut(read, target_bytes) for read in reads], pool, phase="source copies", unit="sources")
    failure = next((failure for _, failure in cuts if failure is not None), None)
    if failure is not None:
        raise ItoError(ErrorCode(failure[0]), failure[1])
    return [spans for spans, _ in cuts]


def plan_pieces(reads: Sequence[SourceRead], spans: Sequence[Sequence[tuple[int, int, int]]], folder: Path) -> list[SourcePiece]:
    """Every verified source's pieces (`spans`, as `cut_source` gives them), in manifest order then
    file order; each writes under `folder`."""
    pieces: list[SourcePiece] = []
    for read, cuts in zip(reads, spans):
        for start, end, first_row in cuts:
            output = str(folder / f"documents-{len(pieces):05d}.parquet")
            pieces.append(SourcePiece(read.ref, read.source_index, str(read.copy), start, end, first_row, output))
    return pieces


def source_counts(reads: Sequence[SourceRead], pieces: Sequence[SourcePiece], results: Sequence[tuple]) -> list[SourceCounts]:
    """Each source's counters, summed over its pieces; the first invalid record, in manifest and
    file order, is SOURCE_INVALID."""
    invalid = next((why for *_, why in results if why is not None), None)
    if invalid is not None:
        raise ItoError(ErrorCode.SOURCE_INVALID, invalid)
    totals = {read.source_index: [0, 0, 0] for read in reads}
    for piece, (num_documents, num_empty, num_changed, _) in zip(pieces, results):
        total = totals[piece.source_index]
        total[0] += num_documents
        total[1] += num_empty
        total[2] += num_changed
    return [SourceCounts(uri=read.ref.uri, sha256=read.ref.sha256, license=read.ref.license, format=read.ref.format,
                         num_documents=totals[read.source_index][0], num_bytes=read.copy.stat().st_size,
                         num_empty_skipped=totals[read.source_index][1],
                         num_changed_by_normalization=totals[read.source_index][2]) for read in reads]


def read_in_pieces(reads: Sequence[SourceRead], scratch: Scratch, pool: Pool, folder: Path, max_rows: int,
                   store: Path) -> tuple[ShardSet, list[SourceCounts], int]:
    """The sources verified and cut on `pool`, parsed in pieces there, then written as the shards
    of `folder`, a part a task: (the shards, each source's counters, the number of pieces). The
    pieces a failed attempt finished are not parsed again."""
    spans = cut_sources(reads, pool, scratch.scale.unit_bytes)
    markers = scratch.finished("source-pieces")
    pieces = plan_pieces(reads, spans, markers.folder)
    results = map_units(parse_piece, pieces, pool, phase="source parsing", unit="pieces", markers=markers)
    try:
        counts = source_counts(reads, pieces, results)
    except ItoError:  # an invalid source is fixed by a new file, under new keys: nothing to resume
        shutil.rmtree(markers.folder, ignore_errors=True)
        raise
    files = [(piece.output, result[0]) for piece, result in zip(pieces, results)]
    shards = write_shards_in_parts(files, folder, prefix="documents", max_rows=max_rows, schema=SOURCE_SHARD_SCHEMA, store=store,
                                   run_parts=lambda tasks: map_units(write_part, tasks, pool, phase="source shards", unit="shards"))
    return shards, counts, len(pieces)
