"""Clean documents and the conservation account.

Every input document ends in exactly one state:
- kept: in the clean shards whole (piece is null);
- duplicate: removed, recorded against the kept document it duplicates (cluster id, similarity);
- contaminated: removed whole (action drop) or cut (action cut: the GPT-3 rule, the hit and a
  window either side removed, the remaining pieces of at least `min_piece_chars` in the clean
  shards with their offsets), recorded with the eval items it matched.
`account` checks that the states add up to the input exactly and that the clean rows are exactly
the kept documents plus the pieces of cut ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import polars as pl

from ito_assets.data.config import DecontamConfig
from ito_assets.data.dedup import DUPLICATE, KEPT

CONTAMINATED = "contaminated"
STATES = (KEPT, DUPLICATE, CONTAMINATED)
DROP, CUT = "drop", "cut"

ACTION_SCHEMA = {"doc_id": pl.String, "action": pl.String, "num_pieces": pl.Int32}
PIECE_SCHEMA = {"doc_id": pl.String, "piece": pl.Int32, "char_start": pl.Int64, "char_end": pl.Int64, "text": pl.String}
PROVENANCE = ["source_index", "source_uri", "source_sha256", "license", "row", "source_record_id"]


@dataclass(frozen=True)
class Conservation:
    num_input: int
    num_kept: int
    num_duplicate: int
    num_contaminated_dropped: int
    num_contaminated_cut: int
    num_clean_rows: int
    num_pieces: int
    problems: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return not self.problems

    @property
    def num_contaminated(self) -> int:
        return self.num_contaminated_dropped + self.num_contaminated_cut


def cut_pieces(text: str, regions: list[tuple[int, int]], config: DecontamConfig) -> list[tuple[int, int]] | None:
    """Spans that remain after removing each region widened by the window; None when the document
    would be split into more than `max_pieces` pieces (then it is dropped, as in GPT-3)."""
    window = config.cut_window_chars
    widened = sorted((max(0, s - window), min(len(text), e + window)) for s, e in regions)
    merged: list[list[int]] = []
    for start, end in widened:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    spans, cursor = [], 0
    for start, end in merged:
        if start > cursor:
            spans.append((cursor, start))
        cursor = end
    if cursor < len(text):
        spans.append((cursor, len(text)))
    if len(spans) > config.max_pieces:
        return None
    return [(s, e) for s, e in spans if e - s >= config.min_piece_chars]


def apply_actions(docs: pl.DataFrame, hits: pl.DataFrame, config: DecontamConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Scanned documents (doc_id, text) and their hits -> (an action per contaminated document,
    the pieces that survive cutting)."""
    actions: list[dict] = []
    pieces: list[dict] = []
    if hits.height == 0:
        return pl.DataFrame(schema=ACTION_SCHEMA), pl.DataFrame(schema=PIECE_SCHEMA)
    regions = hits.group_by("doc_id").agg(pl.col("char_start"), pl.col("char_end"))
    texts = docs.join(regions, on="doc_id", how="inner").sort("doc_id")
    for doc_id, text, starts, ends in texts.select("doc_id", "text", "char_start", "char_end").iter_rows():
        spans = cut_pieces(text, list(zip(starts, ends)), config) if config.action == CUT else None
        if not spans:
            actions.append({"doc_id": doc_id, "action": DROP, "num_pieces": 0})
            continue
        actions.append({"doc_id": doc_id, "action": CUT, "num_pieces": len(spans)})
        pieces.extend({"doc_id": doc_id, "piece": i, "char_start": s, "char_end": e, "text": text[s:e]} for i, (s, e) in enumerate(spans))
    return pl.DataFrame(actions, schema=ACTION_SCHEMA), pl.DataFrame(pieces, schema=PIECE_SCHEMA)


def clean_batches(batches: Iterable[pl.DataFrame], actions: pl.DataFrame, pieces: pl.DataFrame) -> Iterator[pl.DataFrame]:
    """`clean_documents` a batch of scanned documents at a time. The batches come in keep order
    (source_index, doc_id) and a piece sorts beside its own document, so the batches' clean rows,
    each sorted, are in the order `clean_documents` gives the whole frame."""
    for batch in batches:
        yield clean_documents(batch, actions, pieces)


