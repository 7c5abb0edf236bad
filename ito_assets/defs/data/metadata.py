"""Materialisation metadata a data engineer reads in the UI: counts, rates, a histogram, tables."""

from __future__ import annotations

import dagster as dg
import polars as pl

from ito_assets.data.near_dedup import HISTOGRAM_BINS
from ito_assets.data.shards import ShardSet
from ito_assets.data.stages import CleanStage, DecontamStage, DedupStage, SourceStage

SAMPLE_HITS = 10


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def shard_metadata(shards: ShardSet) -> dict:
    return {
        "num_shards": len(shards.shards),
        "shards": dg.MetadataValue.md(_table(["shard", "rows", "sha256"], [[s.path.rsplit("/", 1)[-1], s.num_rows, s.sha256] for s in shards.shards])),
        "folder": dg.MetadataValue.path(shards.folder),
    }


def source_metadata(stage: SourceStage) -> dict:
    rows = [[c.uri, c.license, c.format, c.num_documents, c.num_bytes, c.sha256[:16] + "…"] for c in stage.sources]
    return {
        "manifest_digest": stage.manifest_digest,
        "num_documents": stage.num_documents,
        "num_sources": len(stage.sources),
        "num_empty_skipped": sum(c.num_empty_skipped for c in stage.sources),
        "num_changed_by_normalization": sum(c.num_changed_by_normalization for c in stage.sources),
        "normalization": stage.sources[0].normalization if stage.sources else "",
        "sources": dg.MetadataValue.md(_table(["uri", "licence", "format", "documents", "bytes", "sha256"], rows)),
        **shard_metadata(stage.shards),
    }


def histogram_markdown(counts: tuple[int, ...]) -> str:
    width = 1.0 / HISTOGRAM_BINS
    peak = max(counts) if counts and max(counts) else 1
    rows = [[f"{i * width:.2f}-{(i + 1) * width:.2f}", c, "█" * round(30 * c / peak)] for i, c in enumerate(counts) if c]
    return _table(["estimated Jaccard", "candidate pairs", ""], rows) if rows else "no candidate pairs"


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
        "similarity_histogram": dg.MetadataValue.md(histogram_markdown(c.near.similarity_histogram)),
        "config": dg.MetadataValue.json(stage.config),
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
        "contamination_by_benchmark": dg.MetadataValue.json({r["benchmark"]: {"documents": r["documents"], "eval_items": r["eval_items"]} for r in by_benchmark.iter_rows(named=True)}),
        "sample_hits": dg.MetadataValue.md(
            _table(
                ["doc", "eval item", "view", "matched n-gram", "chars", "overlap", "action"],
                [[r["doc_id"], r["eval_item_id"], r["view"], r["matched_ngram"], f"{r['char_start']}-{r['char_end']}", f"{r['overlap_ratio']:.2f}", r["action"]] for r in sample.iter_rows(named=True)],
            )
            if sample.height else "no contamination found"
        ),
        "config": dg.MetadataValue.json(stage.config),
        **{f"config.{k}": v for k, v in stage.config.items()},
        **(paraphrase_metadata(stage) if stage.paraphrases is not None else {}),
    }


def paraphrase_metadata(stage: DecontamStage) -> dict:
    candidates = pl.read_parquet(stage.paraphrases.path).sort("similarity", descending=True)
    rows = [[r["doc_id"], r["eval_item_id"], f"{r['similarity']:.3f}", r["excerpt"][:80]] for r in candidates.head(SAMPLE_HITS).iter_rows(named=True)]
    return {
        "num_paraphrase_candidates": candidates.height,
        "paraphrase_candidates": dg.MetadataValue.md(_table(["doc", "eval item", "similarity", "excerpt"], rows) if rows else "no paraphrase candidates"),
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
        **shard_metadata(stage.shards),
    }
