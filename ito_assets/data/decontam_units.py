"""The decontamination scan over byte-sized work units: the same hits as the in-memory reference
(`scan`, tests/reference_impl.py), with memory bounded by a unit rather than the corpus. Over
shards (`scan_shards`: the source shards, the clean ones for the residual re-scan) the units are
the shards' own rows, so no text passes through the step's process; over frames they are copied
into unit files first.

The scan has one corpus-wide quantity, the number of documents each seed occurs in (the
common-seed rule), so it runs in two passes over the units, each unit an independent step:
1. `match_unit`: tokenise the unit, find its seed matches (written beside the unit) and count
   documents per seed. Units hold disjoint documents, so the counts add up to the corpus's.
2. The common seeds are decided once, from the summed counts.
3. `hits_unit`: the unit's candidate documents and their authoritative hits.
A re-scan of the cleaned data passes the first scan's common seeds (`ignored`): counted on the
cleaned data, a subset, a seed can fall under the threshold, and the two scans would then apply
different rules to the same text.
Hits come back in unit order, and within a unit in document order: the order of `scan`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import polars as pl

from ito_assets.data.completion import frame_digest
from ito_assets.data.config import DecontamConfig
from ito_assets.data.decontam import HIT_SCHEMA, ScanCounts, candidate_documents, common_seeds, hits_of, seed_frequency, seed_matches
from ito_assets.data.eval_index import EvalIndex
from ito_assets.data.scratch import Scratch
from ito_assets.data.text import token_hashes
from ito_assets.data.shards import Shard
from ito_assets.data.units import WorkUnit, compacted, map_units, shard_units, worker_pool, write_units
from ito_assets.digests import file_sha256


@dataclass(frozen=True)
class MatchTask:
    unit: WorkUnit
    index: EvalIndex
    matches_path: str

    def key(self) -> dict:
        return {"unit": self.unit.key(), "index": self.index.digest}

    def inputs(self) -> tuple[str, ...]:
        return (self.unit.path,)

    def outputs(self) -> tuple[str, ...]:
        return (self.matches_path,)


@dataclass(frozen=True)
class HitTask:
    unit: WorkUnit
    index: EvalIndex
    ignored: pl.DataFrame
    config: DecontamConfig
    matches_path: str
    extra: tuple[str, ...] = ()  # the unit's columns returned with the documents that have a hit
    ids: tuple[str, ...] = ("doc_id",)  # the columns that name a document, joined with "#" (a null as "")

    def key(self) -> dict:
        return {"unit": self.unit.key(), "index": self.index.digest, "ignored": frame_digest(self.ignored), "config": asdict(self.config),
                "extra": list(self.extra), "ids": list(self.ids)}

    def inputs(self) -> tuple[str, ...]:
        return (self.unit.path, self.matches_path)

    def outputs(self) -> tuple[str, ...]:
        return ()


def match_unit(task: MatchTask) -> tuple[int, pl.DataFrame]:
    """-> (number of seed matches, documents per seed) of one unit; the matches go to disk."""
    tokens = token_hashes(task.unit.read(["text"])["text"], digits_normalized=True)
    matches = seed_matches(tokens, task.index)
    matches.write_parquet(task.matches_path, compression="lz4")
    return matches.height, seed_frequency(matches)


def hits_unit(task: HitTask) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    """-> (number of candidate documents, hits, the documents with a hit: doc_id, the task's
    `extra` columns and text) of one unit."""
    matches = pl.read_parquet(task.matches_path)
    candidates = candidate_documents(matches, task.ignored, task.index)
    columns = ["doc_id", *task.extra, "text"]
    if not candidates:
        docs = pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    else:
        docs = task.unit.read(list(dict.fromkeys([*task.ids, *columns]))).cast(pl.String)
        if task.ids != ("doc_id",):  # a piece of a document is scanned under its own id, doc_id#piece
            docs = docs.with_columns(pl.concat_str([pl.col(c).fill_null("") for c in task.ids], separator="#").alias("doc_id")).select(columns)
    hits = hits_of(candidates, docs.select("doc_id", "text"), task.index, task.ignored, task.config)
    return len(candidates), hits, compacted(docs.filter(pl.col("doc_id").is_in(hits["doc_id"].implode())))


@dataclass(frozen=True)
class Scan:
    hits: pl.DataFrame  # HIT_SCHEMA, in the units' document order
    counts: ScanCounts
    ignored: pl.DataFrame  # the (seed, view) pairs ignored as common
    documents: pl.DataFrame  # the documents with a hit (doc_id, the `extra` columns, text), in the same order


def scan_units(scratch: Scratch, units: Sequence[WorkUnit], index: EvalIndex, config: DecontamConfig, ignored: pl.DataFrame | None = None,
               known: Mapping[str, str] | None = None, extra: Sequence[str] = (), ids: Sequence[str] = ("doc_id",)) -> Scan:
    """Work units (doc_id, text, and the `extra` columns) -> the hits and counters the reference
    `scan` returns, and the documents they were found in (read by the units' workers: what
    `clean.apply_actions` reads, with no second pass over the corpus). `ignored` given: those
    pairs, not the ones these units' own seed frequencies would pick. `known`: the units' files'
    digests, where they were verified already. `ids`: the columns that name a document (joined
    with "#")."""
    match_markers = scratch.finished("decontam-matches")
    paths = [str(match_markers.folder / f"matches-{u.index:05d}.parquet") for u in units]
    # Both passes read the units: hashed once, here, for both passes' keys.
    unit_digests = dict(known) if known is not None else {u.path: file_sha256(u.path) for u in units}
    with worker_pool(scratch.scale.num_workers, scratch.scale.engine) as pool:
        matched = map_units(match_unit, [MatchTask(unit=u, index=index, matches_path=p) for u, p in zip(units, paths)], pool,
                            phase="decontamination seeds", markers=match_markers, known=unit_digests)
        if ignored is None:
            ignored = common_seeds(_summed(f for _, f in matched), index, config)
        tasks = [HitTask(unit=u, index=index, ignored=ignored, config=config, matches_path=p, extra=tuple(extra), ids=tuple(ids))
                 for u, p in zip(units, paths)]
        found = map_units(hits_unit, tasks, pool, phase="decontamination hits", markers=scratch.finished("decontam-hits"),
                          known=unit_digests | match_markers.written())
    hits = pl.concat([h for _, h, _ in found]) if found else pl.DataFrame(schema=HIT_SCHEMA)
    empty = pl.DataFrame(schema=dict.fromkeys(["doc_id", *extra, "text"], pl.String))
    documents = pl.concat([empty, *(d for _, _, d in found)])
    counts = ScanCounts(
        num_documents=sum(u.num_docs for u in units),
        num_seed_matches=sum(n for n, _ in matched),
        num_common_seeds_ignored=ignored.height,
        num_candidate_documents=sum(n for n, _, _ in found),
        num_contaminated_documents=hits["doc_id"].n_unique() if hits.height else 0,
        num_hits=hits.height,
    )
    return Scan(hits=hits, counts=counts, ignored=ignored, documents=documents)


def _summed(frequencies: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """The corpus's documents per seed from the units' (disjoint documents: counts add up)."""
    frames = list(frequencies)
    if not frames:
        return pl.DataFrame(schema={"seed": pl.UInt64, "num_docs": pl.Int64})
    return pl.concat(frames).group_by("seed").agg(pl.col("num_docs").sum())


def scan_shards(scratch: Scratch, shards: Sequence[Shard], index: EvalIndex, config: DecontamConfig, extra: Sequence[str] = (),
                ignored: pl.DataFrame | None = None, ids: Sequence[str] = ("doc_id",)) -> Scan:
    """Parquet shards (doc_id, text, `extra`, ...), verified against their digests by the caller;
    the units are runs of the shards' own row groups (`shard_units`), so no text passes through
    this process and none is copied."""
    units = shard_units(shards, scratch.scale.unit_bytes)
    return scan_units(scratch, units, index, config, ignored, known={shard.path: shard.sha256 for shard in shards}, extra=extra, ids=ids)


def scan_frames(scratch: Scratch, frames: Iterable[pl.DataFrame], index: EvalIndex, config: DecontamConfig, ignored: pl.DataFrame | None = None) -> Scan:
    """Frames (doc_id, text) -> the scan, a unit at a time."""
    units = write_units(frames, scratch.sub("decontam-units"), scratch.scale.unit_bytes)
    return scan_units(scratch, units, index, config, ignored)