def clean_documents(scanned: pl.DataFrame, actions: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """The clean rows: uncontaminated documents whole, and the pieces of cut ones, with provenance."""
    whole = (
        scanned.join(actions, on="doc_id", how="anti")
        .with_columns(
            pl.lit(None, dtype=pl.Int32).alias("piece"),
            pl.lit(0, dtype=pl.Int64).alias("char_start"),
            pl.col("text").str.len_chars().cast(pl.Int64).alias("char_end"),
        )
        .select("doc_id", "piece", "char_start", "char_end", *PROVENANCE, "text")
    )
    cut = pieces.join(scanned.select("doc_id", *PROVENANCE), on="doc_id").select(whole.columns)
    return pl.concat([whole, cut]).sort("source_index", "doc_id", "piece", nulls_last=False)


def decisions(dedup: pl.DataFrame, hits: pl.DataFrame, actions: pl.DataFrame) -> pl.DataFrame:
    """One row per input document: its final state and why."""
    items = hits.group_by("doc_id").agg(pl.col("eval_item_id").unique().sort().alias("eval_item_ids"))
    return (
        dedup.join(actions, on="doc_id", how="left")
        .join(items, on="doc_id", how="left")
        .with_columns(
            pl.when(pl.col("dedup_state") == DUPLICATE).then(pl.lit(DUPLICATE))
            .when(pl.col("action").is_not_null()).then(pl.lit(CONTAMINATED))
            .otherwise(pl.lit(KEPT))
            .alias("state")
        )
        .select(
            "doc_id", "state", "method", "duplicate_of", "cluster_id", "similarity",
            "eval_item_ids", "action", pl.col("num_pieces").fill_null(0),
        )
    )


def account(input_ids: pl.Series, final: pl.DataFrame, clean: pl.DataFrame) -> Conservation:
    """Check that every input document is in exactly one state and the clean rows match them."""
    problems: list[str] = []
    counts = {state: final.filter(pl.col("state") == state).height for state in STATES}
    dropped = final.filter((pl.col("state") == CONTAMINATED) & (pl.col("action") == DROP)).height
    if final["doc_id"].n_unique() != final.height:
        problems.append("a document has more than one decision")
    if not _same_ids(final["doc_id"], input_ids):
        problems.append("the decisions and the input documents differ")
    if sum(counts.values()) != len(input_ids):
        problems.append("the states do not add up to the input")
    whole = clean.filter(pl.col("piece").is_null())["doc_id"]
    kept = final.filter(pl.col("state") == KEPT)["doc_id"]
    if whole.n_unique() != whole.len() or not _same_ids(whole, kept):
        problems.append("the whole documents in the clean shards are not exactly the kept ones")
    cut = final.filter(pl.col("action") == CUT).select("doc_id", "num_pieces")
    pieces = clean.filter(pl.col("piece").is_not_null()).group_by("doc_id").agg(pl.len().alias("found"))
    joined = cut.join(pieces, on="doc_id", how="full", coalesce=True)
    if joined.filter(pl.col("num_pieces").cast(pl.UInt32, strict=False) != pl.col("found")).height or joined.filter(pl.col("num_pieces").is_null() | pl.col("found").is_null()).height:
        problems.append("the pieces in the clean shards do not match the cut documents")
    contaminated = final.filter(pl.col("state") == CONTAMINATED)
    if contaminated.filter(pl.col("eval_item_ids").is_null()).height:
        problems.append("a contaminated document has no eval item")
    duplicates = final.filter(pl.col("state") == DUPLICATE)
    if duplicates.filter(pl.col("duplicate_of").is_null() | pl.col("cluster_id").is_null()).height:
        problems.append("a duplicate has no kept document or cluster")
    survivors = final.filter(pl.col("state") != DUPLICATE).select(pl.col("doc_id").alias("duplicate_of"))
    if duplicates.join(survivors, on="duplicate_of", how="anti").height:
        problems.append("a duplicate is recorded against a document that was not kept by deduplication")
    return Conservation(
        num_input=len(input_ids),
        num_kept=counts[KEPT],
        num_duplicate=counts[DUPLICATE],
        num_contaminated_dropped=dropped,
        num_contaminated_cut=counts[CONTAMINATED] - dropped,
        num_clean_rows=clean.height,
        num_pieces=clean.height - whole.len(),
        problems=tuple(problems),
    )


def _same_ids(a: pl.Series, b: pl.Series) -> bool:
    """Whether two columns of ids hold the same set, by anti-joins: Python sets of every id would
    cost ~100 bytes per document."""
    left, right = a.to_frame("id"), b.to_frame("id")
    return not left.join(right, on="id", how="anti").height and not right.join(left, on="id", how="anti").height
