"""Materialisation metadata a data engineer reads in the UI: counts and rates (numbers, plotted
across partitions), charts of the near-duplicate similarities and of contamination by benchmark,
and tables with schemas."""

from __future__ import annotations

import dagster as dg
import polars as pl

from ito_assets import charts
from ito_assets.data.near_dedup import HISTOGRAM_BINS
from ito_assets.defs.metadata_values import chart, json_value, table
from ito_assets.data.shards import ShardSet
from ito_assets.data.stages import CleanStage, DecontamStage, DedupStage, SourceStage

SAMPLE_HITS = 10


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


SHARD_COLUMNS = [("shard", "string"), ("rows", "int"), ("sha256", "string")]
SOURCE_COLUMNS = [("uri", "string"), ("licence", "string"), ("format", "string"), ("documents", "int"),
                  ("size MB", "float"), ("sha256", "string")]
SIMILARITY_COLUMNS = [("Jaccard from", "float"), ("Jaccard to", "float"), ("candidate pairs", "int")]
HIT_COLUMNS = [("doc", "string"), ("eval item", "string"), ("view", "string"), ("matched n-gram", "string"),
               ("chars", "string"), ("overlap %", "float"), ("action", "string")]
PARAPHRASE_COLUMNS = [("doc", "string"), ("eval item", "string"), ("similarity", "float"), ("excerpt", "string")]


def shard_metadata(shards: ShardSet) -> dict:
    rows = [{"shard": s.path.rsplit("/", 1)[-1], "rows": s.num_rows, "sha256": s.sha256} for s in shards.shards]
    return {
        "num_shards": len(shards.shards),
        "shards": table(SHARD_COLUMNS, rows),
        "folder": dg.MetadataValue.path(shards.folder),
    }


def source_metadata(stage: SourceStage) -> dict:
    rows = [{"uri": c.uri, "licence": c.license, "format": c.format, "documents": c.num_documents,
             "size MB": round(c.num_bytes / 1e6, 3), "sha256": c.sha256[:16] + "…"} for c in stage.sources]
    return {
        "manifest_digest": stage.manifest_digest,
        "num_documents": stage.num_documents,
        "num_sources": len(stage.sources),
        "num_empty_skipped": sum(c.num_empty_skipped for c in stage.sources),
        "num_changed_by_normalization": sum(c.num_changed_by_normalization for c in stage.sources),
        "normalization": stage.sources[0].normalization if stage.sources else "",
        "num_source_pieces": stage.num_pieces,
        "num_units_resumed": stage.units_resumed,
        "sources": table(SOURCE_COLUMNS, rows),
        **shard_metadata(stage.shards),
    }


def similarity_metadata(counts: tuple[int, ...], threshold: float | None) -> dict:
    """Candidate pairs by estimated Jaccard: a chart with the removal threshold, and the non-empty
    bins as a table."""
    width = 1.0 / HISTOGRAM_BINS
    rows = [{"Jaccard from": round(i * width, 2), "Jaccard to": round((i + 1) * width, 2), "candidate pairs": c}
            for i, c in enumerate(counts) if c]
    return {"similarity_chart": chart("near-duplicate similarity", charts.similarity_chart(counts, threshold)),
            "similarity_histogram": table(SIMILARITY_COLUMNS, rows)}


def dedup_metadata(stage: DedupStage) -> dict:
    c = stage.counts
    return {
        "num_input": c.num_input,
        "num_kept": c.num_kept,
        # The warehouse's count, the one `ito audit manifest` reports (lineage.removals_by_method).
        "num_exact_removed": stage.removed_by_method["exact"],
        "num_near_removed": stage.removed_by_method["near"],
        "duplicate_rate": _rate(c.num_removed, c.num_input),
        "num_candidate_pairs": c.near.num_candidate_pairs,
        "num_pairs_verified": c.near.num_pairs_verified,
        "num_pairs_above_threshold": c.near.num_pairs_above_threshold,
        "num_families": stage.num_families,
        "num_units_resumed": stage.units_resumed,
        "num_band_join_partitions": stage.band_join_partitions,
        **similarity_metadata(c.near.similarity_histogram, stage.config.get("threshold")),
        "config": json_value(stage.config),
        **{f"config.{k}": v for k, v in stage.config.items()},
        **shard_metadata(stage.kept),
    }


