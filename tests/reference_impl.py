"""The reference implementation of deduplication and decontamination: each step on whole frames in
memory, composed from the same building blocks as the production path. It is the oracle the data
tests compare the streamed production path with (`dedup_units`, `decontam_units`, memory bounded
by the units, not the corpus), and the baseline the data benchmarks measure it against.
Deduplication's is the composition the data step itself runs on a corpus that fits in memory
(`dedup_memory.deduplicate_frame`); decontamination's is not a production path.

Importable as `reference_impl` by the tests (tests/ is on pytest's pythonpath) and by the
benchmarks (each puts tests/ on sys.path).
"""

from __future__ import annotations

import polars as pl

from ito_assets.data import clean
from ito_assets.data.config import DecontamConfig, DedupConfig
from ito_assets.data.decontam import (ScanCounts, candidate_documents, common_seeds, hits_of, seed_frequency,
                                      seed_matches)
from ito_assets.data.dedup import KEPT, DedupCounts
from ito_assets.data.dedup_memory import deduplicate_frame
from ito_assets.data.eval_index import EvalIndex
from ito_assets.data.exact_dedup import in_keep_order
from ito_assets.data.text import token_hashes


def deduplicate(docs: pl.DataFrame, config: DedupConfig, tiers: pl.DataFrame | None = None) -> tuple[pl.DataFrame, DedupCounts]:
    """docs (DOCUMENT_SCHEMA) -> (one decision row per document in DEDUP_SCHEMA, counters);
    `tiers` (doc_id, tier): the contaminated documents, which come last in the keep order. The
    composition the data step runs in memory (`dedup_memory`), without its files."""
    decisions, _, _, counts = deduplicate_frame(docs, config, tiers)
    return decisions, counts


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


def hits_per_document(candidates: list[int], docs: pl.DataFrame, index: EvalIndex, ignored: pl.DataFrame, config: DecontamConfig) -> pl.DataFrame:
    """`decontam.hits_of` as it was first written: one candidate at a time, its seeds and
    occurrences found alone, each occurrence's matches filtered with polars. The batched
    `hits_of` must give exactly these rows."""
    from ito_assets.data.decontam import HIT_SCHEMA, _attribute, occurrences, seed_matches
    from ito_assets.data.text import decontam_words, word_tokens

    rows: list[dict] = []
    for doc in candidates:
        text = docs["text"][doc]
        words, raw, spans = decontam_words(text)
        matches = seed_matches(word_tokens([words]), index).join(ignored, on=["seed", "view"], how="anti")
        found = occurrences(matches, index).filter(pl.col("is_hit"))
        hits = []
        for view_number, start, end, covered in found.select("view", "doc_start", "doc_end", "covered_words").iter_rows():
            view = index.views[view_number]
            in_occurrence = matches.filter((pl.col("view") == view_number) & pl.col("doc_pos").is_between(start, end - 1))
            agree: set[int] = set()
            for doc_pos, view_pos, n, head, tail, doc_start, doc_end in in_occurrence.select(
                    "doc_pos", "view_pos", "n", "head", "tail", "doc_start", "doc_end").iter_rows():
                pairs = [(doc_pos + k, view_pos + k) for k in range(n)]
                pairs += [(doc_start + k, k) for k in range(head)]
                pairs += [(doc_end - tail + k, view.length - tail + k) for k in range(tail)]
                agree.update(v for d, v in pairs if d < len(raw) and raw[d] == view.raw_words[v])
            hits.append({"doc_id": docs["doc_id"][doc], "eval_item_id": view.item_id, "benchmark": view.benchmark, "view": view.kind,
                         "matched_ngram": " ".join(words[start: min(end, start + config.ngram_size)]),
                         "char_start": spans[start][0], "char_end": spans[end - 1][1], "covered_words": covered,
                         "view_words": view.length, "overlap_ratio": covered / view.length, "_raw": len(agree)})
        rows.extend(_attribute(hits))
    return pl.DataFrame(rows, schema=HIT_SCHEMA) if rows else pl.DataFrame(schema=HIT_SCHEMA)
