"""The four data-preparation stages as plain functions over folders: sources -> decontamination
(every document, so an auditor's "which documents matched eval item Y" covers the duplicates too)
-> deduplication (whose keep order puts contaminated documents last, so a survivor is chosen
knowing contamination) -> clean shards. Each reads what the earlier stages wrote, calls the
steps, writes its Parquet and lineage rows, and returns a small frozen result (paths, digests,
counters) that the Dagster shell passes on and shows as metadata.
Deduplication and decontamination stream their input in byte-sized work units (`units`), with
DuckDB under a memory cap for the corpus-wide joins, and cleaning streams the kept documents a
batch at a time. `run_sources` parses a verified snapshot of each source a batch at a time, in
one pass on one worker or in pieces on several (`source_pieces`), so no stage holds the corpus's
text. Every stage verifies the shards it reads against the digests
recorded when they were written before it reads them (SHARD_CORRUPT names the file relative to
`<state_dir>/shards`); a step's own output, hashed from disk as it was written, is read unhashed.

Layout under `<state_dir>/shards/<manifest key>/`:
    _scratch/                                verified snapshots of the sources being read
    source/   documents-NNNNN.parquet        every input document with provenance and its length in characters
    decontam/ hits.parquet, actions.parquet, pieces.parquet, ignored-seeds.parquet
    dedup/    decisions.parquet              dedup state of every document
              kept-NNNNN.parquet             the documents that survive deduplication
    */_scratch/                              work units and spill of a running step (removed after)
    */_finished/<phase>/                     what finished units wrote, and their completion markers:
                                             kept after a failure for the rerun, removed on success
    clean/    clean-NNNNN.parquet            the clean shards; decisions.parquet (final states)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from ito_assets.data import clean, lineage
from ito_assets.data.band_join import num_partitions
from ito_assets.data.clean_units import clean_in_parts
from ito_assets.data.config import DataPrepConfig, DecontamConfig, ScaleConfig
from ito_assets.data.decontam import ScanCounts
from ito_assets.data.decontam_units import scan_shards
from ito_assets.data.dedup import DEDUP_SCHEMA, DUPLICATE, DedupCounts
from ito_assets.data.dedup_units import deduplicate_units, in_memory
from ito_assets.data.kept_units import kept_shards
from ito_assets.data.eval_index import build_index
from ito_assets.data.paraphrase_units import REPORT_SCHEMA, paraphrase_shards
from ito_assets.data.scratch import scratch_space, sql_list
from ito_assets.data.shards import Shard, ShardSet, record_batches, verified_path, verified_paths, write_shard_stream, write_table, write_table_batches
from ito_assets.data.source_pieces import read_in_pieces
from ito_assets.data.sources import DOCUMENT_SCHEMA, SOURCE_SHARD_SCHEMA, SourceCounts, SourceRead
from ito_assets.data.units import parquet_frames, worker_pool
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite
from ito_assets.manifest.verify import VerifiedManifest, eval_suite_mismatches, require_provenance


@dataclass(frozen=True)
class SourceStage:
    manifest_digest: str
    manifest_key: str
    shards: ShardSet
    sources: tuple[SourceCounts, ...]
    num_pieces: int = 1  # the pieces the sources were parsed in (source_pieces.py)
    units_resumed: int = 0  # pieces an earlier attempt parsed

    @property
    def num_documents(self) -> int:
        return self.shards.num_rows


@dataclass(frozen=True)
class DedupStage:
    manifest_digest: str
    decisions: Shard
    kept: ShardSet
    counts: DedupCounts
    config: dict
    num_families: int  # families of two or more documents
    # Removals by method as the warehouse counts them (lineage.removals_by_method), the figure the
    # UI and `ito audit manifest` share; `counts.exact` / `counts.near` are what each pass removed.
    removed_by_method: dict[str, int]
    units_resumed: int = 0  # finished by a failed earlier attempt, not redone (completion.py)
    band_join_partitions: int = 1  # the LSH band join's hash partitions (band_join.py); 0 where it ran in memory


@dataclass(frozen=True)
class DecontamStage:
    manifest_digest: str
    eval_suite_id: str
    eval_suite_digest: str
    hits: Shard
    actions: Shard
    pieces: Shard
    ignored_seeds: Shard  # (seed, view) pairs common in the scanned corpus: no evidence there
    counts: ScanCounts
    num_items: int
    num_items_unindexed: int
    num_degenerate_seeds: int
    config: dict
    paraphrases: Shard | None = None  # possible paraphrases, for review (only when asked for)
    units_resumed: int = 0  # finished by a failed earlier attempt, not redone (completion.py)

    def decontam_config(self) -> DecontamConfig:
        return DecontamConfig(**self.config)


@dataclass(frozen=True)
class CleanStage:
    manifest_digest: str
    shards: ShardSet
    decisions: Shard
    conservation: clean.Conservation
    units_resumed: int = 0  # kept shards an earlier attempt cleaned, not redone (completion.py)


SCRATCH = "_scratch"  # work units, worker outputs and DuckDB spill of a running step; removed after


def shard_store(state_dir: Path) -> Path:
    """Where every stage's files live; the name a shard goes by in messages is relative to it."""
    return state_dir / "shards"