def decontam_metadata(stage: DecontamStage) -> dict:
    hits = pl.read_parquet(stage.hits.path)
    by_benchmark = (
        hits.group_by("benchmark").agg(pl.col("doc_id").n_unique().alias("documents"), pl.col("eval_item_id").n_unique().alias("eval_items")).sort("benchmark")
        if hits.height else pl.DataFrame(schema={"benchmark": pl.String, "documents": pl.UInt32, "eval_items": pl.UInt32})
    )
    sample = hits.sort("overlap_ratio", "doc_id", descending=[False, False]).head(SAMPLE_HITS)
    c = stage.counts
    benchmarks = {r["benchmark"]: {"documents": r["documents"], "eval_items": r["eval_items"]}
                  for r in by_benchmark.iter_rows(named=True)}
    hit_rows = [{"doc": r["doc_id"], "eval item": r["eval_item_id"], "view": r["view"], "matched n-gram": r["matched_ngram"],
                 "chars": f"{r['char_start']}-{r['char_end']}", "overlap %": round(100 * r["overlap_ratio"], 1),
                 "action": r["action"]} for r in sample.iter_rows(named=True)]
    return {
        "eval_suite_id": stage.eval_suite_id,
        "eval_suite_digest": stage.eval_suite_digest,
        "num_documents_scanned": c.num_documents,
        "num_contaminated_documents": c.num_contaminated_documents,
        "contamination_rate": _rate(c.num_contaminated_documents, c.num_documents),
        "num_hits": c.num_hits,
        "num_seed_matches": c.num_seed_matches,
        "num_common_seeds_ignored": c.num_common_seeds_ignored,
        "num_eval_items": stage.num_items,
        "num_eval_items_unindexed": stage.num_items_unindexed,
        "num_degenerate_seeds": stage.num_degenerate_seeds,
        "num_units_resumed": stage.units_resumed,
        "contamination_by_benchmark": json_value(benchmarks),
        "contamination_chart": chart("contamination by benchmark", charts.contamination_chart(benchmarks)),
        "sample_hits": table(HIT_COLUMNS, hit_rows),  # empty: no contamination found
        "config": json_value(stage.config),
        **{f"config.{k}": v for k, v in stage.config.items()},
        **(paraphrase_metadata(stage) if stage.paraphrases is not None else {}),
    }


def paraphrase_metadata(stage: DecontamStage) -> dict:
    candidates = pl.read_parquet(stage.paraphrases.path).sort("similarity", descending=True)
    rows = [{"doc": r["doc_id"], "eval item": r["eval_item_id"], "similarity": round(r["similarity"], 3),
             "excerpt": r["excerpt"][:80]} for r in candidates.head(SAMPLE_HITS).iter_rows(named=True)]
    return {
        "num_paraphrase_candidates": candidates.height,
        "paraphrase_candidates": table(PARAPHRASE_COLUMNS, rows),
    }


def clean_metadata(stage: CleanStage) -> dict:
    c = stage.conservation
    return {
        "num_input": c.num_input,
        "num_kept": c.num_kept,
        "num_duplicate": c.num_duplicate,
        "num_duplicate_contaminated": c.num_duplicate_contaminated,
        "num_contaminated_dropped": c.num_contaminated_dropped,
        "num_contaminated_cut": c.num_contaminated_cut,
        "num_clean_rows": c.num_clean_rows,
        "num_pieces": c.num_pieces,
        "kept_rate": _rate(c.num_kept, c.num_input),
        "conservation_holds": c.holds,
        "num_units_resumed": stage.units_resumed,
        **shard_metadata(stage.shards),
    }
