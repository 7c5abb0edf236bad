"""The reference implementation of deduplication and decontamination: each step on whole frames in
memory, composed from the same building blocks as the production path. It is the oracle the data
tests compare the production path with, and the baseline the data benchmarks measure it against;
it is NOT a production path: the Dagster data assets run `ito_assets.data.stages`, which streams
work units (`dedup_units`, `decontam_units`) with memory bounded by the units, not the corpus.

Importable as `reference_impl` by the tests (tests/ is on pytest's pythonpath) and by the
benchmarks (each puts tests/ on sys.path).
"""

from __future__ import annotations

import polars as pl

from ito_assets.data import clean
from ito_assets.data.config import DecontamConfig, DedupConfig
from ito_assets.data.decontam import (ScanCounts, candidate_documents, common_seeds, hits_of, seed_frequency,
                                      seed_matches)
from ito_assets.data.dedup import FAMILY_SCHEMA, KEPT, NEAR_SCHEMA, DedupCounts, counts_of, decide
from ito_assets.data.eval_index import EvalIndex
from ito_assets.data.exact_dedup import exact_duplicates, in_keep_order
from ito_assets.data.minhash import MinHasher
from ito_assets.data.near_dedup import near_duplicates
from ito_assets.data.text import token_hashes


def deduplicate(docs: pl.DataFrame, config: DedupConfig, tiers: pl.DataFrame | None = None) -> tuple[pl.DataFrame, DedupCounts]:
    """docs (DOCUMENT_SCHEMA) -> (one decision row per document in DEDUP_SCHEMA, counters);
    `tiers` (doc_id, tier): the contaminated documents, which come last in the keep order."""
    ordered = in_keep_order(docs, tiers)
    representatives, copies, exact_counts = exact_duplicates(ordered)
    hasher = MinHasher(num_perm=config.num_perm, seed=config.seed)
    signatures, shingles = hasher.signatures_of_texts(representatives["text"], config.shingle_size)
    removals, families, near_counts = near_duplicates(signatures, shingles, config)
    ids = representatives["doc_id"]
    near = pl.DataFrame({"doc_id": ids.gather(removals.removed), "near_of": ids.gather(removals.kept), "near_similarity": removals.similarity}, schema=NEAR_SCHEMA)
    family = pl.DataFrame({"doc_id": ids.gather(families.member), "family_of": ids.gather(families.root)}, schema=FAMILY_SCHEMA)
    return decide(ordered, copies, near, family), counts_of(exact_counts, near_counts)


def kept_documents(docs: pl.DataFrame, decisions: pl.DataFrame, tiers: pl.DataFrame | None = None) -> pl.DataFrame:
    """The documents that survive deduplication, in keep order."""
    kept = decisions.filter(pl.col("dedup_state") == KEPT).select("doc_id")
    return in_keep_order(docs.join(kept, on="doc_id", how="semi"), tiers).drop("rank")


def scan(docs: pl.DataFrame, index: EvalIndex, config: DecontamConfig) -> tuple[pl.DataFrame, ScanCounts]:
    """docs (doc_id, text) -> (hits in HIT_SCHEMA, counters)."""
    tokens = token_hashes(docs["text"], digits_normalized=True)
    matches = seed_matches(tokens, index)
    ignored = common_seeds(seed_frequency(matches), index, config)
    candidates = candidate_documents(matches, ignored, index)
    hits = hits_of(candidates, docs, index, ignored, config)
    counts = ScanCounts(
        num_documents=docs.height,
        num_seed_matches=matches.height,
        num_common_seeds_ignored=ignored.height,
        num_candidate_documents=len(candidates),
        num_contaminated_documents=hits["doc_id"].n_unique() if hits.height else 0,
        num_hits=hits.height,
    )
    return hits, counts


def prepare(docs: pl.DataFrame, index: EvalIndex, dedup_config: DedupConfig, decontam_config: DecontamConfig) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The data stages on whole frames, in the stages' order: every document scanned, the keep
    order tiered by contamination, deduplicated, cleaned -> (final decisions, clean rows, hits)."""
    hits, _ = scan(docs.select("doc_id", "text"), index, decontam_config)
    actions, pieces = clean.apply_actions(docs.select("doc_id", "text"), hits, decontam_config)
    tiers = clean.tiers_of(actions)
    dedup, _ = deduplicate(docs, dedup_config, tiers)
    kept = kept_documents(docs, dedup, tiers)
    return clean.decisions(dedup, hits, actions), clean.clean_documents(kept, actions, pieces), hits