def stage_folder(state_dir: Path, manifest_key: str) -> Path:
    return shard_store(state_dir) / manifest_key


def decontam_config_for(verified: VerifiedManifest, base: DecontamConfig) -> DecontamConfig:
    """The manifest's provenance fixes n (the smallest, i.e. strictest, over its references)."""
    sizes = [ref.decontamination.ngram_size for ref in verified.manifest.data if ref.decontamination]
    n = min(sizes) if sizes else base.ngram_size
    seed = min(base.seed_ngram_size, n)
    return DecontamConfig(**{**asdict(base), "ngram_size": n, "seed_ngram_size": seed, "min_seed_ngram_size": min(base.min_seed_ngram_size, seed)})


def run_sources(verified: VerifiedManifest, data_root: Path, state_dir: Path, warehouse: Path, config: DataPrepConfig) -> SourceStage:
    require_provenance(verified.manifest)
    key = verified.short_digest
    folder = stage_folder(state_dir, key)
    scale = config.scale
    with scratch_space(folder / SCRATCH, scale) as scratch, worker_pool(scale.num_workers, scale.engine) as pool:
        reads = [SourceRead(ref, i, data_root, scratch.folder) for i, ref in enumerate(verified.manifest.data)]
        # Every source verified before the folder of the last good output is replaced (by the
        # pool's tasks in `read_in_pieces`).
        if pool is None:  # one worker: one pass, no piece files between the parser and the shards
            for read in reads:
                read.verify()
            frames = (frame for read in reads for frame in read.frames())
            shards = write_shard_stream(frames, folder / "source", prefix="documents", max_rows=config.shard_max_rows, schema=SOURCE_SHARD_SCHEMA, store=shard_store(state_dir))
            counts, num_pieces = [read.counts for read in reads], len(reads)
        else:
            shards, counts, num_pieces = read_in_pieces(reads, scratch, pool, folder / "source", config.shard_max_rows, shard_store(state_dir))
        resumed = scratch.units_resumed
    # Never the text: DuckDB decodes a whole row group's column under the warehouse's cap.
    provenance = {c: c for c in SOURCE_SHARD_SCHEMA if c != "text"}
    documents = lineage.ParquetRows(shards.shards, provenance | {"shard_path": "filename"})
    sources = pl.DataFrame([{**asdict(c), "source_index": i} for i, c in enumerate(counts)])
    # The row keeps a decontamination recorded before: its hits and decisions are still this data's.
    decontaminated = lineage.decontamination_record(warehouse, verified.digest)
    manifest_row = pl.DataFrame({"manifest_key": [key], "name": [verified.manifest.name],
                                 "eval_suite_id": [decontaminated.get("eval_suite_id")],
                                 "eval_suite_digest": [decontaminated.get("eval_suite_digest")],
                                 "config": [json.dumps(config.as_metadata() | decontaminated.get("config", {}), sort_keys=True)]},
                                schema={"manifest_key": pl.String, "name": pl.String, "eval_suite_id": pl.String,
                                        "eval_suite_digest": pl.String, "config": pl.String})
    lineage.write_tables(warehouse, verified.digest, {"manifests": manifest_row, "sources": sources, "documents": documents})
    return SourceStage(manifest_digest=verified.digest, manifest_key=key, shards=shards, sources=tuple(counts),
                       num_pieces=num_pieces, units_resumed=resumed)


def run_dedup(source: SourceStage, actions: Shard, state_dir: Path, warehouse: Path, config: DataPrepConfig) -> DedupStage:
    """`actions`: the decontamination's action per contaminated document (DecontamStage.actions),
    which puts those documents last in the keep order."""
    folder = stage_folder(state_dir, source.manifest_key) / "dedup"
    store = shard_store(state_dir)
    tiers = clean.tiers_of(pl.read_parquet(verified_path(actions)))
    verified_paths(source.shards.shards)  # SHARD_CORRUPT before any work: the tasks then trust the digests
    joined_in_memory = in_memory(source.shards.shards, config.scale)
    with scratch_space(folder / SCRATCH, config.scale) as scratch, worker_pool(config.scale.num_workers, config.scale.engine):
        decisions, counts = deduplicate_units(scratch, source.shards.shards, config.dedup, folder / "decisions.parquet", store=store, tiers=tiers)
        kept = kept_shards(scratch, folder / "kept", config.shard_max_rows, store)
        num_families = scratch.db.execute(f"SELECT count(DISTINCT family_id) FROM read_parquet({sql_list([decisions.path])}) WHERE family_id <> doc_id").fetchone()[0]
        resumed = scratch.units_resumed
    duplicates = lineage.ParquetRows((decisions,), {c: c for c in DEDUP_SCHEMA}, where=f"dedup_state = '{DUPLICATE}'")
    lineage.write_tables(warehouse, source.manifest_digest, {"duplicates": duplicates})
    removed = lineage.written_removals_by_method(warehouse, source.manifest_digest)
    # The representatives, the documents the signature units hold, are the distinct texts; in
    # memory there is no partitioned join.
    partitions = 0 if joined_in_memory else num_partitions(counts.exact.num_distinct_texts, config.dedup.bands, config.scale)
    return DedupStage(manifest_digest=source.manifest_digest, decisions=decisions, kept=kept, counts=counts, config=asdict(config.dedup),
                      num_families=int(num_families), removed_by_method=removed, units_resumed=resumed, band_join_partitions=partitions)


def run_decontam(verified: VerifiedManifest, suite: EvalSuite, source: SourceStage, state_dir: Path, warehouse: Path, config: DataPrepConfig) -> DecontamStage:
    """Every source document scanned, the duplicates-to-be too."""
    decontam = decontam_config_for(verified, config.decontam)
    index = build_index(suite, decontam)
    folder = stage_folder(state_dir, verified.short_digest) / "decontam"
    store = shard_store(state_dir)
    verified_paths(source.shards.shards)  # SHARD_CORRUPT before any work: the units are keyed by these digests
    with scratch_space(folder / SCRATCH, config.scale) as scratch, worker_pool(config.scale.num_workers, config.scale.engine):
        scan = scan_shards(scratch, source.shards.shards, index, decontam, extra=["source_record_id"])
        paraphrases = paraphrase_shards(scratch, source.shards.shards, suite, config.paraphrase) if config.paraphrase else None
        resumed = scratch.units_resumed
    hits, counts, ignored, found = scan.hits, scan.counts, scan.ignored, scan.documents
    actions, pieces = clean.apply_actions(found, hits, decontam)
    hits = hits.join(found.select("doc_id", "source_record_id"), on="doc_id", how="left").join(actions.select("doc_id", "action"), on="doc_id", how="left")
    stage = DecontamStage(
        manifest_digest=verified.digest,
        eval_suite_id=suite.suite_id,
        eval_suite_digest=suite.digest,
        hits=write_table(hits, folder / "hits.parquet", store=store),
        actions=write_table(actions, folder / "actions.parquet", store=store),
        pieces=write_table(pieces, folder / "pieces.parquet", store=store),
        ignored_seeds=write_table(ignored, folder / "ignored-seeds.parquet", store=store),
        counts=counts,
        num_items=index.num_items,
        num_items_unindexed=index.num_items_unindexed,
        num_degenerate_seeds=index.num_degenerate_seeds,
        config=asdict(decontam),
        paraphrases=None if paraphrases is None else write_table(paraphrases, folder / "paraphrases.parquet", store=store),
        units_resumed=resumed,
    )
    manifest_row = pl.DataFrame({"manifest_key": [verified.short_digest], "name": [verified.manifest.name], "eval_suite_id": [suite.suite_id], "eval_suite_digest": [suite.digest], "config": [json.dumps(config.as_metadata() | {f"decontam.{k}": v for k, v in asdict(decontam).items()}, sort_keys=True)]})
    indexed = {view.item_id for view in index.views}
    items = pl.DataFrame({"eval_item_id": [i.id for i in suite.items], "benchmark": [i.benchmark for i in suite.items],
                          "looked_for": [i.id in indexed for i in suite.items]},
                         schema={"eval_item_id": pl.String, "benchmark": pl.String, "looked_for": pl.Boolean})
    tables = {"contamination_hits": hits.with_columns(pl.lit(suite.digest).alias("eval_suite_digest")), "manifests": manifest_row,
              "eval_items": items}
    # Replaced either way: a run without the report leaves no stale candidates of an earlier one.
    tables["paraphrase_candidates"] = paraphrases if paraphrases is not None else pl.DataFrame(schema=REPORT_SCHEMA)
    lineage.write_tables(warehouse, verified.digest, tables)
    return stage


def run_clean(verified: VerifiedManifest, source: SourceStage, dedup: DedupStage, decontam: DecontamStage, state_dir: Path, warehouse: Path, config: DataPrepConfig) -> CleanStage:
    # The gate where the clean data is written: decontaminated against the suite the manifest names.
    if eval_suite_mismatches(verified.manifest, decontam.eval_suite_id, decontam.eval_suite_digest):
        raise ItoError(ErrorCode.EVAL_SUITE_MISMATCH, "the data was decontaminated against another eval suite than the manifest names")
    # Every input but the kept documents (verified below, where they are read) before anything is written.
    actions_path, pieces_path, hits_path, decisions_path = verified_paths((decontam.actions, decontam.pieces, decontam.hits, dedup.decisions))
    input_paths = verified_paths(source.shards.shards)
    folder = stage_folder(state_dir, source.manifest_key) / "clean"
    store = shard_store(state_dir)
    scale, actions = config.scale, pl.read_parquet(actions_path)
    with scratch_space(folder / SCRATCH, scale) as scratch, worker_pool(scale.num_workers, scale.engine) as pool:
        if pool is None:  # one worker: one pass, no files between the cleaning and the shards
            shards = write_clean_shards(dedup.kept, actions, pl.read_parquet(pieces_path), folder / "shards", config.shard_max_rows, store=store)
        else:
            verified_paths(dedup.kept.shards)
            shards = clean_in_parts(dedup.kept, decontam.actions, decontam.pieces, scratch, pool, folder / "shards",
                                    config.shard_max_rows, store)
        hits = pl.read_parquet(hits_path, columns=["doc_id", "eval_item_id"])
        final = clean.final_batches(parquet_frames([decisions_path], list(DEDUP_SCHEMA)), hits, actions)
        table = write_table_batches(record_batches(final, clean.FINAL_SCHEMA), folder / "decisions.parquet", store=store)
        # The account: every per-document table a Parquet file, counted by DuckDB under the scratch cap.
        db = scratch.db
        db.execute(f"CREATE VIEW input_documents AS SELECT doc_id FROM read_parquet({sql_list(input_paths)})")
        db.execute(f"CREATE VIEW final_decisions AS SELECT * FROM read_parquet({sql_list([table.path])})")
        db.execute(f"CREATE VIEW clean_rows AS SELECT doc_id, piece FROM read_parquet({sql_list(_paths(shards))})")
        conservation = clean.account_of(db)
        resumed = scratch.units_resumed
    # Which clean shard holds each kept document or piece: ids and offsets.
    shard_rows = pl.DataFrame([{"shard_path": s.path, "shard_sha256": s.sha256, "num_rows": s.num_rows} for s in shards.shards], schema={"shard_path": pl.String, "shard_sha256": pl.String, "num_rows": pl.Int64})
    placed = lineage.ParquetRows(
        shards.shards,
        {c: c for c in ("doc_id", "piece", "char_start", "char_end", "shard_sha256")} | {"shard_path": "filename"},
        by_file=shard_rows.select(pl.col("shard_path").alias("filename"), "shard_sha256"),
    )
    final_rows = lineage.ParquetRows((table,), {c: c for c in clean.FINAL_SCHEMA})
    lineage.write_tables(warehouse, source.manifest_digest, {"decisions": final_rows, "clean_shards": shard_rows, "clean_pieces": placed})
    return CleanStage(manifest_digest=source.manifest_digest, shards=shards, decisions=table, conservation=conservation,
                      units_resumed=resumed)


def _paths(shards: ShardSet) -> tuple[str, ...]:
    return tuple(s.path for s in shards.shards)


def write_clean_shards(kept: ShardSet, actions: pl.DataFrame, pieces: pl.DataFrame, folder: Path, max_rows: int, store: Path | None = None) -> ShardSet:
    """The clean shards, from the kept documents (verified first) read a batch at a time (the
    same parts as `clean.clean_documents` on the whole frame)."""
    batches = (frame.cast(DOCUMENT_SCHEMA) for frame in parquet_frames(verified_paths(kept.shards), list(DOCUMENT_SCHEMA)))
    schema = clean.clean_documents(pl.DataFrame(schema=DOCUMENT_SCHEMA), actions.clear(), pieces.clear()).schema
    return write_shard_stream(clean.clean_batches(batches, actions, pieces), folder, prefix="clean", max_rows=max_rows, schema=schema, store=store)


def residual_contamination(shards: ShardSet, suite: EvalSuite, decontam: DecontamStage, scale: ScaleConfig) -> pl.DataFrame:
    """An independent re-scan of the clean shards (fresh index, fresh scan, in work units as
    `run_decontam`'s) under the decontamination's rule: the hits found. The seeds that stage
    ignored as common stay ignored: counted again on the clean shards (the scanned corpus less
    what was removed), a common phrase can fall under the threshold and turn into evidence
    against a document the rule had cleared (seen at 4x the fixtures in benchmarks/data_scaling.py).
    A piece is scanned under its own id, doc_id#piece. The shards and the ignored seeds are
    verified first (SHARD_CORRUPT), and the suite must be the one the stage scanned against
    (EVAL_SUITE_MISMATCH): against another, a clean corpus fails and a contaminated one passes."""
    if suite.digest != decontam.eval_suite_digest:
        raise ItoError(ErrorCode.EVAL_SUITE_MISMATCH, f"the eval suite given ({suite.suite_id}, {suite.digest[:19]}) is "
                       f"not the one the decontamination scanned against ({decontam.eval_suite_id}, "
                       f"{decontam.eval_suite_digest[:19]}): materialize eval_suite from that suite, or decontaminate again")
    config = decontam.decontam_config()
    ignored = pl.read_parquet(verified_path(decontam.ignored_seeds))
    shards.verified_paths()  # SHARD_CORRUPT before any work: the units are keyed by these digests
    with scratch_space(Path(shards.folder).parent / SCRATCH, scale) as scratch:
        return scan_shards(scratch, shards.shards, build_index(suite, config), config, ignored=ignored, ids=("doc_id", "piece")).hits
